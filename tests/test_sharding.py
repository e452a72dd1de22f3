"""Scale-out by scope: ShardedStore and AsyncShardedStore route every key to its scope's shard, through the plain
API, the step-by-step API, the HTTP layer (WSGI, ASGI) and the consumer's `consume`; one shard's PostgreSQL server
killed under load stops only its own keys, and after its restart nothing is lost or doubled on either shard."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from consumer_common import wait_for
from sqlalchemy import Column, MetaData, String, Table, func, insert, select, text
from sqlalchemy.engine import Connection

from idem_dialects import (
    CrossShard,
    IdempotencyStore,
    RetriesExhausted,
    RetryPolicy,
    ShardedStore,
    TransientError,
    UnknownShard,
)
from idem_dialects.engines import Unavailable
from idem_dialects.http import IdempotencyPolicy

SHARDS = ("a", "b")


def chooser(scope: str) -> str:
    return SHARDS[zlib.crc32(scope.encode()) % 2]


def scope_on(shard: str, n: int = 0) -> str:
    return [f"t{i}" for i in range(200) if chooser(f"t{i}") == shard][n]


@pytest.fixture
def sharded(tmp_path: Path) -> Iterator[ShardedStore]:
    with ShardedStore.from_urls({s: f"sqlite:///{tmp_path / s}.db" for s in SHARDS}, shard_chooser=chooser) as store:
        store.create_tables()
        yield store


def keys_in(store: IdempotencyStore) -> list[tuple[str, str]]:
    t = store.tables.records
    with store.engine.connect() as conn:
        return sorted((r.scope, r.idem_key) for r in conn.execute(select(t.c.scope, t.c.idem_key)))


def test_each_key_lands_on_its_scopes_shard(sharded: ShardedStore) -> None:
    for shard in SHARDS:
        scope = scope_on(shard)
        result = sharded.run(scope=scope, operation="op", key="k", request={},
                             effect=lambda conn, shard=shard: conn.engine is sharded.shards[shard].engine)
        assert result.response is True  # the effect got its shard's connection
        assert keys_in(sharded.shards[shard]) == [(scope, "k")]  # type: ignore[arg-type]
    assert sharded.purge() == 0 and set(sharded.stats().shards) == set(SHARDS)
    assert sharded.stats().completed == sum(s.completed for s in sharded.stats().shards.values()) == 2


def test_a_chooser_naming_no_shard_and_a_connection_of_another_shard_are_refused(sharded: ShardedStore) -> None:
    wrong = ShardedStore(sharded.shards, lambda scope: "c")
    with pytest.raises(UnknownShard, match="not one of this store's shards"):
        wrong.run(scope="t1", operation="op", key="k", request={}, effect=lambda c: None)
    a, b = scope_on("a"), scope_on("b")
    with sharded.transaction(scope=a) as conn:
        with pytest.raises(CrossShard):
            sharded.claim(conn, scope=b, operation="op", key="k", request={})
        assert sharded.accept_message(conn, subscriber="s", message_id="m1")  # where the caller's transaction is
    assert sharded.consume(subscriber="s", message_id="m1", scope=b, handler=lambda c: None).duplicate is False


def test_the_wsgi_middleware_routes_each_tenant_to_its_shard(sharded: ShardedStore) -> None:
    werkzeug = pytest.importorskip("werkzeug.test", reason="the [http] extra (werkzeug) is not installed")
    from idem_dialects.http.wsgi import IdempotencyMiddleware

    calls: Counter[str] = Counter()

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        calls[environ["HTTP_X_TENANT"]] += 1
        start_response("201 Created", [("Content-Type", "application/json")])
        return [json.dumps({"n": calls[environ["HTTP_X_TENANT"]]}).encode()]

    for lease in (None, timedelta(seconds=30)):
        policy = IdempotencyPolicy(scope=lambda req: req.header("x-tenant"), lease=lease)
        client = werkzeug.Client(IdempotencyMiddleware(app, sharded, policy))
        for shard in SHARDS:
            tenant = scope_on(shard, 1 if lease else 0)
            headers = {"X-Tenant": tenant, "Idempotency-Key": "k1"}
            first = client.post("/pay", json={"amount": 1}, headers=headers)
            again = client.post("/pay", json={"amount": 1}, headers=headers)
            assert first.status_code == again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
            assert (tenant, "k1") in keys_in(sharded.shards[shard])  # type: ignore[arg-type]
    assert set(calls.values()) == {1}


def test_the_asgi_middleware_and_the_async_store_route_alike(tmp_path: Path) -> None:
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("aiosqlite")
    from idem_dialects import AsyncShardedStore
    from idem_dialects.http.asgi import IdempotencyMiddleware

    async def main() -> None:
        urls = {s: f"sqlite+aiosqlite:///{tmp_path / s}.db" for s in SHARDS}
        async with AsyncShardedStore.from_urls(urls, shard_chooser=chooser) as store:
            await store.create_tables()
            calls: Counter[str] = Counter()

            async def app(scope: Any, receive: Any, send: Any) -> None:
                tenant = dict(scope["headers"])[b"x-tenant"].decode()
                calls[tenant] += 1
                await send({"type": "http.response.start", "status": 200, "headers": []})
                await send({"type": "http.response.body", "body": tenant.encode()})

            policy = IdempotencyPolicy(scope=lambda req: req.header("x-tenant"))
            transport = httpx.ASGITransport(app=IdempotencyMiddleware(app, store, policy))
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                for shard in SHARDS:
                    headers = {"X-Tenant": scope_on(shard), "Idempotency-Key": "k"}
                    for _ in range(2):
                        resp = await client.post("/pay", json={}, headers=headers)
                        assert resp.text == scope_on(shard)
            assert set(calls.values()) == {1}
            stats = await store.stats()
            assert {s: stats.shards[s].completed for s in SHARDS} == {"a": 1, "b": 1}

    asyncio.run(main())


# --- one shard's server killed under load --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def two_servers() -> Iterator[dict[str, Any]]:
    from idem_dialects.engines.local import unprivileged_user
    from idem_dialects.engines.pgserver import PgServer, bindir

    try:
        binaries, user = bindir(), unprivileged_user("postgres")
    except Unavailable as exc:
        pytest.skip(f"no private PostgreSQL servers: {exc}")
    pytest.importorskip("psycopg")
    from idem_dialects.engines.local import free_ports

    root = Path(tempfile.mkdtemp(prefix="idem-shards-"))
    root.chmod(0o755)  # the servers run as the postgres user
    servers = {s: PgServer(port, binaries, user, datadir=root / s / "data")
               for s, port in zip(SHARDS, free_ports(2), strict=True)}
    try:
        for shard, server in servers.items():
            (root / shard).mkdir()
            server.start()
        yield servers
    finally:
        for server in servers.values():
            if server.proc is not None and server.proc.poll() is None:
                server.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_a_shards_server_killed_under_load_stops_only_its_keys(two_servers: dict[str, Any]) -> None:
    """8 threads (4 per shard) run first-time keys; shard b's postmaster is SIGKILLed once both shards complete keys
    and started again (crash recovery) once its callers saw the outage and shard a completed keys meanwhile. Shard
    a's keys: 0 errors, and they keep completing during b's outage. Then every key ever sent is re-sent: one record
    and one effect per key on each shard, and every acknowledged response replays unchanged (nothing lost, nothing
    doubled)."""
    urls = {s: f"postgresql+psycopg://postgres@127.0.0.1:{two_servers[s].port}/postgres" for s in SHARDS}
    effects = Table("fx", MetaData(), Column("id", String(64), primary_key=True), Column("k", String(64)))
    with ShardedStore.from_urls(urls, shard_chooser=chooser, retry=RetryPolicy(total=2.0),
                                pool_pre_ping=True) as store:
        store.create_tables()
        for shard in SHARDS:
            with store.shards[shard].engine.begin() as conn:  # type: ignore[attr-defined]
                effects.create(conn, checkfirst=True)
        acked: dict[tuple[str, str], Any] = {}
        sent: set[tuple[str, str]] = set()
        errors: dict[str, Counter[str]] = {s: Counter() for s in SHARDS}
        progress: dict[str, list[float]] = {s: [] for s in SHARDS}
        lock = threading.Lock()
        stop = threading.Event()

        def effect(scope: str, key: str) -> Any:
            def write(conn: Connection) -> str:
                conn.execute(insert(effects).values(id=f"{scope}|{key}|{time.monotonic_ns()}", k=f"{scope}|{key}"))
                return f"{scope}|{key}"
            return write

        def worker(shard: str, scope: str) -> None:
            n = 0
            while not stop.is_set():
                key = f"k{n}"
                n += 1
                with lock:
                    sent.add((scope, key))
                try:
                    result = store.run(scope=scope, operation="pay:v1", key=key, request={}, effect=effect(scope, key))
                except (RetriesExhausted, TransientError) as exc:
                    with lock:
                        errors[shard][type(exc).__name__] += 1
                    continue
                with lock:
                    acked[scope, key] = result.response
                    progress[shard].append(time.monotonic())

        threads = [threading.Thread(target=worker, args=(s, scope_on(s, i))) for s in SHARDS for i in range(4)]
        for thread in threads:
            thread.start()
        # The order the check needs, made rather than timed: both shards under load, then b killed until its callers
        # have seen the outage and a's have completed keys meanwhile, then b back until its callers complete again.
        wait_for(lambda: all(len(progress[s]) >= 5 for s in SHARDS), 60, "both shards completing keys")
        killed_at = time.monotonic()
        two_servers["b"].kill()
        wait_for(lambda: sum(errors["b"].values()) > 0 and sum(t > killed_at for t in progress["a"]) > 10, 60,
                 "shard b's callers to see the outage while shard a's complete keys")
        two_servers["b"].run()
        restarted_at = time.monotonic()
        wait_for(lambda: sum(t > restarted_at for t in progress["b"]) >= 5, 60, "shard b completing keys again")
        stop.set()
        for thread in threads:
            thread.join()

        assert errors["a"] == Counter(), f"shard a saw errors during shard b's outage: {dict(errors['a'])}"
        during = [t for t in progress["a"] if killed_at < t < restarted_at]
        assert len(during) > 10, "shard a completed (almost) no key while shard b was down"
        assert sum(errors["b"].values()) > 0, "shard b's outage was not seen: the test proved nothing"
        for scope, key in sorted(sent):  # every key re-sent after the restart, as clients do after an error
            result = store.run(scope=scope, operation="pay:v1", key=key, request={}, effect=effect(scope, key))
            if (scope, key) in acked:
                assert result.response == acked[scope, key] and result.replayed  # nothing lost
        for shard in SHARDS:
            mine = {k for k in sent if chooser(k[0]) == shard}
            assert keys_in(store.shards[shard]) == sorted(mine)  # type: ignore[arg-type]
            with store.shards[shard].engine.connect() as conn:  # type: ignore[attr-defined]
                per_key = dict(conn.execute(select(effects.c.k, func.count()).group_by(effects.c.k)).all())
                conn.execute(text("SELECT 1"))
            assert per_key == {f"{s}|{k}": 1 for s, k in mine}  # nothing doubled
        print(f"shard a: {len(during)} keys acknowledged during shard b's {restarted_at - killed_at:.1f} s outage,"
              f" 0 errors; shard b: {dict(errors['b'])}; {len(sent)} keys, {len(acked)} acknowledged before re-sending")


def test_a_consumer_records_each_message_on_its_scopes_shard(sharded: ShardedStore) -> None:
    from idem_dialects import Disposition
    from idem_dialects.consumers import ConsumerBase

    consumer = ConsumerBase(subscriber="ledger", on_mismatch=Disposition.DEAD_LETTER, max_deliveries=3,
                            retry_delay=0.0, compare_payload=True, scope=lambda message: message["tenant"])
    for shard in SHARDS:
        message = {"tenant": scope_on(shard), "id": f"m-{shard}"}

        def handler(conn: Connection, shard: str = shard) -> None:
            assert conn.engine is sharded.shards[shard].engine  # type: ignore[attr-defined]

        for _ in range(2):
            assert consumer.process(sharded, message["id"], message, handler, 1, message) is Disposition.ACK
        table = sharded.shards[shard].tables.messages
        with sharded.shards[shard].engine.connect() as conn:  # type: ignore[attr-defined]
            assert [r.message_id for r in conn.execute(select(table.c.message_id))] == [f"m-{shard}"]
    assert (consumer.counts["processed"], consumer.counts["duplicate"]) == (2, 2)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_from_urls_disposes_of_what_it_made_when_a_later_url_fails(tmp_path: Path, asynchronous: bool) -> None:
    """Both sharded stores' `from_urls` (one implementation): a URL that cannot be used leaves no engine behind
    from the URLs before it."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from idem_dialects import AsyncShardedStore, UnsupportedEngine

    disposed: list[str] = []

    def seen(engine: Engine) -> None:
        disposed.append(str(engine.url))

    first = f"sqlite{'+aiosqlite' if asynchronous else ''}:///{tmp_path / 'a.db'}"
    kind = AsyncShardedStore if asynchronous else ShardedStore
    event.listen(Engine, "engine_disposed", seen)
    try:
        with pytest.raises(UnsupportedEngine):
            kind.from_urls({"a": first, "b": "nosuchengine://db"}, shard_chooser=lambda scope: "a")
    finally:
        event.remove(Engine, "engine_disposed", seen)
    assert disposed == [first]
