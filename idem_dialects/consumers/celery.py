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

`store` may be a function returning the store: it is called once per worker process, after Celery forks it, so no
database connection is shared across processes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from celery import Celery, Task
from celery.exceptions import Reject
from sqlalchemy.engine import Connection

from ..outcomes import Disposition
from ..protocol import OnMismatch
from ..store import IdempotencyStore
from .base import ConsumerBase, transient

Body = Callable[..., Any]  # body(conn, *args, **kwargs)


class _PerProcess:
    """The store, made once per process from a factory (a forked worker must not reuse its parent's connections)."""

    def __init__(self, store: IdempotencyStore | Callable[[], IdempotencyStore]) -> None:
        self._given, self._lock = store, threading.Lock()
        self._made: tuple[int, IdempotencyStore] | None = None

    def get(self) -> IdempotencyStore:
        if isinstance(self._given, IdempotencyStore):
            return self._given
        with self._lock:
            if self._made is None or self._made[0] != os.getpid():
                self._made = (os.getpid(), self._given())
            return self._made[1]


def idempotent_task(app: Celery, store: IdempotencyStore | Callable[[], IdempotencyStore], *,
                    subscriber: str | None = None, key: Callable[..., str] | None = None,
                    on_mismatch: OnMismatch = Disposition.DEAD_LETTER, retry_delay: float = 5.0,
                    **options: Any) -> Callable[[Body], Task]:
    """Register `body` as a Celery task of `app` (`options` go to ``app.task``) that runs once per message id.
    `subscriber` defaults to the task's name."""
    if options.get("acks_late", True) is not True:
        raise ValueError("idempotent_task needs acks_late=True: with early acks a worker that dies mid-task loses"
                         " the message, and there is nothing to deduplicate")
    options.pop("acks_late", None)
    options.pop("bind", None)
    stores = _PerProcess(store)

    def decorate(body: Body) -> Task:
        name = options.pop("name", None) or f"{body.__module__}.{body.__qualname__}"
        policy = ConsumerBase(subscriber=subscriber or name, on_mismatch=on_mismatch, max_deliveries=None,
                              retry_delay=retry_delay, compare_payload=True)

        def run(task: Task, *args: Any, **kwargs: Any) -> Any:
            message_id = key(*args, **kwargs) if key is not None else task.request.id
            payload = {"args": list(args), "kwargs": kwargs}
            resolved = stores.get()

            def handler(conn: Connection) -> Any:
                return body(conn, *args, **kwargs)

            try:
                delivery = resolved.consume(subscriber=policy.subscriber, message_id=message_id, payload=payload,
                                            handler=handler, on_mismatch=on_mismatch)
            except Exception as exc:
                if not transient(resolved, exc):
                    raise  # the body's own error, unchanged
                policy.counts["failed"] += 1
                raise task.retry(exc=exc, countdown=retry_delay, max_retries=None) from exc
            disposition = policy._settled(delivery, str(message_id))
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
