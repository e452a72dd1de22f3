"""The shipped conformance suite, run on every engine this machine can provide (see engines/): the one line a third
party writes (docs: Conformance), so this project runs exactly what they run."""

from idem_dialects.conformance.suite import *  # noqa: F403
