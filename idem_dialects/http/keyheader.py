"""The Idempotency-Key header: an RFC 8941 Structured Field Item whose value is a String.

draft-ietf-httpapi-idempotency-key-header defines the field as `Idempotency-Key: "8e03978e-40d5-43e8-bc93"`: a
quoted sf-string (printable ASCII, with only `\\"` and `\\\\` as escapes). Parameters after the string are allowed
by RFC 8941 and ignored, as it asks for parameters a receiver does not know. A bare sf-token (`Idempotency-Key: abc`)
is not a String; it is accepted only when the policy says so (many clients send keys unquoted).
"""

from __future__ import annotations

import re

# RFC 8941 3.1.2: parameters are `;key[=bare-item]`; keys are lcalpha/"*" then lcalpha/digit/"_-.*".
_PARAMS = re.compile(r'(?:;[ ]*[a-z*][a-z0-9_.*-]*(?:=(?:"(?:[^"\\]|\\["\\])*"|[^;"\s]+))?)*')
# RFC 8941 3.3.4: sf-token = ( ALPHA / "*" ) *( tchar / ":" / "/" )
_TOKEN = re.compile(r"[A-Za-z*][!#$%&'*+\-.^_`|~0-9A-Za-z:/]*")


class KeyHeaderError(ValueError):
    """The header is present but is not a valid Idempotency-Key value; `reason` says why (safe to show clients)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def parse_key_header(values: list[str], *, allow_token: bool = False) -> str | None:
    """The key carried by the header's field lines (None when there are none), or KeyHeaderError.

    Several field lines are one field joined with commas (RFC 9110 5.3), and a comma outside a string makes an
    Item invalid, so a request carrying two keys is refused rather than one of them silently picked."""
    if not values:
        return None
    if len(values) > 1:
        raise KeyHeaderError("the header appears more than once; send exactly one idempotency key")
    text = values[0].strip(" \t")
    if not text:
        raise KeyHeaderError("the header is empty; send the key as a quoted string, e.g. \"4f1c-...\"")
    if text.startswith('"'):
        key, rest = _parse_string(text)
    else:
        match = _TOKEN.match(text)
        if match is None or not allow_token:
            raise KeyHeaderError('the key must be a Structured Field string in double quotes, e.g. "4f1c-..."')
        key, rest = match.group(), text[match.end():]
    if _PARAMS.fullmatch(rest) is None:
        raise KeyHeaderError("unexpected text after the key; send exactly one quoted key")
    return key


def _parse_string(text: str) -> tuple[str, str]:
    out: list[str] = []
    i = 1
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            if i + 1 >= len(text) or text[i + 1] not in '"\\':
                raise KeyHeaderError('only \\" and \\\\ may be escaped in a Structured Field string')
            out.append(text[i + 1])
            i += 2
            continue
        if ch == '"':
            return "".join(out), text[i + 1:]
        if not " " <= ch <= "~":
            raise KeyHeaderError("a Structured Field string holds printable ASCII only (0x20-0x7E)")
        out.append(ch)
        i += 1
    raise KeyHeaderError("the quoted key has no closing double quote")
