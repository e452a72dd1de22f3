"""Validation of the identity fields (scope, operation, key, subscriber, message id), before any SQL runs."""

from __future__ import annotations

from .errors import InvalidKey

MAX_LENGTH = 255


def check_identifier(field: str, value: object) -> str:
    """Return `value` if it may be stored byte-exact on every engine, else raise InvalidKey naming the rule."""
    if not isinstance(value, str):
        raise InvalidKey(field, f"must be a str, not {type(value).__name__}", value)
    if not value:
        # Oracle stores '' as NULL; an empty identity is also never a deliberate client choice.
        raise InvalidKey(field, "must not be empty", value)
    if len(value) > MAX_LENGTH:
        raise InvalidKey(field, f"must be at most {MAX_LENGTH} characters, has {len(value)}", value)
    if "\x00" in value:
        raise InvalidKey(field, "must not contain NUL characters", value)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidKey(field, "must be valid Unicode (no lone surrogates)", value) from None
    return value


# Scope + operation + key (and subscriber + message id) may hold together at most this many bytes of UTF-8 on *every*
# engine: the smallest primary-key limit of the built-in backends (SQL Server's 1700-byte nonclustered index key;
# PostgreSQL's btree row fits about 2675, InnoDB 3072, Oracle 6398). One limit everywhere, so an identity accepted
# on SQLite in development is accepted on PostgreSQL or SQL Server in production. A backend may declare a lower one
# (`Features.max_identity_bytes`); the store enforces the smaller.
MAX_IDENTITY_BYTES = 1700


def check_identity_size(fields: dict[str, str], limit: int = MAX_IDENTITY_BYTES) -> None:
    """Refuse, before any SQL, an identity whose fields (already valid one by one) exceed `limit` bytes together."""
    sizes = {name: len(value.encode("utf-8")) for name, value in fields.items()}
    total = sum(sizes.values())
    if total > limit:
        field = max(sizes, key=lambda name: sizes[name])
        raise InvalidKey(field, f"makes the identity ({' + '.join(fields)}) {total} bytes of UTF-8; identities may"
                                f" hold at most {limit} bytes together on every engine", fields[field])
