"""pymssql (``mssql+pymssql://``)."""

from __future__ import annotations

from . import Driver

DRIVER = Driver("pymssql", "pymssql", "pymssql")
