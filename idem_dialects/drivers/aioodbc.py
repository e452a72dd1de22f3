"""aioodbc (``mssql+aioodbc://``): pyodbc on a thread pool; the store's statements go through SQLAlchemy's adapter
(no native form here: unverified without a server on the project's machines)."""

from __future__ import annotations

from . import UNIXODBC, Driver
from .pyodbc import AUTOCOMMIT

DRIVER = Driver("aioodbc", "aioodbc", "idem-dialects[aioodbc]", sync=False, asynchronous=True, libraries=(UNIXODBC,),
                autocommit_args=AUTOCOMMIT)
