"""pyodbc (``mssql+pyodbc://``) over unixODBC, with Microsoft's ODBC Driver 18 or FreeTDS."""

from __future__ import annotations

from . import UNIXODBC, Driver

AUTOCOMMIT = {"autocommit": True}
DRIVER = Driver("pyodbc", "pyodbc", "idem-dialects[mssql]", libraries=(UNIXODBC,), autocommit_args=AUTOCOMMIT)
