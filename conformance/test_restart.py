"""Check: a server restarted under load, for every driver of the engine. The server stops cleanly (its sessions
dropped), stays down 3 s and starts again while 8 workers run `run` with a retry budget far longer than that: threads
for a sync driver, asyncio tasks for an async one. No connection error reaches a caller, no acknowledged effect is
lost, none is doubled. The sync column runs every installed sync driver of the backend; each async column its own
async driver. The engine's own server if the suite started it, else a private server of the same backend the suite
starts (never a server that is not ours; for a cluster, whose nodes the cluster checks kill, that is a lone one)."""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import threading
import uuid
import warnings
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import select
from sqlalchemy.engine import URL

import idem_dialects
from idem_dialects import IdempotencyStore, Result, RetryPolicy, dialects
from idem_dialects.dialects.base import Backend
from idem_dialects.engines import Server, Unavailable, provisioning

from .plugin import EngineUnderTest, unique_prefix
from .support import Effects, stores

if TYPE_CHECKING:  # loaded only by the async columns: without greenlet ([async]) the module still imports
    from sqlalchemy.ext.asyncio import AsyncConnection

REQ = {"amount": 100}
Observe = Callable[[str, object], None]
WORKERS = 8
PAUSE = 3.0  # seconds the server stays down
POLICY = RetryPolicy(total=60)  # far longer than a restart


@dataclass
class LoadReport:
    """What callers saw while the server restarted (results and errors, raw or not), and the database's count."""

    driver: str
    calls: int = 0
    errors: list[BaseException] = field(default_factory=list)
    acknowledged: list[tuple[str, str]] = field(default_factory=list)  # (key, effect id) of every result
    lost: list[str] = field(default_factory=list)  # keys whose acknowledged effect is not in the database
    doubled: dict[str, int] = field(default_factory=dict)  # keys with more than one effect
    retries: dict[str, int] = field(default_factory=dict)


class Load:
    """The schedule the sync and the async workers share: worker `w` sends keys k<w // 2>-0, -1, ... (pairs of
    workers send the same keys, so duplicates race); after `before` calls in all the server restarts, and each
    worker then runs `after` more calls."""

    def __init__(self, report: LoadReport, before: int = 40, after: int = 10) -> None:
        self.report, self.before, self.after = report, before, after
        self.lock = threading.Lock()
        self.enough, self.restarted = threading.Event(), threading.Event()

    def keys(self, worker: int) -> Iterator[str]:
        extra = 0
        for i in itertools.count():
            if extra >= self.after or i >= 5000:
                return
            yield f"k{worker // 2}-{i}"
            if self.restarted.is_set():
                extra += 1

    def record(self, key: str, result: Result | None, error: BaseException | None) -> None:
        with self.lock:
            if result is not None:
                self.report.acknowledged.append((key, result.response["effect"]))
            if error is not None:
                self.report.errors.append(error)
            self.report.calls += 1
            if self.report.calls >= self.before:
                self.enough.set()

    def restart(self, server: Server) -> None:
        """Once enough calls ran: the server down for PAUSE seconds, then up again."""
        try:
            self.enough.wait(120)
            assert server.restart is not None
            server.restart(PAUSE)
        finally:
            self.restarted.set()


def _sync_load(url: URL, server: Server, load: Load, effects: Effects) -> None:
    store = IdempotencyStore.from_url(url, table_prefix=effects.store.table_prefix)

    def worker(w: int) -> None:
        for key in load.keys(w):
            try:
                load.record(key, store.run(scope="s", operation="op", key=key, request=REQ,
                                           effect=effects.effect(key), retry=POLICY), None)
            except Exception as exc:
                load.record(key, None, exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(WORKERS)]
    try:
        for thread in threads:
            thread.start()
        load.restart(server)
    finally:
        load.restarted.set()
        for thread in threads:
            thread.join(180)
        load.report.retries = dict(store.retries)
        store.close()


def _async_load(url: URL, server: Server, load: Load, effects: Effects) -> None:
    def effect(key: str) -> Callable[[AsyncConnection], Awaitable[Any]]:
        async def run(conn: AsyncConnection) -> Any:
            effect_id = uuid.uuid4().hex
            await conn.execute(effects.table.insert().values(id=effect_id, k=key, amount=1))
            return {"effect": effect_id}

        return run

    async def main() -> None:
        store_from_url = idem_dialects.AsyncIdempotencyStore.from_url
        async with store_from_url(url, table_prefix=effects.store.table_prefix) as store:
            async def worker(w: int) -> None:
                for key in load.keys(w):
                    try:
                        load.record(key, await store.run(scope="s", operation="op", key=key, request=REQ,
                                                         effect=effect(key), retry=POLICY), None)
                    except Exception as exc:
                        load.record(key, None, exc)

            restarting = asyncio.create_task(asyncio.to_thread(load.restart, server))
            try:
                await asyncio.gather(*(worker(w) for w in range(WORKERS)))
            finally:
                load.restarted.set()
                await restarting
                load.report.retries = dict(store.retries)

    asyncio.run(main())


