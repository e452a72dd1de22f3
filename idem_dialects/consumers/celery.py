"""Celery: a decorator for tasks that run once per message however often the broker delivers it::

    @idempotent_task(app, store, subscriber="emails")
    def send_receipt(conn, order_id):   # the task's arguments follow the connection
        ...

The task is registered with ``acks_late=True`` (the message is acknowledged after the task returns, so a worker that
dies mid-task gets it redelivered) and runs its body in the transaction that records the message id: the Celery task
id by default (the same on every redelivery and on Celery's own retries), or `key(*args, **kwargs)` for an id of the
caller's (two publishes of the same logical job). A redelivery whose body committed before returns None without
running it. When the database cannot be reached the task is retried (``self.retry``, after `retry_delay` seconds,
the same task id); the body's own errors reach Celery unchanged (its ``autoretry_for`` and failure handling apply).
A message whose id was first processed with different arguments gets `on_mismatch`'s disposition: acknowledged
(returns None), retried, or rejected without requeue (to the queue's dead-letter exchange).

Which arguments are "the same": `payload(*args, **kwargs)` names the value compared (default: the arguments
themselves, as RFC 8785 JSON where it represents them, else as the bytes of kombu's JSON encoding, which carries what
Celery's serializer does: 64-bit ints, NaN, datetimes, UUIDs, Decimals); `compare_payload=False` compares nothing. A
message the library refuses before the body runs (an id `key` made that breaks the key rules, a payload that cannot be
compared) is rejected without requeue, never acknowledged as if its job had run.

`store` may be a function returning the store: it is called once per worker process, after Celery forks it, so no
database connection is shared across processes.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from typing import Any

from celery import Celery, Task
from celery.exceptions import Reject
from kombu.utils import json as kombu_json
from sqlalchemy.engine import Connection

from ..api import StoreAPI
from ..core import NO_PAYLOAD
from ..errors import InvalidKey, InvalidPayload
from ..fingerprint import Encoder, to_json
from ..outcomes import Disposition, OnMismatch
from .base import ConsumerBase, log, transient

__all__ = ["idempotent_task"]  # public: the API reference documents each

Body = Callable[..., Any]  # body(conn, *args, **kwargs)
AnyStore = StoreAPI[Any]  # a sync store of any type: IdempotencyStore, ShardedStore, DjangoStore


class _PerProcess:
    """The store, made once per process from a factory (a forked worker must not reuse its parent's connections)."""

    def __init__(self, store: AnyStore | Callable[[], AnyStore]) -> None:
        self._given, self._lock = store, threading.Lock()
        self._made: tuple[int, AnyStore] | None = None

    def get(self) -> AnyStore:
        if not callable(self._given):  # a store, not a factory of one
            return self._given
        with self._lock:
            if self._made is None or self._made[0] != os.getpid():
                self._made = (os.getpid(), self._given())
            return self._made[1]


def arguments(encoder: Encoder | None, *args: Any, **kwargs: Any) -> object:
    """The payload compared on a redelivery by default: the arguments as JSON where RFC 8785 represents them (as
    before 64-bit ints were accepted, so stored fingerprints still match), else their kombu JSON bytes, keys sorted."""
    value = {"args": list(args), "kwargs": kwargs}
    try:
        to_json("payload", value, encoder, request=True)
    except InvalidPayload:
        try:
            return json.dumps(value, sort_keys=True, cls=kombu_json.JSONEncoder).encode("utf-8")
        except (TypeError, ValueError):  # a type only another serializer (pickle) carries
            raise InvalidPayload("payload", "the task's arguments are not JSON, even as kombu encodes it: pass"
                                            " payload=callable(*args, **kwargs) giving what to compare, or"
                                            " compare_payload=False") from None
    return value


def idempotent_task(app: Celery, store: AnyStore | Callable[[], AnyStore], *,
                    subscriber: str | None = None, key: Callable[..., str] | None = None,
                    on_mismatch: OnMismatch = Disposition.DEAD_LETTER, retry_delay: float = 5.0,
                    compare_payload: bool = True, payload: Callable[..., object] | None = None,
                    scope: Callable[..., str] | None = None, **options: Any) -> Callable[[Body], Task]:
    """Register `body` as a Celery task of `app` (`options` go to ``app.task``) that runs once per message id.
    `subscriber` defaults to the task's name; `payload` and `compare_payload` say what a redelivery is compared by;
    with a ShardedStore, `scope(*args, **kwargs)` names the task's scope (its shard: where its body writes)."""
    if options.get("acks_late", True) is not True:
        raise ValueError("idempotent_task needs acks_late=True: with early acks a worker that dies mid-task loses"
                         " the message, and there is nothing to deduplicate")
    options.pop("acks_late", None)
    options.pop("bind", None)
    stores = _PerProcess(store)

    def decorate(body: Body) -> Task:
        name = options.pop("name", None) or f"{body.__module__}.{body.__qualname__}"
        policy = ConsumerBase(subscriber=subscriber or name, on_mismatch=on_mismatch, max_deliveries=None,
                              retry_delay=retry_delay, compare_payload=compare_payload)

        def run(task: Task, *args: Any, **kwargs: Any) -> Any:
            message_id = key(*args, **kwargs) if key is not None else task.request.id
            resolved = stores.get()
            ran: list[bool] = []

            def handler(conn: Connection) -> Any:
                ran.append(True)
                return body(conn, *args, **kwargs)

            try:
                compared = (NO_PAYLOAD if not compare_payload else payload(*args, **kwargs) if payload is not None
                            else arguments(resolved.encoder, *args, **kwargs))
                delivery = resolved.consume(subscriber=policy.subscriber, message_id=message_id, payload=compared,
                                            handler=handler, on_mismatch=on_mismatch,
                                            scope=None if scope is None else scope(*args, **kwargs))
            except (InvalidKey, InvalidPayload) as exc:
                if ran:
                    raise  # the body's own error, unchanged
                # Refused before the body ran: acknowledging it (a failed task) would lose the job unnoticed.
                policy.counts["failed"] += 1
                policy.counts[Disposition.DEAD_LETTER.value] += 1
                why = f"{exc.field} {exc.rule}" if isinstance(exc, InvalidKey) else str(exc)  # never the id itself
                log.error("%s: task %s refused before it ran (%s); rejected without requeue", policy.subscriber,
                          task.request.id, why)
                raise Reject(f"{policy.subscriber}: refused before the task ran: {why}", requeue=False) from exc
            except Exception as exc:
                if not transient(resolved, exc):
                    raise  # the body's own error, unchanged
                policy.counts["failed"] += 1
                raise task.retry(exc=exc, countdown=retry_delay, max_retries=None) from exc
            disposition = policy.settled(delivery, str(message_id))
            if disposition is Disposition.ACK:
                return delivery.value
            if disposition is Disposition.RETRY:
                raise task.retry(countdown=retry_delay, max_retries=None)
            raise Reject(f"{policy.subscriber}: message {message_id!r} was processed before with other arguments",
                         requeue=False)

        run.__name__, run.__doc__, run.__qualname__ = body.__name__, body.__doc__, body.__qualname__
        task: Task = app.task(bind=True, acks_late=True, name=name, **options)(run)
        task.idempotency = policy  # its counts, for tests and metrics
        return task

    return decorate
