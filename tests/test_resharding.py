"""Changing a sharded store's placement without running a key twice: the default chooser (rendezvous hashing) moves
about 1/(N+1) of the scopes when a shard is added, a `Move` routes a moving scope's keys through its old shard's
records, `move_records` copies them to the new shard, and nothing runs again or is lost after the store routes by
the new placement alone. Each shard's retry budget applies on every path, and RetriesExhausted names the shard."""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import sqlite3
import threading
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, MetaData, String, Table, create_engine, insert, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

from idem_dialects import IdempotencyStore, RequestInFlight, RetriesExhausted, RetryPolicy, ShardedStore
from idem_dialects.claims import MOVED
from idem_dialects.consumers import ConsumerBase
from idem_dialects.engines import provisioning, started
from idem_dialects.errors import InvalidURLOption
from idem_dialects.http import IdempotencyPolicy
from idem_dialects.outcomes import Disposition
from idem_dialects.sharding import Move, Pinned, Rendezvous, moved_share

SCOPES = [f"tenant:{i}" for i in range(1000)]
BEFORE, AFTER = Rendezvous(["a", "b"]), Rendezvous(["a", "b", "c"])


def test_rendezvous_moves_about_one_in_n_plus_one_scopes_and_only_to_the_new_shard() -> None:
    share = moved_share(BEFORE, AFTER, SCOPES)
    assert 0.25 <= share <= 0.40  # 1/3 expected; crc32 % N moves about 2/3
    assert all(AFTER(s) == "c" for s in SCOPES if BEFORE(s) != AFTER(s))
    assert moved_share(lambda s: "ab"[zlib.crc32(s.encode()) % 2], lambda s: "abc"[zlib.crc32(s.encode()) % 3],
                       SCOPES) > 0.6
    assert Counter(map(BEFORE, SCOPES))["a"] in range(430, 571)  # balanced
    assert Rendezvous(["b", "a"])("tenant:1") == BEFORE("tenant:1")  # the order of the ids does not matter
    pinned = Pinned({"tenant:1": "c"}, AFTER)
    assert pinned("tenant:1") == "c" and pinned("tenant:2") == AFTER("tenant:2")


def scope_moving() -> str:
    return next(s for s in SCOPES if BEFORE(s) == "a" and AFTER(s) == "c")


@pytest.fixture
def shards(tmp_path: Path) -> Iterator[dict[str, IdempotencyStore]]:
    stores = {s: IdempotencyStore.from_url(f"sqlite:///{tmp_path / s}.db") for s in "abc"}
    for store in stores.values():
        store.create_tables()
    yield stores
    for store in stores.values():
        store.close()


def records(store: IdempotencyStore) -> dict[tuple[str, str], str]:
    t = store.tables.records
    with store.engine.connect() as conn:
        return {(r.scope, r.idem_key): r.claim_token for r in conn.execute(select(t.c.scope, t.c.idem_key,
                                                                                 t.c.claim_token))}


def test_a_move_answers_old_keys_from_the_old_shard_and_runs_new_ones_on_the_new(
        shards: dict[str, IdempotencyStore]) -> None:
    scope = scope_moving()
    old = ShardedStore({s: shards[s] for s in "ab"}, BEFORE)
    moving = ShardedStore(shards, Move(BEFORE, AFTER))
    new = ShardedStore(shards, AFTER)
    runs: Counter[str] = Counter()

    def run(store: ShardedStore, key: str, **kw: Any) -> Any:
        def effect(conn: Any) -> str:
            runs[key] += 1
            return f"{key} on {conn.engine.url.database[-4:]}"
        return store.run(scope=scope, operation="pay", key=key, request={"k": key}, effect=effect, **kw)

    assert run(old, "k1").response == "k1 on a.db"
    assert run(moving, "k1").replayed and run(moving, "k1").response == "k1 on a.db"  # from where it is
    assert run(moving, "k2").response == "k2 on c.db"  # a new key on the new shard, a mark left on the old
    assert records(shards["a"])[(scope, "k2")] == MOVED
    with pytest.raises(RequestInFlight):  # a process still on the old placement never runs it again
        run(old, "k2")
    assert run(moving, "k2").replayed
    # A leased claim live on the old shard is in flight; once abandoned it is marked moved and runs on the new one.
    with shards["a"].transaction() as conn:
        held = shards["a"].claim(conn, scope=scope, operation="pay", key="k3", request={"k": "k3"},
                                 lease=timedelta(seconds=60))
    with pytest.raises(RequestInFlight):
        run(moving, "k3")
    with shards["a"].engine.begin() as conn:
        conn.execute(shards["a"].tables.records.update().values(locked_until=shards["a"].tables.records.c.created_at))
    assert run(moving, "k3").response == "k3 on c.db" and records(shards["a"])[(scope, "k3")] == MOVED
    # The step-by-step API looks at the old shard too.
    with moving.transaction(scope=scope) as conn:
        assert moving.claim(conn, scope=scope, operation="pay", key="k1", request={"k": "k1"}).response == "k1 on a.db"
    # A message its old shard recorded is a duplicate on the new one.
    assert old.consume(subscriber="s", message_id="m1", scope=scope, handler=lambda c: "once").value == "once"
    assert moving.consume(subscriber="s", message_id="m1", scope=scope, handler=lambda c: 1 / 0).duplicate

    report = moving.move_records(wait=timedelta(0))
    assert report.done and (report.copied, report.marked, report.in_flight) == (1, 0, 0), report
    assert report.messages == 1 and held.token not in records(shards["c"]).values()
    assert moving.move_records().copied == 0  # again: nothing new
    for key in ("k1", "k2", "k3"):
        assert run(new, key).replayed
    assert new.consume(subscriber="s", message_id="m1", scope=scope, handler=lambda c: 1 / 0).duplicate
    assert runs == {"k1": 1, "k2": 1, "k3": 1}


