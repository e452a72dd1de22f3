"""The shared conformance suite: checks every backend must pass, shipped as a pytest plugin.

Run it with ``pytest --pyargs idem_dialects.conformance --idem-engine NAME`` (or ``idem-dialects matrix``).
Each check is a ``test_<id>`` function whose docstring's first line states the guarantee it proves.
"""
