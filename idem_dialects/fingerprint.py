"""Canonical request identity and the exact encoding of stored responses.

A fingerprint is SHA-256 over the RFC 8785 (JCS) canonical JSON of the request, so two services written in
different languages agree on it. Responses are stored as bytes with a one-byte kind tag, which makes every value
(``""``, ``b""``, ``None``, NUL characters) round-trip exactly and never be empty (Oracle turns empty into NULL).
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, TypeAlias

import rfc8785

from .errors import InvalidPayload

JSONValue: TypeAlias = "bool | int | float | str | list[JSONValue] | dict[str, JSONValue] | None"
Response: TypeAlias = "JSONValue | bytes"

_JSON_TAG = b"j"
_BYTES_TAG = b"b"


def check_json(field: str, value: object, path: str = "$") -> None:
    """Reject anything that would not come back from JSON as the same type and value."""
    if value is None or isinstance(value, (bool, str)):
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidPayload(field, f"string at {path} is not valid Unicode (lone surrogate)") from None
        return
    if isinstance(value, int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidPayload(field, f"{value!r} at {path} is not representable in JSON")
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            check_json(field, item, f"{path}[{i}]")
        return
    if isinstance(value, dict):
        for k, item in value.items():
            if not isinstance(k, str):
                raise InvalidPayload(field, f"object key {k!r} at {path} is not a str")
            check_json(field, k, f"{path} key")
            check_json(field, item, f"{path}.{k}")
        return
    raise InvalidPayload(
        field, f"{type(value).__name__} at {path} is not JSON-compatible (dict, list, str, int, float, bool, None)"
    )


def fingerprint(request: object, field: str = "request") -> str:
    """SHA-256 hex digest of the request's RFC 8785 canonical JSON."""
    check_json(field, request)
    try:
        canonical = rfc8785.dumps(request)  # type: ignore[arg-type]  # check_json vouched for the shape
    except rfc8785.CanonicalizationError as exc:  # e.g. integers beyond 2**53, which JCS cannot represent
        raise InvalidPayload(field, str(exc)) from exc
    return hashlib.sha256(canonical).hexdigest()


def payload_fingerprint(payload: object) -> str:
    """Fingerprint of a message payload: raw bytes hash as they are, anything else as a JSON request."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return hashlib.sha256(b"bytes:" + bytes(payload)).hexdigest()
    return fingerprint(payload, "payload")


def encode_response(response: object) -> bytes:
    if isinstance(response, (bytes, bytearray, memoryview)):
        return _BYTES_TAG + bytes(response)
    check_json("response", response)
    return _JSON_TAG + json.dumps(response, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def decode_response(stored: bytes) -> Any:
    tag, body = stored[:1], stored[1:]
    if tag == _BYTES_TAG:
        return bytes(body)
    if tag == _JSON_TAG:
        return json.loads(body.decode("utf-8"))
    raise ValueError(f"stored response has unknown kind tag {tag!r}")
