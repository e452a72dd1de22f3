"""The Celery application a test worker process runs (``celery -A celery_app worker``), configured from the
environment by tests/test_consumers_celery.py: two idempotent tasks writing to an SQLite inbox, and a hook that kills
the worker (SIGKILL) right after its first task returned, once its transaction committed and before acks_late
acknowledged it."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import task_postrun
from consumer_common import dead_lettered
from sqlalchemy import insert
from sqlalchemy.engine import Connection

from idem_dialects import IdempotencyStore
from idem_dialects.conformance.brokers import applied_table
from idem_dialects.consumers.celery import idempotent_task

env = os.environ
app = Celery("idem_test", broker=env.get("IDEM_CELERY_BROKER", "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.task_default_queue = env.get("IDEM_CELERY_QUEUE", "idem-test")
app.conf.task_queues = [dead_lettered(app.conf.task_default_queue)]
app.conf.broker_connection_retry_on_startup = True
PREFIX = env.get("IDEM_CELERY_PREFIX", "inbox_")
applied = applied_table(PREFIX)


def store() -> IdempotencyStore:
    return IdempotencyStore.from_url(env.get("IDEM_CELERY_DB", "sqlite://"), table_prefix=PREFIX)


@idempotent_task(app, store, subscriber="receipts", name="idem_test.record")
def record(conn: Connection, order: str) -> str:
    conn.execute(insert(applied).values(message_id=order, worker=os.getpid() % 100_000))
    return order


@idempotent_task(app, store, subscriber="charges", key=lambda order, amount: f"charge:{order}",
                 name="idem_test.charge")
def charge(conn: Connection, order: str, amount: int) -> int:
    conn.execute(insert(applied).values(message_id=f"charge:{order}", worker=amount))
    return amount


@idempotent_task(app, store, subscriber="ids", name="idem_test.big")
def big(conn: Connection, number: int, signed: int) -> int:
    """Arguments a JSON message carries exactly, beyond what RFC 8785 represents (64-bit ids)."""
    conn.execute(insert(applied).values(message_id=f"big:{number}:{signed}", worker=0))
    return number


@idempotent_task(app, store, subscriber="orders", key=lambda order: order, name="idem_test.keyed")
def keyed(conn: Connection, order: str) -> str:
    conn.execute(insert(applied).values(message_id=f"keyed:{order}", worker=0))
    return order


@task_postrun.connect
def after_task(task_id: str, task: Any, retval: Any, **kwargs: Any) -> None:
    journal = env.get("IDEM_CELERY_JOURNAL")
    if journal:
        with open(journal, "a") as out:
            out.write(f"{task.name} {task_id} {retval}\n")
    marker = env.get("IDEM_CELERY_KILL_AFTER_FIRST")
    if marker and not Path(marker).exists():
        Path(marker).touch()
        os.kill(os.getpid(), signal.SIGKILL)  # committed, not yet acknowledged (acks_late acks after this)