def test_move_records_waits_for_live_claims_and_is_refused_without_a_move(
        shards: dict[str, IdempotencyStore]) -> None:
    scope = scope_moving()
    with pytest.raises(Exception, match="Move"):
        ShardedStore(shards, AFTER).move_records()
    with shards["a"].transaction() as conn:
        held = shards["a"].claim(conn, scope=scope, operation="pay", key="k", request={},
                                 lease=timedelta(seconds=60))
    moving = ShardedStore(shards, Move(BEFORE, AFTER))
    report = moving.move_records(wait=timedelta(seconds=0.2), poll=0.1)
    assert not report.done and report.in_flight == 1 and report.rounds == 3
    with shards["a"].transaction() as conn:
        shards["a"].complete(conn, held, {"paid": True})  # its holder completes it where it claimed it
    report = moving.move_records(wait=timedelta(0))
    assert report.done and report.copied == 1
    assert ShardedStore(shards, AFTER).run(scope=scope, operation="pay", key="k", request={},
                                           effect=lambda c: 1 / 0).response == {"paid": True}


def test_the_wsgi_middleware_through_a_move(shards: dict[str, IdempotencyStore]) -> None:
    werkzeug = pytest.importorskip("werkzeug.test", reason="the [http] extra (werkzeug) is not installed")
    from idem_dialects.http.wsgi import IdempotencyMiddleware

    calls: Counter[str] = Counter()

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        calls[environ["HTTP_IDEMPOTENCY_KEY"]] += 1
        start_response("201 Created", [("Content-Type", "application/json")])
        return [json.dumps({"n": calls[environ["HTTP_IDEMPOTENCY_KEY"]]}).encode()]

    scope = scope_moving()
    for lease in (None, timedelta(seconds=30)):
        policy = IdempotencyPolicy(scope=lambda req: req.header("x-tenant"), lease=lease)
        old, moving, new = (werkzeug.Client(IdempotencyMiddleware(app, store, policy)) for store in (
            ShardedStore({s: shards[s] for s in "ab"}, BEFORE), ShardedStore(shards, Move(BEFORE, AFTER)),
            ShardedStore(shards, AFTER)))

        def post(client: Any, key: str, lease: Any = lease) -> Any:
            return client.post("/pay", json={}, headers={"X-Tenant": scope, "Idempotency-Key": f"{lease}-{key}"})

        def replayed(client: Any, key: str) -> bool:
            resp = post(client, key)
            return resp.status_code == 201 and resp.headers.get("Idempotent-Replayed") == "true"

        assert post(old, "k0").status_code == post(moving, "k1").status_code == 201
        assert replayed(old, "k0") and replayed(moving, "k0") and replayed(moving, "k1")
        assert post(old, "k1").status_code == 409  # the old placement never runs a key the move placed
        ShardedStore(shards, Move(BEFORE, AFTER)).move_records(wait=timedelta(0))
        assert post(new, "k2").status_code == 201
        assert all(replayed(client, key) for client in (moving, new) for key in ("k0", "k1", "k2"))
    assert set(calls.values()) == {1} and len(calls) == 6


