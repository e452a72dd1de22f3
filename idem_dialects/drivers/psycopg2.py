"""psycopg2 (``postgresql+psycopg2://``): autocommit only as an attribute; it writes parameters into the statement's
text, bytes as a hex bytea literal."""

from __future__ import annotations

from . import Driver, hex_size


class Psycopg2(Driver):
    def sent_size(self, value: bytes) -> int:
        return hex_size(value) + len("''::bytea")


DRIVER = Psycopg2("psycopg2", "psycopg2", "psycopg2-binary", native=True)
