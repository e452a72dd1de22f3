"""The shipped conformance suite, run on every engine this machine can provide (see engines/)."""

from idem_dialects.conformance.test_async import *  # noqa: F403
from idem_dialects.conformance.test_async_cancel import *  # noqa: F403
from idem_dialects.conformance.test_concurrency import *  # noqa: F403
from idem_dialects.conformance.test_conflict import *  # noqa: F403
from idem_dialects.conformance.test_faults import *  # noqa: F403
from idem_dialects.conformance.test_integrity import *  # noqa: F403
from idem_dialects.conformance.test_isolation import *  # noqa: F403
from idem_dialects.conformance.test_keys import *  # noqa: F403
from idem_dialects.conformance.test_protocol import *  # noqa: F403
from idem_dialects.conformance.test_restart import *  # noqa: F403
from idem_dialects.conformance.test_retry import *  # noqa: F403
from idem_dialects.conformance.test_schema_race import *  # noqa: F403

# isort: split
# Last: the cluster checks end by killing a node (or the primary), so every other check runs on the whole cluster.
from idem_dialects.conformance.test_cluster import *  # noqa: F403
