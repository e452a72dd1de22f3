"""PyMySQL (``mysql+pymysql://``, ``mariadb+pymysql://``), pure Python: it writes parameters into the statement's
text, bytes as a hex literal (``_binary X'...'``, two bytes of statement per byte: measured with the server's
Bytes_received)."""

from __future__ import annotations

from . import Driver, hex_size

# The connect_args with which the MySQL drivers open their connections in autocommit mode (refused by the store).
AUTOCOMMIT = {"autocommit": True}
# The bytes a MySQL string literal escapes with a backslash (mysql_real_escape_string's set; asyncmy escapes these,
# mysql-connector all but NUL): each takes two bytes of the statement.
ESCAPED = b"\0\n\r\x1a'\"\\"
_PREFIX = len("_binary X''")


def escaped_size(value: bytes) -> int:
    """`Driver.sent_size` for a driver that writes bytes into the statement as an escaped string literal."""
    return len(value) + sum(value.count(byte) for byte in ESCAPED) + _PREFIX


class PyMySQL(Driver):
    def sent_size(self, value: bytes) -> int:
        return hex_size(value) + _PREFIX


DRIVER = PyMySQL("pymysql", "pymysql", "idem-dialects[mysql]", autocommit_args=AUTOCOMMIT, native=True)
