"""python-oracledb (``oracle+oracledb://``), thin mode, sync and async (no native async form here: unverified
without a server on the project's machines)."""

from __future__ import annotations

from . import Driver

DRIVER = Driver("oracledb", "oracledb", "idem-dialects[oracle]", asynchronous=True)
