"""The shared conformance suite: checks every backend must pass, shipped as a pytest plugin.

The plugin is opt-in: enable it with ``pytest_plugins = ["idem_dialects.conformance.plugin"]`` in a conftest.py
(or ``-p idem_dialects.conformance.plugin``), then write ``from idem_dialects.conformance.suite import *`` in a test
module of your own: `idem_dialects.conformance.suite` is the list of checks, the one `idem-dialects check` and
`matrix` run and the project's own tests import. Each check is a ``test_<id>`` function whose docstring's first
sentence states the guarantee it proves; checks name the features they need (``@pytest.mark.idem_requires``), never
engines.
"""
