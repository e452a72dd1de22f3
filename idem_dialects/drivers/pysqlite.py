"""sqlite3 from the standard library (``sqlite://``, ``sqlite+pysqlite://``)."""

from __future__ import annotations

from . import Driver

# sqlite3's autocommit mode: no implicit BEGIN, every statement outside BEGIN commits alone.
AUTOCOMMIT = {"isolation_level": None}

DRIVER = Driver("pysqlite", "sqlite3", None, autocommit_args=AUTOCOMMIT, native=True)
