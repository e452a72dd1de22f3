"""The project's own tests opt in to the shipped conformance plugin, exactly as a third-party project would."""

pytest_plugins = ["idem_dialects.conformance.plugin"]
