"""What every broker adapter shares: the options, how a message is consumed through the store, and what becomes of
a message whose handler or database failed. It imports no broker client: each adapter module imports its own.

The adapters differ only in how they read a message (its id, payload and delivery count) and how they tell the
broker the disposition (ack, nak/requeue, dead-letter); the decisions are made here, once, and in `consume`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..core import NO_PAYLOAD
from ..errors import InvalidKey, InvalidPayload, RetriesExhausted, TransientError
from ..keys import check_identifier
from ..outcomes import Delivery, Disposition, OnMismatch

if TYPE_CHECKING:
    from ..api import AsyncStoreAPI, StoreAPI

M = TypeVar("M")
MessageId = Callable[[M], "str | bytes | None"]
"""How an adapter finds a message's id: a callable from the broker's message to its id (None: the message has none,
and is dead-lettered)."""
log = logging.getLogger("idem_dialects.consumers")


class DeadLetter(Exception):
    """Raise from a handler: this message can never be processed as it is (malformed, refused by a business rule);
    dead-letter it now instead of after `max_deliveries`. What the handler wrote is rolled back."""


def header(name: str) -> MessageId[Any]:
    """A message id taken from a header (`message.headers[name]`; aio-pika and nats-py messages)."""
    return lambda message: (getattr(message, "headers", None) or {}).get(name)


def text(value: object) -> str | None:
    """A message id as text: bytes decoded as UTF-8 (never guessed: undecodable bytes are a missing id)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return None
    return str(value)


MessageScope = Callable[[Any], str]
"""The scope a message's effects belong to (a sharded store's routing key: the tenant its handler writes for), from
the broker's message (Celery: from the task's arguments)."""


def transient(store: StoreAPI[Any] | AsyncStoreAPI[Any], error: BaseException) -> bool:
    """An error of the database rather than of the message (unreachable, retries outlasted): redeliver later,
    however often; never a reason to dead-letter."""
    return isinstance(error, (RetriesExhausted, TransientError)) or store.retry_cause(error) is not None


class ConsumerBase:
    """Options and decisions common to every adapter; `counts` tallies what happened to the messages it saw:
    processed, duplicate, mismatch, failed, and the dispositions ack, retry, dead-letter."""

    def __init__(self, *, subscriber: str, on_mismatch: OnMismatch, max_deliveries: int | None,
                 retry_delay: float, compare_payload: bool, scope: MessageScope | None = None) -> None:
        self.subscriber = check_identifier("subscriber", subscriber)
        if max_deliveries is not None and (not isinstance(max_deliveries, int) or max_deliveries < 1):
            raise ValueError(f"max_deliveries must be a positive int or None (never dead-letter), got"
                             f" {max_deliveries!r}")
        if retry_delay < 0:
            raise ValueError(f"retry_delay must be >= 0 seconds, got {retry_delay!r}")
        self.on_mismatch = on_mismatch
        self.max_deliveries = max_deliveries
        self.retry_delay = retry_delay
        self.compare_payload = compare_payload  # a redelivery whose payload changed is a mismatch
        self.scope = scope  # a sharded store's routing of each message (None: a store on one database)
        self.counts: Counter[str] = Counter()

    def routed(self, message: Any) -> str | None:
        """`consume`'s routing for a sharded store: the message's scope, where `scope` is given."""
        return None if self.scope is None else self.scope(message)

    def process(self, store: StoreAPI[Any], message_id: object, payload: Any,
                handler: Callable[[Any], Any], deliveries: int, message: Any = None) -> Disposition:
        """Consume one message with the sync store; the disposition to give it."""
        found = self._identified(message_id)
        if found is None:
            return self._counted(Disposition.DEAD_LETTER)
        try:
            delivery = store.consume(subscriber=self.subscriber, message_id=found, payload=self._payload(payload),
                                     handler=handler, on_mismatch=self.on_mismatch, scope=self.routed(message))
        except Exception as exc:
            return self._failed(store, exc, found, deliveries)
        return self.settled(delivery, found)

    async def aprocess(self, store: AsyncStoreAPI[Any], message_id: object, payload: Any,
                       handler: Callable[[Any], Awaitable[Any]], deliveries: int, message: Any = None) -> Disposition:
        """Consume one message with the async store; the disposition to give it."""
        found = self._identified(message_id)
        if found is None:
            return self._counted(Disposition.DEAD_LETTER)
        try:
            delivery = await store.consume(subscriber=self.subscriber, message_id=found,
                                           payload=self._payload(payload), handler=handler,
                                           on_mismatch=self.on_mismatch, scope=self.routed(message))
        except Exception as exc:
            return self._failed(store, exc, found, deliveries)
        return self.settled(delivery, found)

    def _payload(self, payload: Any) -> Any:
        return payload if self.compare_payload else NO_PAYLOAD

    def _identified(self, message_id: object) -> str | None:
        found = text(message_id)
        if not found:
            self.counts["no id"] += 1
            log.error("%s: a message without a usable id cannot be deduplicated; dead-lettering it (give the"
                      " consumer a message_id function, or set the id when publishing)", self.subscriber)
            return None
        return found

    def settled(self, delivery: Delivery, message_id: str) -> Disposition:
        if delivery.mismatch is not None:
            self.counts["mismatch"] += 1
            log.warning("%s: message %r was processed before with a different payload; %s", self.subscriber,
                        message_id, delivery.disposition.value)
        else:
            self.counts["duplicate" if delivery.duplicate else "processed"] += 1
        return self._counted(delivery.disposition)

    def _failed(self, store: StoreAPI[Any] | AsyncStoreAPI[Any], error: Exception, message_id: str,
                deliveries: int) -> Disposition:
        """A poison message (the handler keeps failing) is retried until `max_deliveries`, then dead-lettered; an
        invalid id or payload, or DeadLetter, at once; the database's own failures are retried however long."""
        self.counts["failed"] += 1
        if isinstance(error, (DeadLetter, InvalidKey, InvalidPayload)):
            disposition = Disposition.DEAD_LETTER
        elif transient(store, error):
            disposition = Disposition.RETRY
        elif self.max_deliveries is not None and deliveries >= self.max_deliveries:
            disposition = Disposition.DEAD_LETTER
        else:
            disposition = Disposition.RETRY
        log.warning("%s: message %r failed on delivery %d (%s); %s", self.subscriber, message_id, deliveries,
                    type(error).__name__, disposition.value, exc_info=disposition is Disposition.DEAD_LETTER)
        return self._counted(disposition)

    def _counted(self, disposition: Disposition) -> Disposition:
        self.counts[disposition.value] += 1
        return disposition
