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
