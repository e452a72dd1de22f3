"""cx_Oracle (``oracle+cx_oracle://``), python-oracledb's predecessor."""

from __future__ import annotations

from . import Driver

DRIVER = Driver("cx_oracle", "cx_Oracle", "cx_Oracle")
