"""`python -m idem_dialects.cli`: the idem-dialects command."""

import sys

from . import main

sys.exit(main())
