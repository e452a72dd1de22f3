"""RabbitMQ through aio-pika: each command published persistent, with publisher confirms and `mandatory` (a message
no queue takes is an error, not a silent drop), its id as the AMQP ``message-id`` property (what
`idem_dialects.consumers.rabbitmq` reads by default) and as an ``Idempotency-Key`` header::

    relay = AsyncRelay(store, {"orders": RabbitMQPublisher("amqp://guest:guest@localhost/", routing_key="orders")})

RabbitMQ keeps no publish-side deduplication: a command published again after a relay died is a second message with
the same id, which the consumer's inbox acknowledges without running its handler again.
"""

from __future__ import annotations

import asyncio

import aio_pika
import aio_pika.exceptions
from aio_pika.abc import AbstractChannel, AbstractConnection

from ..outbox import Command
from ..relay import Unreachable
from .refusal import CredentialsRefused

__all__ = ["RabbitMQPublisher"]

_DOWN = (aio_pika.exceptions.AMQPConnectionError, aio_pika.exceptions.ChannelInvalidStateError, ConnectionError,
         OSError)


class RabbitMQPublisher:
    """Publishes to `exchange` (default: the default exchange) with `routing_key` (default: the command's
    destination). One connection per publisher, opened on first use and again after a failure."""

    def __init__(self, url: str, *, exchange: str = "", routing_key: str | None = None) -> None:
        self.url, self.exchange, self.routing_key = url, exchange, routing_key
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._lock: asyncio.Lock | None = None

    async def _open(self) -> AbstractChannel:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._channel is None or self._channel.is_closed:
                await self.close()
                self._connection = await aio_pika.connect(self.url)
                self._channel = await self._connection.channel(publisher_confirms=True, on_return_raises=True)
            return self._channel

    async def publish(self, command: Command) -> None:
        try:
            channel = await self._open()
            exchange = (channel.default_exchange if not self.exchange
                        else await channel.get_exchange(self.exchange, ensure=False))
            message = aio_pika.Message(command.payload, message_id=command.id, content_type=command.content_type,
                                       headers={**command.headers, "Idempotency-Key": command.id},
                                       delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
            await exchange.publish(message, routing_key=self.routing_key or command.destination, mandatory=True)
        except aio_pika.exceptions.ProbableAuthenticationError as exc:  # an AMQPConnectionError: before _DOWN
            self._channel = None
            raise CredentialsRefused(f"RabbitMQ refused the user and password of its URL ({type(exc).__name__})"
                                     ) from exc
        except _DOWN as exc:
            self._channel = None
            raise Unreachable(f"RabbitMQ: {type(exc).__name__}: {exc}") from exc

    async def close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None and not connection.is_closed:
            try:
                await connection.close()
            except Exception:  # closing a broken connection: nothing left to release
                pass
