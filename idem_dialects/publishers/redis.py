"""Redis Streams through redis-py: each command an ``XADD`` entry with fields ``id`` (the command id: read it with
``idem_dialects.consumers.redis.field("id")``), ``body``, ``content-type`` and one ``h:<name>`` per header::

    relay = Relay(store, {"orders": RedisStreamPublisher("redis://localhost:6379/0", stream="orders")})

Redis gives every ``XADD`` an entry id of its own and keeps no publish-side deduplication: a command published again
after a relay died is a second entry with the same ``id`` field, which the consumer's inbox deduplicates.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.exceptions

from ..outbox import Command
from ..relay import Unreachable
from .refusal import CredentialsRefused

__all__ = ["HEADER_PREFIX", "ID_FIELD", "RedisStreamPublisher"]

ID_FIELD = "id"  # where an entry carries the command id (consumers.redis.field("id") reads it)
HEADER_PREFIX = "h:"  # a command header's field name in an entry


class RedisStreamPublisher:
    """Adds to `stream` (default: the command's destination), trimmed to about `maxlen` entries if given. `client`:
    a URL or a `redis.Redis`."""

    def __init__(self, client: str | redis.Redis, *, stream: str | None = None, maxlen: int | None = None) -> None:
        self.client = redis.Redis.from_url(client) if isinstance(client, str) else client
        self.stream, self.maxlen = stream, maxlen

    def publish(self, command: Command) -> None:
        fields: dict[Any, Any] = {ID_FIELD: command.id, "body": command.payload, "content-type": command.content_type}
        fields.update({f"{HEADER_PREFIX}{name}": value for name, value in command.headers.items()})
        try:
            self.client.xadd(self.stream or command.destination, fields, maxlen=self.maxlen, approximate=True)
        except redis.exceptions.AuthenticationError as exc:  # a ConnectionError: before it
            raise CredentialsRefused(f"Redis refused the user and password of its URL ({type(exc).__name__})"
                                     ) from exc
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            raise Unreachable(f"Redis: {type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        self.client.close()
