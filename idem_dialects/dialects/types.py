"""Column types several backends share."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Dialect
from sqlalchemy.types import DateTime, LargeBinary, TypeDecorator, TypeEngine


class Utf8Bytes(TypeDecorator[str]):
    """A str stored as its UTF-8 bytes in a binary column (VARBINARY, RAW): compared byte for byte, never padded
    or folded, whatever the server's, database's or session's collation and character set -- no collation applies
    to binary. It reads back as the same str."""

    impl = LargeBinary
    cache_ok = True

    def __init__(self, binary: TypeEngine[bytes]) -> None:
        super().__init__()
        self.binary = binary

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        return dialect.type_descriptor(self.binary)

    def process_bind_param(self, value: str | None, dialect: Dialect) -> bytes | None:
        return None if value is None else value.encode("utf-8")

    def process_result_value(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else bytes(value).decode("utf-8")


class TextOrParsedDateTime(TypeDecorator[datetime]):
    """A timestamp stored as text (SQLite) that reads back from the text, or as the datetime a driver already parsed:
    a connection opened with declared-type conversion (sqlite3's ``detect_types``, as Django opens its own) turns
    DATETIME columns into datetimes before SQLAlchemy sees them."""

    impl = DateTime
    cache_ok = True

    def result_processor(self, dialect: Dialect, coltype: Any) -> Callable[[Any], Any] | None:
        parse = self.impl_instance.dialect_impl(dialect).result_processor(dialect, coltype)
        if parse is None:
            return None

        def process(value: Any) -> Any:
            return value if value is None or isinstance(value, datetime) else parse(value)

        return process
