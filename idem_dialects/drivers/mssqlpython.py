"""mssql-python (``mssql+mssqlpython://``, SQLAlchemy 2.1): bundles Microsoft's ODBC Driver 18 (no system ODBC),
which loads libltdl when the first connection opens."""

from __future__ import annotations

from . import LIBLTDL, Driver
from .pyodbc import AUTOCOMMIT

DRIVER = Driver("mssqlpython", "mssql_python", "idem-dialects[mssql]", libraries=(LIBLTDL,), autocommit_args=AUTOCOMMIT)