def test_each_shards_budget_applies_and_retries_exhausted_names_the_shard(tmp_path: Path) -> None:
    """Shard b stays locked by another writer; its budget is 2 attempts, a's 5."""
    stores = {s: IdempotencyStore.from_url(f"sqlite:///{tmp_path / s}.db", connect_args={"timeout": 0.01},
                                           retry=RetryPolicy(total=30, max_attempts=n))
              for s, n in (("a", 5), ("b", 2))}
    for one in stores.values():
        one.create_tables()
    lock = sqlite3.connect(tmp_path / "b.db", isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    store = ShardedStore(stores, lambda scope: scope[0])
    with pytest.raises(RetriesExhausted) as raised:
        store.run(scope="b1", operation="op", key="k", request={}, effect=lambda c: None)
    assert raised.value.shard == "b" and raised.value.attempts == 2 and str(raised.value).startswith("shard 'b': ")
    with pytest.raises(RetriesExhausted) as raised:
        store.consume(subscriber="s", message_id="m", scope="b1", handler=lambda c: None)
    assert raised.value.shard == "b" and raised.value.attempts == 2
    consumer = ConsumerBase(subscriber="s", on_mismatch=Disposition.DEAD_LETTER, max_deliveries=None, retry_delay=0,
                            compare_payload=False, scope=lambda message: message)
    before = sum(stores["b"].retries.values()), sum(stores["a"].retries.values())
    assert consumer.process(store, "m2", {}, lambda c: None, 1, message="b1") is Disposition.RETRY
    assert (sum(stores["b"].retries.values()), sum(stores["a"].retries.values())) == (before[0] + 1, before[1])
    werkzeug = pytest.importorskip("werkzeug.test", reason="the [http] extra (werkzeug) is not installed")
    from idem_dialects.http.wsgi import IdempotencyMiddleware

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [])
        return [b"done"]

    for lease in (None, timedelta(seconds=30)):
        policy = IdempotencyPolicy(scope=lambda req: req.header("x-tenant"), lease=lease)
        client = werkzeug.Client(IdempotencyMiddleware(app, store, policy))
        resp = client.post("/pay", json={}, headers={"X-Tenant": "b1", "Idempotency-Key": f"k{lease}"})
        assert resp.status_code == 503 and "through 2 attempts" in resp.get_data(as_text=True)
        assert client.post("/pay", json={}, headers={"X-Tenant": "a1", "Idempotency-Key": f"k{lease}"}).status_code \
            == 200
    lock.close()
    for one in stores.values():
        one.close()


# --- 2 -> 3 shards on live servers, under load ------------------------------------------------------------------------

SERVERS = {"postgresql": "postgresql+psycopg://postgres@127.0.0.1:5432/{db}",
           "mariadb": "mariadb+pymysql://root@127.0.0.1:3306/{db}"}
FX = Table("rs_fx", MetaData(), Column("id", String(32), primary_key=True), Column("k", String(255), nullable=False))


@contextmanager
def databases(engines: dict[str, str]) -> Iterator[dict[str, str]]:
    """A database of its own per shard on the machine's servers (dropped after), made as the engine's provisioning
    says."""
    if started.refusal():
        pytest.skip(f"needs the machine's servers: {started.refusal()}")
    made: list[tuple[Any, str, str]] = []
    try:
        urls = {}
        for shard, engine in engines.items():
            admin = create_engine(SERVERS[engine].format(db="test" if engine == "mariadb" else "postgres"),
                                  isolation_level="AUTOCOMMIT", poolclass=NullPool)
            provision = provisioning(engine)
            assert provision.create_database_sql and provision.drop_database_sql
            name = f"idem_rs_{secrets.token_hex(4)}_{shard}"
            try:
                with admin.connect() as conn:
                    conn.exec_driver_sql(provision.create_database_sql.format(name=name))
            except OperationalError as exc:
                pytest.skip(f"the {engine} server at {admin.url.host}:{admin.url.port} does not answer: {exc}")
            made.append((admin, name, provision.drop_database_sql))
            urls[shard] = SERVERS[engine].format(db=name)
        yield urls
    finally:
        for admin, name, drop in made:
            with admin.connect() as conn:
                conn.exec_driver_sql(drop.format(name=name))
            admin.dispose()


