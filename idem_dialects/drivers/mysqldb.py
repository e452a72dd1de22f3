"""mysqlclient (``mysql+mysqldb://``), libmysqlclient's C driver."""

from __future__ import annotations

from . import Driver
from .pymysql import AUTOCOMMIT, escaped_size


class MySQLdb(Driver):
    def sent_size(self, value: bytes) -> int:
        return escaped_size(value)  # mysql_real_escape_string, in the statement's text


DRIVER = MySQLdb("mysqldb", "MySQLdb", "mysqlclient", autocommit_args=AUTOCOMMIT, native=True)
