"""The installed distribution's version: the package's `__version__` and the telemetry's instrumentation scope."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("idem-dialects")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