class Load:
    """8 threads, each sending first-time keys and retries of keys already acknowledged, through whichever store
    its call draws for the phase it is in; then every acknowledged key is sent once more through the last store."""

    def __init__(self, phases: list[tuple[str, ...]], send: Callable[[str, str, str], tuple[str, Any]]) -> None:
        self.phases, self.send = phases, send
        self.phase, self.done = 0, 0
        self.acked: dict[tuple[str, str], Any] = {}
        self.outcomes: Counter[str] = Counter()
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def worker(self, n: int) -> None:
        rng = random.Random(n)
        sent = 0
        while not self.stop.is_set():
            with self.lock:
                kinds = self.phases[self.phase]
                retry = rng.choice(list(self.acked)) if self.acked and rng.random() < 0.5 else None
            scope, key = retry or (rng.choice(LOAD_SCOPES), f"t{n}-{sent}")
            sent += retry is None
            try:
                outcome, response = self.send(rng.choice(kinds), scope, key)
            except Exception as exc:  # any error is a failure of the move
                with self.lock:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            with self.lock:
                self.done += 1
                self.outcomes[f"{'retry' if retry else 'first'} {outcome}"] += 1
                if outcome == "in flight":
                    continue
                if retry is None:
                    assert outcome == "ran", outcome
                    self.acked[scope, key] = response
                elif self.acked[scope, key] != response or outcome != "replayed":
                    self.errors.append(f"{scope}/{key}: {outcome} {response!r}, acked {self.acked[scope, key]!r}")

    def until(self, done: int) -> None:
        while self.done < done and not self.errors:
            time.sleep(0.05)


LOAD_SCOPES = SCOPES[:60]


@pytest.mark.parametrize("api", ["run", "http"])
@pytest.mark.parametrize("engines", [{"a": "postgresql", "b": "postgresql", "c": "postgresql"},
                                     {"a": "postgresql", "b": "mariadb", "c": "mariadb"}],
                         ids=["postgresql", "postgresql+mariadb"])
def test_two_to_three_shards_under_load_runs_no_key_twice(engines: dict[str, str], api: str) -> None:
    """2 -> 3 shards while 8 threads send new keys and retry acknowledged ones: the old placement alone; the rollout
    of the Move (old and moving processes side by side); the Move alone, with `move_records` run meanwhile; the rollout
    of the new placement (moving and new side by side); the new placement alone. Every call is a result (or, for a
    key the move placed that reaches a process still on the old placement, a 409 in flight); every acknowledged
    key replays its response at the end; one effect per key on all shards together."""
    with databases(engines) as urls:
        stores = {s: IdempotencyStore.from_url(url, pool_size=3, max_overflow=5) for s, url in urls.items()}
        try:
            for store in stores.values():
                store.create_tables()
                with store.engine.begin() as conn:
                    FX.create(conn)
            sharded = {"old": ShardedStore({s: stores[s] for s in "ab"}, BEFORE),
                       "moving": ShardedStore(stores, Move(BEFORE, AFTER)), "new": ShardedStore(stores, AFTER)}
            send = _http_sender(sharded) if api == "http" else _run_sender(sharded)
            load = Load([("old",), ("old", "moving"), ("moving",), ("moving", "new"), ("new",)], send)
            threads = [threading.Thread(target=load.worker, args=(n,)) for n in range(8)]
            for thread in threads:
                thread.start()
            try:
                for phase, ops in enumerate((300, 600, 900, 1400, 1700), 1):
                    load.until(ops)
                    if phase == 3:  # the Move everywhere: copy while the threads go on
                        report = sharded["moving"].move_records(wait=timedelta(seconds=60))
                        assert report.done, report
                    with load.lock:
                        load.phase = min(phase, 4)
            finally:
                load.stop.set()
                for thread in threads:
                    thread.join()
            assert load.errors == [], load.errors[:5]
            for (scope, key), response in load.acked.items():  # nothing lost
                assert send("new", scope, key) == ("replayed", response)
            effects: Counter[str] = Counter()
            for store in stores.values():
                with store.engine.connect() as conn:
                    effects.update(k for (k,) in conn.execute(select(FX.c.k)))
            assert effects == Counter(f"{s}/{k}" for s, k in load.acked)  # one effect per key, none without one
            moved = sum(BEFORE(s) != AFTER(s) for s, _ in load.acked)
            assert report.copied > 0 and moved > 0
            print(f"{api} on {engines}: {len(load.acked)} keys, {moved} of a moving scope; {dict(load.outcomes)};"
                  f" move_records: {report}")
        finally:
            for store in stores.values():
                store.close()


def _effect(scope: str, key: str) -> Callable[[Any], Any]:
    def effect(conn: Any) -> dict[str, str]:
        fx = uuid.uuid4().hex
        conn.execute(insert(FX).values(id=fx, k=f"{scope}/{key}"))
        return {"fx": fx}
    return effect


def _run_sender(sharded: dict[str, ShardedStore]) -> Callable[[str, str, str], tuple[str, Any]]:
    def send(kind: str, scope: str, key: str) -> tuple[str, Any]:
        try:
            result = sharded[kind].run(scope=scope, operation="pay", key=key, request={"k": key},
                                       effect=_effect(scope, key))
        except RequestInFlight:
            return "in flight", None
        return ("replayed" if result.replayed else "ran"), result.response
    return send


