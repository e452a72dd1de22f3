"""The shared conformance suite: checks every backend must pass, shipped as a pytest plugin.

Run it with ``pytest --pyargs idem_dialects.conformance --idem-engine NAME`` (or ``idem-dialects matrix``), or
star-import `CHECK_MODULES` into a test module of your own. Each check is a ``test_<id>`` function whose
docstring's first sentence states the guarantee it proves; checks name the capabilities they need
(``@pytest.mark.requires``), never engines.
"""

CHECK_MODULES = (
    "idem_dialects.conformance.test_protocol",
    "idem_dialects.conformance.test_concurrency",
    "idem_dialects.conformance.test_keys",
    "idem_dialects.conformance.test_integrity",
    "idem_dialects.conformance.test_retry",
    "idem_dialects.conformance.test_isolation",
    "idem_dialects.conformance.test_cluster",
)
