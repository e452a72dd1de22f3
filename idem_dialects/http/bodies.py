"""Bodies as the HTTP layer reads and captures them: whole, up to a limit (`Buffer`), since the record must hold all
of a response before its first byte leaves; and server-sent events, the one kind of response passed on as it streams
(`streamed`), never stored."""

from __future__ import annotations

import warnings

from ..errors import IdemWarning
from .policy import IdempotencyPolicy
from .problems import HttpResponse


class BodyOverLimit(Exception):
    """An adapter met more response bytes than the policy stores."""


class Buffer:
    """A body collected whole up to `limit` bytes (the record must hold all of a response before its first byte
    leaves; a request body over the limit is refused): every adapter's reading and capturing."""

    __slots__ = ("_chunks", "limit", "size")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self._chunks: list[bytes] = []

    def add(self, chunk: bytes) -> bool:
        """Keep `chunk`; False once the body is over the limit (nothing more is kept)."""
        self.size += len(chunk)
        if self.size > self.limit:
            return False
        self._chunks.append(chunk if type(chunk) is bytes else bytes(chunk))  # a bytearray or view may change
        return True

    def keep(self, chunk: bytes) -> None:
        """`add` for a response: BodyOverLimit once it is over the limit."""
        if not self.add(chunk):
            raise BodyOverLimit(self.size)

    def body(self) -> bytes:
        chunks = self._chunks
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def response_body(body: bytes, limit: int) -> bytes:
    """A response body already whole, if the policy stores one that large (else BodyOverLimit)."""
    if len(body) > limit:
        raise BodyOverLimit(len(body))
    return body


def declared_too_large(policy: IdempotencyPolicy, content_length: str | None) -> bool:
    """A request whose Content-Length is over `max_request_bytes`: refused without reading its body."""
    declared = str(content_length or "")
    return declared.isdigit() and int(declared) > policy.max_request_bytes


def streamed(method: str, path: str, status: int, headers: list[tuple[str, str]]) -> HttpResponse:
    """The answer of an app that streams server-sent events, which the adapter passes on unbuffered: never stored,
    with a warning naming the route (once per route and process)."""
    warnings.warn(f"{method} {path} streamed its response (text/event-stream): it was passed through unbuffered and"
                  " not stored, so it is not idempotent (in atomic mode its writes roll back, and its transaction may"
                  " stay open while it streams); leave streaming routes out of the idempotency policy's paths",
                  IdemWarning, stacklevel=2)
    return HttpResponse(status, headers, streamed=True)


def is_event_stream(headers: list[tuple[str, str]]) -> bool:
    """Server-sent events: a stream by definition, whatever its first chunk looks like."""
    return any(k.lower() == "content-type" and v.split(";")[0].strip().lower() == "text/event-stream"
               for k, v in headers)
