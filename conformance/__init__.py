"""The shared conformance suite: checks every backend must pass, shipped as a pytest plugin.

The plugin is opt-in: enable it with ``pytest_plugins = ["idem_dialects.conformance.plugin"]`` in a conftest.py
(or ``-p idem_dialects.conformance.plugin``), then star-import `CHECK_MODULES` into a test module of your own, or
run ``pytest -p idem_dialects.conformance.plugin --pyargs idem_dialects.conformance`` (or ``idem-dialects
matrix``). Each check is a ``test_<id>`` function whose docstring's first sentence states the guarantee it proves;
checks name the features they need (``@pytest.mark.idem_requires``), never engines. `CHECK_MODULES` is the one list
of them: `idem-dialects check` and `matrix` run it, and the project's own test suite imports exactly it
(tests/test_contract.py compares the two).
"""

CHECK_MODULES = (
    "idem_dialects.conformance.test_protocol",
    "idem_dialects.conformance.test_concurrency",
    "idem_dialects.conformance.test_keys",
    "idem_dialects.conformance.test_integrity",
    "idem_dialects.conformance.test_retry",
    "idem_dialects.conformance.test_isolation",
    "idem_dialects.conformance.test_conflict",
    "idem_dialects.conformance.test_schema_race",
    "idem_dialects.conformance.test_outbox",
    "idem_dialects.conformance.test_async",  # async columns only (--idem-api async|both)
    "idem_dialects.conformance.test_async_cancel",  # async columns only
    "idem_dialects.conformance.test_faults",
    "idem_dialects.conformance.test_restart",
    "idem_dialects.conformance.test_shards",  # two shards of the engine's server, one of them taken down
    # Last: the cluster checks end by killing a node (or the primary), so every other check runs on the whole cluster.
    "idem_dialects.conformance.test_cluster",
)
