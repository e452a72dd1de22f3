"""The shipped conformance suite, run on every engine this machine can provide (see engines/). The modules and their
order are `idem_dialects.conformance.CHECK_MODULES`, which `idem-dialects check` and `matrix` run (test_contract.py)."""

# ruff: noqa: I001 - the order is CHECK_MODULES' (the cluster checks last: they end by killing a node)
from idem_dialects.conformance.test_protocol import *  # noqa: F403
from idem_dialects.conformance.test_concurrency import *  # noqa: F403
from idem_dialects.conformance.test_keys import *  # noqa: F403
from idem_dialects.conformance.test_integrity import *  # noqa: F403
from idem_dialects.conformance.test_retry import *  # noqa: F403
from idem_dialects.conformance.test_isolation import *  # noqa: F403
from idem_dialects.conformance.test_conflict import *  # noqa: F403
from idem_dialects.conformance.test_schema_race import *  # noqa: F403
from idem_dialects.conformance.test_outbox import *  # noqa: F403
from idem_dialects.conformance.test_async import *  # noqa: F403
from idem_dialects.conformance.test_async_cancel import *  # noqa: F403
from idem_dialects.conformance.test_faults import *  # noqa: F403
from idem_dialects.conformance.test_restart import *  # noqa: F403
from idem_dialects.conformance.test_shards import *  # noqa: F403
from idem_dialects.conformance.test_cluster import *  # noqa: F403
