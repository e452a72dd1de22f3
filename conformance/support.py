"""Helpers the checks share: a business table the effects write to, and race drivers."""

from __future__ import annotations

import multiprocessing
import queue
import random
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.context import ForkServerContext, SpawnContext
from typing import Any

from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select
from sqlalchemy.engine import URL, Connection

from idem_dialects import IdempotencyStore


@contextmanager
def stores(url: URL, prefix: str, sync_url: URL | None = None) -> Iterator[Callable[..., IdempotencyStore]]:
    """A factory of stores on one set of fresh tables (created by the first, dropped on exit); keyword arguments
    go to create_engine (e.g. isolation_level), and `url=` points one store at another URL of the same database.
    With `sync_url`, `url` names an async driver and the stores are AsyncIdempotencyStores behind the sync API
    (bridge.BridgedStore), `sync_url` serving the checks' own reads."""
    made: list[Any] = []

    def make(url_override: URL | None = None, **engine_options: Any) -> IdempotencyStore:
        store: Any
        if sync_url is None:
            store = IdempotencyStore.from_url(url_override or url, table_prefix=prefix, **engine_options)
        else:
            from .bridge import BridgedStore

            store = BridgedStore(url_override or url, sync_url, table_prefix=prefix, **engine_options)
        if not made:
            store.create_tables()
        made.append(store)
        return store  # type: ignore[no-any-return]

    try:
        yield make
    finally:
        if made:
            made[0].drop_tables()
        for store in made:
            store.close()


class StatementLog:
    """A store's `statement_hook` that keeps the SQL of every statement the store runs (before it runs), and passes
    each call on to `then` if set: how the checks see the store's own statements, which SQLAlchemy's cursor events
    do not (the store runs them on the driver)."""

    def __init__(self) -> None:
        self.sql: list[str] = []
        self.then: Callable[[str, bool], None] | None = None

    def __call__(self, sql: str, done: bool) -> None:
        if not done:
            self.sql.append(sql)
        if self.then is not None:
            self.then(sql, done)


def returning(value: Any) -> Callable[[Connection], Any]:
    """An effect that writes nothing and returns `value` (bound now, unlike a lambda in a loop)."""
    return lambda conn: value


class Effects:
    """`<prefix>fx`: one row per effect that really ran, so checks count effects in the database."""

    def __init__(self, store: IdempotencyStore) -> None:
        self.store = store
        self.metadata = MetaData()
        self.table = Table(
            f"{store.table_prefix}fx",
            self.metadata,
            Column("id", String(32), primary_key=True),
            Column("k", String(255), nullable=False),
            Column("amount", Integer, nullable=False),
            Column("ref", String(64), nullable=True, unique=True),  # for checks of the effect's own violations
        )

    def create(self) -> None:
        with self.store.engine.begin() as conn:
            self.metadata.create_all(conn, checkfirst=True)

    def drop(self) -> None:
        with self.store.engine.begin() as conn:
            self.metadata.drop_all(conn, checkfirst=True)

    def apply(self, conn: Connection, key: str, amount: int = 1, ref: str | None = None) -> str:
        """Run one effect; returns its id, which makes every execution's response unique."""
        effect_id = uuid.uuid4().hex
        conn.execute(insert(self.table).values(id=effect_id, k=key, amount=amount, ref=ref))
        return effect_id

    def effect(self, key: str, amount: int = 1) -> Callable[[Connection], Any]:
        return lambda conn: {"effect": self.apply(conn, key, amount)}

    def count(self, key: str | None = None) -> int:
        stmt = select(func.count()).select_from(self.table)
        if key is not None:
            stmt = stmt.where(self.table.c.k == key)
        with self.store.engine.connect() as conn:
            return int(conn.execute(stmt).scalar_one())

    def per_key(self) -> dict[str, int]:
        with self.store.engine.connect() as conn:
            rows = conn.execute(select(self.table.c.k, func.count()).group_by(self.table.c.k)).all()
        return {k: int(n) for k, n in rows}


@contextmanager
def effects_table(store: IdempotencyStore) -> Iterator[Effects]:
    """`Effects` on `store`'s database and prefix, its table created for the block and dropped after it."""
    fx = Effects(store)
    fx.create()
    try:
        yield fx
    finally:
        fx.drop()


def fresh_processes() -> ForkServerContext | SpawnContext:
    """Where the multi-process checks start their processes: fresh interpreters, inheriting no engine, connection or
    socket of the check's (not `fork`), each forked from one server process that imported the library once (POSIX's
    `forkserver`, this module preloaded): a spawned interpreter per process re-imports SQLAlchemy and the library,
    half a second of CPU each, for dozens of processes per engine. `spawn` where there is no forkserver."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])  # takes effect when the server starts: the first check that needs it
    return ctx


def run_processes(procs: list[Any], out: Any, timeout: float = 300) -> list[Any]:
    """Start `procs` and return the one report each puts on `out`, once all have exited cleanly; fail the check if a
    process dies or they take longer than `timeout` seconds. A process still alive when this fails is killed."""
    for proc in procs:
        proc.start()
    reports: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while len(reports) < len(procs):
            try:
                reports.append(out.get(timeout=1))
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                assert not dead, f"a worker process died (exit codes {dead})"
                assert time.monotonic() < deadline, f"worker processes did not finish in {timeout:g} s"
        for proc in procs:
            proc.join(timeout=60)
            assert proc.exitcode == 0
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
    return reports


def process_worker(url: str, prefix: str, keys: list[str], seed: int, out: Any) -> None:
    """One process of the multi-process race: run every key (in its own shuffled order); report responses and
    the retries it absorbed through `out`."""
    store = IdempotencyStore.from_url(url, table_prefix=prefix)
    effects = Effects(store)
    random.Random(seed).shuffle(keys)
    responses = {}
    for key in keys:
        result = store.run(scope="s", operation="op", key=key, request={"amount": 100}, effect=effects.effect(key))
        responses[key] = result.response["effect"]
    out.put((responses, dict(store.retries)))
    store.engine.dispose()


def create_tables_worker(url: str, asynchronous: bool, prefixes: list[str], barrier: Any, out: Any) -> None:
    """One process of the start-up race: for each prefix, wait at `barrier` with the others, then `create_tables`
    on a store of its own (the async store's if `asynchronous`); report "ok" or the error's type per prefix."""
    outcomes: list[str] = []
    for prefix in prefixes:
        barrier.wait(timeout=120)
        try:
            if asynchronous:
                import asyncio

                from idem_dialects import AsyncIdempotencyStore

                async def create(prefix: str = prefix) -> None:
                    async with AsyncIdempotencyStore.from_url(url, table_prefix=prefix) as store:
                        await store.create_tables()

                asyncio.run(create())
            else:
                with IdempotencyStore.from_url(url, table_prefix=prefix) as store:
                    store.create_tables()
            outcomes.append("ok")
        except Exception as exc:  # reported, so the check can say what each process saw
            outcomes.append(f"{type(exc).__name__}: {getattr(exc, 'orig', exc)!r}"[:300])
    out.put(outcomes)
