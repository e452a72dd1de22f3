"""Canonical request identity and the exact encoding of stored responses.

A fingerprint is SHA-256 over the RFC 8785 (JCS) canonical JSON of the request, so two services written in
different languages agree on it. Responses are stored as bytes with a one-byte kind tag, which makes every value
(``""``, ``b""``, ``None``, NUL characters) round-trip exactly and never be empty (Oracle turns empty into NULL).

Validation walks a value iteratively (no recursion, so no RecursionError however deep) and raises nothing but
`InvalidPayload`: a value that would not replay as the same type and value is refused, unless an encoder turns it
into JSON first (see `idem_dialects.encoding`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from typing import Any, TypeAlias

import rfc8785

from .errors import InvalidPayload

JSONValue: TypeAlias = "bool | int | float | str | list[JSONValue] | dict[str, JSONValue] | None"
Response: TypeAlias = "JSONValue | bytes"
Encoder: TypeAlias = Callable[[Any], Any]

# Nesting of arrays/objects a request or response may have (json and rfc8785 recurse; Python's stack does not).
MAX_DEPTH = 128
# Integers in a request: RFC 8785 (and I-JSON) represent exactly only |n| <= 2**53 - 1, IEEE-754's safe integers.
MAX_SAFE_INTEGER = 2**53 - 1
# Integers in a response: at most this many decimal digits (Python refuses to print or parse more than 4,300).
MAX_INT_DIGITS = 4000
_INT_BOUND = 10**MAX_INT_DIGITS
_ENCODER_HINT = ("pass encoder=idem_dialects.default_encoder (or your own) to IdempotencyStore / from_url,"
                 " or convert it to JSON yourself")

# Made once: json.dumps with options builds an encoder per call.
_CANONICAL = json.JSONEncoder(ensure_ascii=False, sort_keys=True, separators=(",", ":"), check_circular=False)
_JSON_TAG = b"j"
_BYTES_TAG = b"b"
_JSON_TYPES = frozenset({dict, list, str, int, float, bool, type(None)})


def _where(path: tuple[object, ...]) -> str:
    out = "$"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _describe_refusal(value: object, path: tuple[object, ...]) -> str:
    kind = type(value).__name__
    for base in (dict, list, str, int, float):
        if isinstance(value, base):  # IntEnum, StrEnum, OrderedDict...: they would replay as the plain base type
            return (f"{kind} at {_where(path)} is a subclass of {base.__name__} and would replay as a plain"
                    f" {base.__name__}; {_ENCODER_HINT}")
    if isinstance(value, (tuple, set, frozenset)):
        return f"{kind} at {_where(path)} would not replay as a {kind} (JSON has only arrays); pass a list"
    return (f"{kind} at {_where(path)} is not JSON-compatible (dict, list, str, int, float, bool, None);"
            f" {_ENCODER_HINT}")


def _encode(field: str, value: object, encoder: Encoder, path: tuple[object, ...]) -> object:
    kind = type(value).__name__
    try:
        encoded = encoder(value)
    except Exception as exc:  # the value itself may be in the encoder's message: never repeat it
        raise InvalidPayload(field, f"the encoder refused {kind} at {_where(path)} ({type(exc).__name__}); "
                                    "convert it to JSON yourself or extend the encoder") from None
    if type(encoded) not in _JSON_TYPES:
        raise InvalidPayload(field, f"the encoder turned {kind} at {_where(path)} into {type(encoded).__name__},"
                                    " not a JSON value (dict, list, str, int, float, bool, None)")
    return encoded


def to_json(field: str, value: object, encoder: Encoder | None = None, *, request: bool = False) -> Any:
    """`value` as plain JSON types (encoded by `encoder` where it is not), or InvalidPayload saying what and where.

    Refused: non-finite floats, lone surrogates, non-str object keys, nesting deeper than MAX_DEPTH, integers
    beyond MAX_SAFE_INTEGER in a request (`request=True`) or beyond MAX_INT_DIGITS digits elsewhere, and any other
    type -- subclasses of JSON types included, which would replay as their base type -- that `encoder` does not turn
    into JSON. Iterative: a value nested 100,000 deep is refused without recursion.
    """
    return _to_json(field, value, encoder, request)[0]


def _to_json(field: str, value: object, encoder: Encoder | None, request: bool) -> tuple[Any, bool]:
    """`to_json`, and whether the value is plain: no float and only ASCII object keys (see `fingerprint`)."""
    plain = True
    holder: list[Any] = [None]
    # (value, container to store the result in, slot in it, nesting depth of value, path to value)
    stack: list[tuple[Any, Any, Any, int, tuple[object, ...]]] = [(value, holder, 0, 0, ())]
    while stack:
        node, parent, slot, depth, path = stack.pop()
        if type(node) not in _JSON_TYPES:
            if encoder is None:
                raise InvalidPayload(field, _describe_refusal(node, path))
            node = _encode(field, node, encoder, path)
        kind = type(node)
        if kind is dict or kind is list:
            if depth >= MAX_DEPTH:
                raise InvalidPayload(field, f"nesting deeper than {MAX_DEPTH} levels at {_where(path)[:80]}...")
            if kind is list:
                out_list: list[Any] = [None] * len(node)
                parent[slot] = out_list
                stack.extend((item, out_list, i, depth + 1, (*path, i)) for i, item in reversed(list(enumerate(node))))
            else:
                out_dict: dict[str, Any] = {}
                parent[slot] = out_dict
                for k in node:
                    if type(k) is not str:
                        raise InvalidPayload(field, f"object key {type(k).__name__} at {_where(path)} is not a str")
                    if not k.isascii():
                        plain = False
                        _check_unicode(field, k, (*path, "<key>"))
                    out_dict[k] = None  # keep the caller's key order
                stack.extend((item, out_dict, k, depth + 1, (*path, k)) for k, item in reversed(node.items()))
            continue
        if kind is str:
            if not node.isascii():
                _check_unicode(field, node, path)
        elif kind is int:
            if request and not -MAX_SAFE_INTEGER <= node <= MAX_SAFE_INTEGER:
                raise InvalidPayload(field, f"integer at {_where(path)} is beyond +-(2**53 - 1), which RFC 8785"
                                            " canonical JSON cannot represent exactly; send it as a string")
            if node.bit_length() > 13_000 and abs(node) >= _INT_BOUND:
                raise InvalidPayload(field, f"integer at {_where(path)} has more than {MAX_INT_DIGITS} digits")
        elif kind is float:
            plain = False
            if not math.isfinite(node):
                raise InvalidPayload(field, f"{node!r} at {_where(path)} is not representable in JSON")
        parent[slot] = node
    return holder[0], plain


def _check_unicode(field: str, value: str, path: tuple[object, ...]) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidPayload(field, f"string at {_where(path)} is not valid Unicode (lone surrogate)") from None


def fingerprint(request: object, field: str = "request", encoder: Encoder | None = None) -> str:
    """SHA-256 hex digest of the request's RFC 8785 canonical JSON."""
    value, plain = _to_json(field, request, encoder, True)
    if plain:
        # No float and only ASCII keys: RFC 8785's form is exactly the standard library's sorted, compact encoding
        # (the same escapes, integers within 2**53 as their digits, keys in code point order, which for ASCII is
        # RFC 8785's UTF-16 order), made in C rather than by rfc8785's Python (tests/test_core.py compares the two).
        return hashlib.sha256(_CANONICAL.encode(value).encode("utf-8")).hexdigest()
    try:
        canonical = rfc8785.dumps(value)
    except rfc8785.CanonicalizationError as exc:  # to_json refuses what rfc8785 would; kept as a safety net
        raise InvalidPayload(field, str(exc)) from None
    return hashlib.sha256(canonical).hexdigest()


def payload_fingerprint(payload: object, encoder: Encoder | None = None) -> str:
    """Fingerprint of a message payload: raw bytes hash as they are, anything else as a JSON request."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return hashlib.sha256(b"bytes:" + bytes(payload)).hexdigest()
    return fingerprint(payload, "payload", encoder)


def encode_response(response: object, encoder: Encoder | None = None) -> bytes:
    if isinstance(response, (bytes, bytearray, memoryview)):
        return _BYTES_TAG + bytes(response)
    value = to_json("response", response, encoder)
    return _JSON_TAG + json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def decode_response(stored: bytes) -> Any:
    tag, body = stored[:1], stored[1:]
    if tag == _BYTES_TAG:
        return bytes(body)
    if tag == _JSON_TAG:
        return json.loads(body.decode("utf-8"))
    raise ValueError(f"stored response has unknown kind tag {tag!r}")
