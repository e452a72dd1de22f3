"""What identifies an HTTP request to the store: the JSON value it fingerprints.

**Fingerprint.** The store compares a request's fingerprint, SHA-256 over the RFC 8785 canonical JSON of:

    {"method": "POST", "path": "/payments?a=1", "headers": {"<name>": "<value>"}, "body": {"<kind>": "<sha256 hex>"}}

where `body` is `{"json": sha256(JCS(parsed body))}` when the content type is JSON (`application/json`, `*+json`) and
the body parses and canonicalizes (so key order and whitespace do not matter); for a form, its fields in order, so a
re-encoded retry is the same request: `{"form": sha256(the fields percent-encoded again one way)}` for
`application/x-www-form-urlencoded`, `{"multipart": sha256(JSON list of [name, filename, content type,
sha256(content)] per part)}` for `multipart/form-data` (the boundary, which clients choose anew for each request, left
out); else, or when the body does not parse as its type says, `{"bytes": sha256(raw body)}`;
`path` carries the query string when there is one; `headers` holds only the policy's `fingerprint_headers`
(lower-cased; repeated lines joined with ", "). Leave out the method or path (and query) with
`fingerprint_method=False` / `fingerprint_path=False`.
"""

from __future__ import annotations

import hashlib
import json
import re
from email.message import Message
from email.parser import HeaderParser
from email.utils import collapse_rfc2231_value
from typing import Any
from urllib.parse import parse_qsl, urlencode

import rfc8785

from .policy import HttpRequest, IdempotencyPolicy


def request_identity(policy: IdempotencyPolicy, req: HttpRequest) -> dict[str, Any]:
    """The JSON value the store fingerprints (see the module docstring)."""
    ident: dict[str, Any] = {}
    if policy.fingerprint_method:
        ident["method"] = req.method.upper()
    if policy.fingerprint_path:
        ident["path"] = f"{req.path}?{req.query}" if req.query else req.path
    if policy.fingerprint_headers:
        ident["headers"] = {h.lower(): req.header(h) or "" for h in policy.fingerprint_headers}
    ident["body"] = body_digest(req.header("content-type"), req.body)
    return ident


def body_digest(content_type: str | None, body: bytes) -> dict[str, str]:
    media = _media(content_type)
    if media == "application/json" or media.endswith("+json"):
        try:
            canonical = canonical_json(body)
        except (ValueError, RecursionError):
            pass  # not JSON after all, or beyond what JCS represents (ints over 2**53, NaN): compare the bytes
        else:
            return {"json": hashlib.sha256(canonical).hexdigest()}
    elif media == "application/x-www-form-urlencoded":
        # The fields percent-encoded again one way: "a+b" and "a%20b", "%2f" and "%2F" are the same value.
        # Latin-1 maps each byte to one character and back: any bytes, UTF-8 or not, percent-encoded or raw.
        pairs = parse_qsl(body.decode("latin-1"), keep_blank_values=True, encoding="latin-1")
        fields = urlencode(pairs, encoding="latin-1").encode("ascii")
        return {"form": hashlib.sha256(fields).hexdigest()}
    elif media == "multipart/form-data":
        parts = multipart_fields(content_type or "", body)
        if parts is not None:
            listed = json.dumps(parts, ensure_ascii=True, separators=(",", ":")).encode("ascii")
            return {"multipart": hashlib.sha256(listed).hexdigest()}
    return {"bytes": hashlib.sha256(body).hexdigest()}


class _Exact(Exception):
    """A body the fast path leaves to rfc8785 (a float, NaN or Infinity)."""


def _exact(text: str) -> float:
    raise _Exact


# Made once: json.loads/dumps with options build a decoder or encoder per call.
_DECODER = json.JSONDecoder(parse_float=_exact, parse_constant=_exact)
_ENCODER = json.JSONEncoder(ensure_ascii=False, sort_keys=True, separators=(",", ":"), check_circular=False)
# An escaped high surrogate (a character past U+FFFF, whose keys RFC 8785 orders otherwise), or a run of 16 digits (a
# number that may be past 2**53): left to rfc8785.
_EXACT = re.compile(rb"\\u[dD][89abAB]|[0-9]{16}")


def canonical_json(body: bytes) -> bytes:
    """The RFC 8785 (JCS) form of a JSON body (ValueError if it is not JSON, or not representable in JCS).

    Most bodies are ASCII JSON of strings, integers, booleans, null, arrays and objects: for those, JCS is exactly
    the standard library's sorted, compact encoding (same escapes, same integer digits; keys ordered by UTF-16 code
    units, which below U+10000 is the order of code points), done in C. Anything else -- a float, NaN, a 16-digit
    number, a non-ASCII or NUL byte, an escaped character past U+FFFF -- and any error, goes through rfc8785 as it
    always did, so a digest never depends on which way it was made (tests/http/test_http_core.py compares them)."""
    if body.isascii() and b"\x00" not in body and _EXACT.search(body) is None:
        try:
            return _ENCODER.encode(_DECODER.decode(body.decode("ascii"))).encode("utf-8")  # "\\u00e9": UTF-8 in JCS
        except Exception:  # whatever it was, rfc8785 decides: the digest is its
            pass
    return rfc8785.dumps(json.loads(body))


def multipart_fields(content_type: str, body: bytes) -> list[list[str | None]] | None:
    """A multipart/form-data body as [name, filename, content type, sha256 of the content] per part, in order (RFC
    7578; the boundary left out: a client picks a new one each time it encodes the form); None if it does not
    parse, so it is compared by its bytes."""
    message = Message()
    message["content-type"] = content_type
    boundary = message.get_boundary()
    if not boundary:
        return None
    segments = (b"\r\n" + body).split(b"\r\n--" + boundary.encode("latin-1"))
    fields: list[list[str | None]] = []
    for segment in segments[1:]:  # the first is the preamble
        if segment.startswith(b"--"):  # the close delimiter; what follows is the epilogue
            return fields
        padding, newline, rest = segment.partition(b"\r\n")
        if not newline or padding.strip(b" \t"):
            return None
        if rest.startswith(b"\r\n"):  # a part without headers
            head, content = b"", rest[2:]
        else:
            head, blank, content = rest.partition(b"\r\n\r\n")
            if not blank:
                return None
        part = HeaderParser().parsestr(head.decode("utf-8", "surrogateescape"))  # browsers send UTF-8 names
        name = part.get_param("name", header="content-disposition")
        fields.append([None if name is None else collapse_rfc2231_value(name), part.get_filename(),
                       part.get_content_type() if "content-type" in part else None,
                       hashlib.sha256(content).hexdigest()])
    return None  # no close delimiter: truncated


def _media(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()
