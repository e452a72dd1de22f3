"""Publishers for the outbox's relays (`idem_dialects.relay`), one module per destination, each importing its client
only when imported itself (its client library is an extra of its own):

- `idem_dialects.publishers.rabbitmq`: RabbitMQ through aio-pika (``[rabbitmq]``), the command id as the AMQP
  ``message-id``, publisher confirms;
- `idem_dialects.publishers.nats`: NATS JetStream through nats-py (``[nats]``), the id as ``Nats-Msg-Id`` (JetStream's
  own deduplication);
- `idem_dialects.publishers.redis`: Redis Streams through redis-py (``[redis]``), the id in the entry's ``id`` field;
- `idem_dialects.publishers.http`: an HTTP endpoint through the standard library, the id as the ``Idempotency-Key``.

Each returns once the destination has the command and raises `relay.Unreachable` when it cannot be reached, or
`CredentialsRefused` (an `Unreachable`) when the destination refuses the credentials in its URL.
"""

from __future__ import annotations

from .refusal import CredentialsRefused

__all__ = ["CredentialsRefused", "from_url"]


def from_url(url: str) -> object:
    """The publisher a URL names (the `relay` command's ``--route NAME=URL``): ``amqp://`` RabbitMQ (query
    ``exchange``, ``routing_key``), ``nats://`` NATS JetStream (``subject``, ``stream``), ``redis://`` Redis Streams
    (``stream``, ``maxlen``), ``http://`` / ``https://`` an endpoint. Without a routing key / subject / stream, the
    command's destination is used. Each client is imported only here, when named."""
    from urllib.parse import parse_qsl, urlsplit, urlunsplit

    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    bare = urlunsplit(parts._replace(query=""))
    if parts.scheme in ("amqp", "amqps"):
        from .rabbitmq import RabbitMQPublisher

        return RabbitMQPublisher(bare, exchange=query.get("exchange", ""), routing_key=query.get("routing_key"))
    if parts.scheme in ("nats", "tls"):
        from .nats import NatsPublisher

        return NatsPublisher(bare, subject=query.get("subject"), stream=query.get("stream"))
    if parts.scheme in ("redis", "rediss", "unix"):
        from .redis import RedisStreamPublisher

        maxlen = query.pop("maxlen", None)
        stream = query.pop("stream", None)
        return RedisStreamPublisher(bare, stream=stream, maxlen=int(maxlen) if maxlen else None)
    if parts.scheme in ("http", "https"):
        from .http import HttpPublisher

        return HttpPublisher(url)
    raise ValueError(f"no publisher for {parts.scheme or 'a URL without a scheme'}:// (amqp, nats, redis, http(s))")

