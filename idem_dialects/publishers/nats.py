"""NATS JetStream through nats-py: each command published to a stream, acknowledged by JetStream, its id as the
``Nats-Msg-Id`` header, which JetStream's own deduplication reads (a command published again within the stream's
duplicate window is dropped by the server) and `idem_dialects.consumers.nats` reads by default (past the window the
consumer's inbox deduplicates)::

    relay = AsyncRelay(store, {"orders": NatsPublisher("nats://localhost:4222", subject="orders.in")})
"""

from __future__ import annotations

import asyncio
from typing import Any

import nats
import nats.errors
import nats.js.errors

from ..consumers.nats import MSG_ID_HEADER
from ..outbox import Command
from ..relay import Unreachable

__all__ = ["NatsPublisher"]

_DOWN = (nats.errors.ConnectionClosedError, nats.errors.NoServersError, nats.errors.TimeoutError,
         nats.errors.ConnectionReconnectingError, ConnectionError, OSError, TimeoutError)


class NatsPublisher:
    """Publishes to `subject` (default: the command's destination), on `stream` if given (JetStream checks the
    subject is that stream's). One connection per publisher, opened on first use."""

    def __init__(self, url: str, *, subject: str | None = None, stream: str | None = None,
                 timeout: float = 5.0) -> None:
        self.url, self.subject, self.stream, self.timeout = url, subject, stream, timeout
        self._nc: Any = None
        self._js: Any = None
        self._lock: asyncio.Lock | None = None

    async def _open(self) -> Any:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._js is None or self._nc.is_closed:
                self._nc = await nats.connect(self.url, max_reconnect_attempts=2, connect_timeout=self.timeout)
                self._js = self._nc.jetstream(timeout=self.timeout)
            return self._js

    async def publish(self, command: Command) -> None:
        headers = {**command.headers, MSG_ID_HEADER: command.id, "Content-Type": command.content_type}
        try:
            js = await self._open()
            await js.publish(self.subject or command.destination, command.payload, stream=self.stream,
                             headers=headers)  # an ack with duplicate=True: JetStream already has it
        except nats.js.errors.NoStreamResponseError as exc:
            raise Unreachable(f"NATS: no stream answered for {self.subject or command.destination!r}") from exc
        except _DOWN as exc:
            await self.close()
            raise Unreachable(f"NATS: {type(exc).__name__}: {exc}") from exc

    async def close(self) -> None:
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None and not nc.is_closed:
            try:
                await nc.close()
            except Exception:  # closing a broken connection: nothing left to release
                pass