@contextmanager
def driver_leaks(backend: type[Backend], driver: str) -> Iterator[None]:
    """Around a load on a driver known to leak the sockets of lost connections (`Driver.leaks_lost_sockets`): its
    ResourceWarnings are the driver's, so they are ignored here, and the leaked sockets collected now. The pool's
    log of each failed close is muted too: a captured record's traceback would keep the socket alive into a later
    check. Any other driver's leak still fails the check, as everywhere in the suite."""
    known = dialects.driver(backend, driver)
    if known is None or not known.leaks_lost_sockets:
        yield
        return
    pool_log = logging.getLogger("sqlalchemy.pool")
    level = pool_log.level
    pool_log.setLevel(logging.CRITICAL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            yield
        finally:
            pool_log.setLevel(level)
            gc.collect()


def restart_under_load(server: Server, driver: str, asynchronous: bool) -> LoadReport:
    """Restart `server` under the load of `driver`'s store, then count the effects in the database."""
    report = LoadReport(driver)
    backend = dialects.load(server.url.get_backend_name())
    url = provisioning(backend.name).driver_url(server.url, driver)
    with driver_leaks(backend, driver), stores(server.url, unique_prefix()) as make:
        effects = Effects(make())
        effects.create()
        try:
            (_async_load if asynchronous else _sync_load)(url, server, Load(report), effects)
            effects.store.engine.dispose()  # its pooled connections died with the server
            with effects.store.engine.connect() as conn:
                stored = {row.id for row in conn.execute(select(effects.table.c.id))}
            report.lost = [key for key, effect_id in report.acknowledged if effect_id not in stored]
            report.doubled = {k: n for k, n in effects.per_key().items() if n > 1}
        finally:
            effects.drop()
    return report


_PRIVATE = pytest.StashKey[dict[str, "Server | Unavailable"]]()


def restartable(engine: EngineUnderTest, config: pytest.Config) -> tuple[Server, str]:
    """A server this suite may restart: the engine's own if the suite started it, else a private server of its
    backend (one per backend for the session: the sync and async columns restart the same one); skips, saying why,
    when there is neither."""
    if provisioning(engine.backend).embedded:
        pytest.skip("the database is embedded in the client: no server to restart")
    if engine.server.restart is not None:
        return engine.server, "the engine's own server"
    private = config.stash.setdefault(_PRIVATE, {})
    if engine.backend not in private:
        try:
            private[engine.backend] = started = provisioning(engine.backend).private_server(engine.backend)
            config.add_cleanup(started.stop)
        except Unavailable as exc:
            private[engine.backend] = exc
    found = private[engine.backend]
    if isinstance(found, Unavailable):
        pytest.skip(f"{engine.name} is not a server this suite started ({engine.server.how}) and {found}")
    return found, f"a private {engine.backend} server"


def test_server_restart_under_load(idem_engine: EngineUnderTest, idem_observe: Observe,
                                   request: pytest.FixtureRequest) -> None:
    """A server restarted (down 3 s) under 8 workers, for every driver: no error reaches a caller, no acknowledged
    effect is lost, none is doubled, and the restart was really absorbed (retries happened)."""
    backend = dialects.load(idem_engine.backend)
    drivers = [idem_engine.driver] if idem_engine.driver is not None else list(dialects.usable_drivers(backend))
    if not drivers:
        pytest.skip(f"no sync driver of {idem_engine.backend} can be imported here")
    server, where = restartable(idem_engine, request.config)
    reports = [restart_under_load(server, driver, idem_engine.driver is not None) for driver in drivers]
    failures = {r.driver: [f"{type(e).__name__}: {e}" for e in r.errors][:3] for r in reports if r.errors}
    assert failures == {}, f"errors reached callers: {failures}"
    assert {r.driver: (r.lost, r.doubled) for r in reports} == {r.driver: ([], {}) for r in reports}
    unabsorbed = [r.driver for r in reports if not r.retries]
    assert unabsorbed == [], "the restart was absorbed without a single retry: it did not happen under load"
    for r in reports:
        tally = ", ".join(f"{c} x{n}" for c, n in sorted(r.retries.items()))
        kind = "tasks" if idem_engine.driver is not None else "threads"
        idem_observe(f"restart under {WORKERS}-{kind} load ({r.driver})",
                     f"{where}: {r.calls} calls, 0 errors, 0 lost, 0 doubled ({tally})")

