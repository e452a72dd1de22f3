"""The Idempotency-Key header: the key as clients send it, quoted or bare.

draft-ietf-httpapi-idempotency-key-header defines the field as an RFC 8941 Structured Field String:
`Idempotency-Key: "8e03978e-40d5-43e8-bc93"` (printable ASCII, with only `\\"` and `\\\\` as escapes); parameters
after the string are allowed by RFC 8941 and ignored, as it asks for parameters a receiver does not know. Most
clients (Stripe's SDKs among them) send the key bare: `Idempotency-Key: 8e03978e-40d5-43e8-bc93`. By default a bare
key is accepted and is the same key as its quoted form: the whole value, any visible ASCII without spaces or double
quotes, a digit first included. `allow_token=False` keeps the draft's strict syntax (a bare key is a 400).
The store limits a key to 255 characters (`idem_dialects.keys.MAX_LENGTH`); a longer one is a 400 too.
"""

from __future__ import annotations

import re

# RFC 8941 3.1.2: parameters are `;key[=bare-item]`; keys are lcalpha/"*" then lcalpha/digit/"_-.*".
_PARAMS = re.compile(r'(?:;[ ]*[a-z*][a-z0-9_.*-]*(?:=(?:"(?:[^"\\]|\\["\\])*"|[^;"\s]+))?)*')
# A bare key: visible ASCII (0x21-0x7E) except the double quote, so it can never be mistaken for a quoted one.
_BARE = re.compile(r"[!#-~]+")
# What clients send: one quoted string, no escapes, no parameters: one match (the scan below reads the rest).
_PLAIN = re.compile(r'"([ !#-\[\]-~]*)"')


class KeyHeaderError(ValueError):
    """The header is present but is not a valid Idempotency-Key value; `reason` says why (safe to show clients)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def parse_key_header(values: list[str], *, allow_token: bool = True) -> str | None:
    """The key carried by the header's field lines (None when there are none), or KeyHeaderError.

    Several field lines are one field joined with commas (RFC 9110 5.3), and a comma outside a string makes an
    Item invalid, so a request carrying two keys is refused rather than one of them silently picked."""
    if not values:
        return None
    if len(values) > 1:
        raise KeyHeaderError("the header appears more than once; send exactly one idempotency key")
    text = values[0].strip(" \t")
    plain = _PLAIN.fullmatch(text)
    if plain is not None:
        return _not_blank(plain.group(1))
    if not text:
        raise KeyHeaderError("the header is empty; send the key, e.g. \"4f1c-...\"")
    if text.startswith('"'):
        key, rest = _parse_string(text)
        if _PARAMS.fullmatch(rest) is None:
            raise KeyHeaderError("unexpected text after the key; send exactly one quoted key")
        return _not_blank(key)
    if not allow_token:
        raise KeyHeaderError('the key must be a Structured Field string in double quotes, e.g. "4f1c-..."')
    if "," in text and not all(text.split(",")):  # "," or "k,": a list with empty members (RFC 9110 5.6.1)
        raise KeyHeaderError('a bare key may not begin or end with a comma, nor hold two in a row (the header would be'
                             ' a list with empty members); send exactly one key, e.g. "4f1c-..."')
    if _BARE.fullmatch(text) is None:
        raise KeyHeaderError('a bare key is visible ASCII without spaces or double quotes; quote other keys,'
                             ' e.g. "4f1c-..."')
    return text


def _not_blank(key: str) -> str:
    """A quoted key of spaces only (or none) names no intent: refused as the empty header is."""
    if not key.strip(" "):
        raise KeyHeaderError('the key is blank (spaces only); send a key chosen once per intent, e.g. "4f1c-..."')
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