def _http_sender(sharded: dict[str, ShardedStore]) -> Callable[[str, str, str], tuple[str, Any]]:
    werkzeug = pytest.importorskip("werkzeug.test", reason="the [http] extra (werkzeug) is not installed")
    from idem_dialects.http import current_connection
    from idem_dialects.http.wsgi import IdempotencyMiddleware

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        body = _effect(environ["HTTP_X_TENANT"], environ["HTTP_IDEMPOTENCY_KEY"])(current_connection())
        start_response("201 Created", [("Content-Type", "application/json")])
        return [json.dumps(body).encode()]

    policy = IdempotencyPolicy(scope=lambda req: req.header("x-tenant"))
    apps = {kind: IdempotencyMiddleware(app, store, policy) for kind, store in sharded.items()}

    def send(kind: str, scope: str, key: str) -> tuple[str, Any]:
        resp = werkzeug.Client(apps[kind]).post("/pay", json={"k": key},
                                                headers={"X-Tenant": scope, "Idempotency-Key": key})
        if resp.status_code == 409:
            return "in flight", None
        assert resp.status_code == 201, resp.get_data(as_text=True)
        return ("replayed" if resp.headers.get("Idempotent-Replayed") == "true" else "ran"), resp.get_json()
    return send


def test_the_async_store_moves_alike(tmp_path: Path) -> None:
    pytest.importorskip("aiosqlite", reason="aiosqlite is not installed (pip install 'idem-dialects[aiosqlite]')")
    from idem_dialects import AsyncIdempotencyStore, AsyncShardedStore

    scope = scope_moving()

    async def main() -> None:
        stores = {s: AsyncIdempotencyStore.from_url(f"sqlite+aiosqlite:///{tmp_path / s}.db") for s in "abc"}
        for store in stores.values():
            await store.create_tables()
        old = AsyncShardedStore({s: stores[s] for s in "ab"}, BEFORE)
        moving, new = AsyncShardedStore(stores, Move(BEFORE, AFTER)), AsyncShardedStore(stores, AFTER)
        runs: Counter[str] = Counter()

        async def run(store: AsyncShardedStore, key: str) -> Any:
            async def effect(conn: Any) -> str:
                runs[key] += 1
                return key
            return await store.run(scope=scope, operation="pay", key=key, request={}, effect=effect)

        async def once(conn: Any) -> str:
            return "once"

        await run(old, "k1")
        assert (await run(moving, "k1")).replayed and not (await run(moving, "k2")).replayed
        with pytest.raises(RequestInFlight):
            await run(old, "k2")
        assert (await old.consume(subscriber="s", message_id="m", scope=scope, handler=once)).value == "once"
        assert (await moving.consume(subscriber="s", message_id="m", scope=scope, handler=once)).duplicate
        async with moving.transaction(scope=scope) as conn:
            assert (await moving.claim(conn, scope=scope, operation="pay", key="k1", request={})).response == "k1"
        report = await moving.move_records(wait=timedelta(0))
        assert report.done and report.copied == 1 and report.messages == 1
        assert (await run(new, "k1")).replayed and (await run(new, "k2")).replayed
        assert (await new.consume(subscriber="s", message_id="m", scope=scope, handler=once)).duplicate
        assert runs == {"k1": 1, "k2": 1}
        for store in stores.values():
            await store.close()

    asyncio.run(main())


def test_purge_portable_deletes_by_key_on_postgresql() -> None:
    """`?purge=portable` (the Citus recipe's purge) deletes by primary key, never the ctid statement, and only what is
    past retention; a wrong value is refused before any connection."""
    statements: list[str] = []
    with databases({"a": "postgresql"}) as urls:
        store = IdempotencyStore.from_url(urls["a"] + "?purge=portable", table_prefix="pp_",
                                          statement_hook=lambda sql, done: statements.append(sql))
        try:
            store.create_tables()
            for n in range(5):
                store.run(scope="s", operation="op", key=f"k{n}", request={}, effect=lambda conn: None)
            assert store.purge(older_than=timedelta(days=1)) == 0
            assert store.purge(older_than=timedelta(0), batch_size=2) == 5
            assert not any("ctid" in sql for sql in statements) and any("DELETE" in sql for sql in statements)
        finally:
            store.drop_tables()
            store.close()
    with pytest.raises(InvalidURLOption, match="purge"):
        IdempotencyStore.from_url("postgresql+psycopg://u@127.0.0.1/db?purge=fast")
