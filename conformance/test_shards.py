"""Checks: scale-out by scope. Two shards on the engine's server: two databases (the engine's own and one the check
creates, where the engine's provisioning says how), each reached through a loopback proxy of its own, with tables of
their own prefix; a shard chooser by scope. Every
key's record and effect land on its scope's shard and nowhere else, one transaction never spans two shards, and an
outage of one shard (its proxy cutting every link and refusing connections, as a crash or a failover looks to a
client) leaves the other shard's keys completing without an error; once it is back, nothing is lost or doubled."""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import create_engine, func, select
from sqlalchemy.engine import URL, Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from idem_dialects import Claimed, CrossShard, IdempotencyStore, RetryPolicy, ShardedStore, dialects
from idem_dialects.dialects.classify import NO_PRIVILEGE
from idem_dialects.dialects.options import driver_url
from idem_dialects.engines import provisioning
from idem_dialects.outbox import Command
from idem_dialects.relay import AsyncRelay, Relay
from idem_dialects.steps import Begin, Flow, transaction

from .faultproxy import PROTOCOLS, FaultProxy, wire_protocol
from .plugin import EngineUnderTest, unique_prefix
from .support import Effects

Observe = Callable[[str, object], None]
SHARDS = ("a", "b")


def by_crc32(scope: str) -> str:
    """The shard chooser of these checks (and of the docs): a stable hash of the scope, never Python's `hash`."""
    return SHARDS[zlib.crc32(scope.encode("utf-8")) % len(SHARDS)]


def scopes_of(shard: str, n: int) -> list[str]:
    found = [f"tenant:{i}" for i in range(10 * n) if by_crc32(f"tenant:{i}") == shard]
    return found[:n]


@dataclass
class Shards:
    store: ShardedStore
    proxies: dict[str, FaultProxy]
    effects: dict[str, Effects]
    urls: dict[str, URL]
    prefixes: dict[str, str]
    databases: dict[str, str | None]

    def records(self, shard: str) -> list[tuple[str, str]]:
        own = self.store.shards[shard]
        table = own.tables.records
        with own.engine.connect() as conn:
            return [(r.scope, r.idem_key) for r in conn.execute(select(table.c.scope, table.c.idem_key))]

    def effect_for(self, scope: str, key: str) -> Callable[[Connection], Any]:
        shard = self.store.shard_for(scope)

        def effect(conn: Connection) -> Any:
            # The connection is the shard's own: the record and the effect commit in one transaction, on one database.
            assert conn.engine is self.store.shards[shard].engine, "the effect got another shard's connection"
            return {"effect": self.effects[shard].apply(conn, f"{scope}|{key}"), "shard": shard}

        return effect


@contextmanager
def second_database(engine: EngineUnderTest) -> Iterator[str | None]:
    """A database of its own on the engine's server for shard b (dropped after), where the engine's provisioning says
    how to make one; else the same database (the shards then differ by table prefix only)."""
    provision = provisioning(engine.backend)
    if provision.create_database_sql is None or provision.drop_database_sql is None:
        yield engine.server.url.database
        return
    name = f"idem_shard_{secrets.token_hex(4)}"
    # A plain engine: the URL's own options (writers=, pooler=, ...) are the store's to consume.
    admin = create_engine(driver_url(engine.server.url), isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        try:
            with admin.connect() as conn:
                conn.exec_driver_sql(provision.create_database_sql.format(name=name))
        except DBAPIError as exc:
            errors = dialects.load(engine.backend)(admin).errors
            if errors.config_problem(exc, (), None) != NO_PRIVILEGE:
                raise
            pytest.skip(f"the URL's role may not create a database (shard b needs one of its own), refused with"
                        f" {type(exc.orig).__name__}: grant it the privilege to create databases to run this check")
        try:
            yield name
        finally:
            with admin.connect() as conn:
                conn.exec_driver_sql(provision.drop_database_sql.format(name=name))
    finally:
        admin.dispose()


@contextmanager
def two_shards(engine: EngineUnderTest, retry: RetryPolicy | None = None) -> Iterator[Shards]:
    if provisioning(engine.backend).embedded or wire_protocol(engine.server.url) is None:
        pytest.skip(f"no two shards here: the checks reach each shard through a proxy of the "
                    f"{' or '.join(PROTOCOLS)} wire protocol")
    with ExitStack() as stack:
        databases = {"a": engine.server.url.database, "b": stack.enter_context(second_database(engine))}
        proxies = {s: stack.enter_context(FaultProxy(engine.server.url)) for s in SHARDS}
        urls = {s: proxies[s].proxied_url().set(database=databases[s]) for s in SHARDS}
        prefixes = {s: unique_prefix() for s in SHARDS}
        stores = {s: IdempotencyStore.from_url(urls[s], table_prefix=prefixes[s], retry=retry) for s in SHARDS}
        sharded = ShardedStore(stores, by_crc32)
        for store in stores.values():
            stack.callback(store.close)
        sharded.create_tables()
        stack.callback(sharded.drop_tables)
        effects = {s: Effects(stores[s]) for s in SHARDS}
        for fx in effects.values():
            fx.create()
            stack.callback(fx.drop)
        yield Shards(sharded, proxies, effects, urls, prefixes, databases)


@pytest.mark.idem_api("sync")
def test_keys_stay_on_their_shard(idem_engine: EngineUnderTest, idem_observe: Observe) -> None:
    """Every key's record and effect land on the shard its scope's chooser names and nowhere else, replays come back
    from there, and a transaction or a connection of one shard refuses a key of the other."""
    with two_shards(idem_engine) as shards:
        store = shards.store
        keys = [(scope, f"k{i}") for shard in SHARDS for scope in scopes_of(shard, 6) for i in range(3)]
        first = {k: store.run(scope=k[0], operation="pay:v1", key=k[1], request={"n": 1},
                              effect=shards.effect_for(*k)) for k in keys}
        again = {k: store.run(scope=k[0], operation="pay:v1", key=k[1], request={"n": 1},
                              effect=shards.effect_for(*k)) for k in keys}
        assert all(again[k].replayed and again[k].response == first[k].response for k in keys)
        for shard in SHARDS:
            expected = sorted(k for k in keys if by_crc32(k[0]) == shard)
            assert sorted(shards.records(shard)) == expected
            assert shards.effects[shard].per_key() == Counter(f"{s}|{k}" for s, k in expected)
            assert all(first[k].response["shard"] == shard for k in expected)
        idem_observe("keys on their shard", f"{len(keys)} of {len(keys)}")

        (a, b) = scopes_of("a", 1)[0], scopes_of("b", 1)[0]
        with pytest.raises(CrossShard), store.transaction(scope=a) as conn:
            store.claim(conn, scope=b, operation="pay:v1", key="x", request={})
        req_a = store.claims.request(a, "pay:v1", "both", {})
        req_b = store.claims.request(b, "pay:v1", "both", {})

        def both() -> Flow[Any]:
            yield from store.claims.claim(req_a, fresh=True)
            return (yield from store.claims.claim(req_b))

        with pytest.raises(CrossShard):
            store.drive(transaction(both(), Begin.CLAIM))
        assert ("a", "both") not in {(by_crc32(s), k) for s, k in shards.records("a")}  # rolled back


@pytest.mark.idem_api("sync")
def test_adapter_flows_route_each_transaction_to_its_shard(idem_engine: EngineUnderTest) -> None:
    """The flows adapters build on `claims` (a leased claim that commits alone, the effect outside any transaction,
    then the completion in a transaction of its own) run each transaction on the scope's shard."""
    with two_shards(idem_engine) as shards:
        store = shards.store
        for shard in SHARDS:
            scope = scopes_of(shard, 1)[0]
            req = store.claims.request(scope, "pay:v1", "leased", {}, lease=None)
            claimed = store.drive(transaction(store.claims.claim(req, fresh=True), Begin.CLAIM))
            assert isinstance(claimed, Claimed)
            store.drive(transaction(store.claims.complete(claimed, {"ok": shard}, 201)))
            assert shards.records(shard) == [(scope, "leased")]
            replay = store.run(scope=scope, operation="pay:v1", key="leased", request={}, effect=lambda c: None)
            assert (replay.response, replay.status, replay.replayed) == ({"ok": shard}, 201, True)


def _until(happened: Callable[[], bool], what: str) -> None:
    """Wait for what the workers make happen, however slow the machine (a minute: only a hang reaches it)."""
    deadline = time.monotonic() + 60
    while not happened():
        assert time.monotonic() < deadline, f"no {what} within a minute"
        time.sleep(0.01)


@pytest.mark.idem_api("sync")
def test_one_shard_down_the_others_keys_complete(idem_engine: EngineUnderTest, idem_observe: Observe) -> None:
    """While one shard is down (every link cut, every connection refused, until its callers saw it) the other
    shard's keys keep completing with no error; once it is back every key is re-sent: one record and one effect per
    key on each."""
    with two_shards(idem_engine, retry=RetryPolicy(total=1.0)) as shards:
        store = shards.store
        errors: dict[str, Counter[str]] = {s: Counter() for s in SHARDS}
        done: dict[str, list[tuple[str, str]]] = {s: [] for s in SHARDS}
        lock = threading.Lock()
        stop = threading.Event()

        def worker(shard: str, scope: str) -> None:
            n = 0
            while not stop.is_set():
                key = f"w{n}"
                n += 1
                try:
                    store.run(scope=scope, operation="pay:v1", key=key, request={},
                              effect=shards.effect_for(scope, key))
                    with lock:
                        done[shard].append((scope, key))
                except Exception as exc:  # counted: only the shard that is down may fail
                    with lock:
                        errors[shard][type(exc).__name__] += 1
                        done[shard].append((scope, key))  # re-sent below: it may or may not have committed

        threads = [threading.Thread(target=worker, args=(shard, scope)) for shard in SHARDS
                   for scope in scopes_of(shard, 2)]
        for t in threads:
            t.start()
        # The order the check needs, made rather than timed: keys completing on both shards; b down until its
        # callers saw the outage and a completed keys meanwhile; b back until its keys complete again.
        _until(lambda: all(len(done[s]) >= 3 for s in SHARDS), "both shards completing keys")
        before = {s: len(done[s]) for s in SHARDS}
        shards.proxies["b"].set_down(True)
        _until(lambda: sum(errors["b"].values()) > 0 and len(done["a"]) > before["a"],
               "shard b's callers to see the outage while shard a's keys complete")
        during = {s: len(done[s]) - before[s] for s in SHARDS}
        shards.proxies["b"].set_down(False)
        after = len(done["b"])
        _until(lambda: len(done["b"]) > after + 2, "shard b completing keys again")
        stop.set()
        for t in threads:
            t.join()
        assert errors["a"] == Counter(), f"the shard that stayed up saw errors: {dict(errors['a'])}"
        assert during["a"] > 0, "the shard that stayed up completed no key during the other's outage"
        assert sum(errors["b"].values()) > 0, "the outage was not seen: the check proved nothing"
        for shard in SHARDS:  # every key re-sent, as a client does after an error
            for scope, key in done[shard]:
                store.run(scope=scope, operation="pay:v1", key=key, request={}, effect=shards.effect_for(scope, key))
            keys = sorted(set(done[shard]))
            assert sorted(shards.records(shard)) == keys
            assert set(shards.effects[shard].per_key().values()) == {1}
            assert shards.effects[shard].count() == len(keys)
        idem_observe("keys completed by the shard that stayed up during the outage", during["a"])
        idem_observe("errors on the shard that went down", dict(errors["b"]))


@pytest.mark.idem_api("async")
def test_async_keys_stay_on_their_shard(idem_engine: EngineUnderTest) -> None:
    """AsyncShardedStore: every key's record on its scope's shard, its effect on that shard's AsyncConnection."""
    from idem_dialects import AsyncIdempotencyStore, AsyncShardedStore

    assert idem_engine.driver is not None
    with two_shards(idem_engine) as shards:
        async def main() -> None:
            proxies = shards.proxies
            urls = {s: proxies[s].provision.plaintext_url(idem_engine.url, "127.0.0.1", proxies[s].port)
                    .set(database=shards.databases[s]) for s in SHARDS}  # the async driver's own "no TLS"
            stores = {s: AsyncIdempotencyStore.from_url(urls[s], table_prefix=shards.prefixes[s]) for s in SHARDS}
            async with AsyncShardedStore(stores, by_crc32) as store:
                for s in stores.values():
                    s.executor.owns_engine = True  # closed with the sharded store: this check made them
                store._owned = True
                for shard in SHARDS:
                    for scope in scopes_of(shard, 3):
                        async def effect(conn: Any, shard: str = shard) -> str:
                            assert conn.engine is stores[shard].engine
                            return shard

                        result = await store.run(scope=scope, operation="pay:v1", key="k", request={},
                                                 effect=effect)
                        assert result.response == shard

        asyncio.run(main())
        for shard in SHARDS:
            assert sorted(shards.records(shard)) == sorted((s, "k") for s in scopes_of(shard, 3))


class _Collect:
    """A publisher that keeps what it was given (a relay's destination)."""

    def __init__(self) -> None:
        self.seen: list[Command] = []
        self.lock = threading.Lock()

    def publish(self, command: Command) -> None:
        with self.lock:
            self.seen.append(command)


def _rows(shards: Shards, shard: str, table: str) -> int:
    own = shards.store.shards[shard]
    with own.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(getattr(own.tables, table))).scalar_one())


def _features_through_shards(shards: Shards, run: Callable[[str, str], Any], consume: Callable[[str, str], Any],
                             relay_rounds: Callable[[], int], stats: Callable[[], Any],
                             purge: Callable[[], int], published: _Collect) -> None:
    """The same script through a sync or an async sharded store: commands, messages, stats and purge on each
    scope's shard, and every shard's commands published once by one relay of the sharded store."""
    written = {shard: [run(scope, f"c{i}") for scope in scopes_of(shard, 2) for i in range(2)] for shard in SHARDS}
    for shard in SHARDS:
        assert _rows(shards, shard, "outbox") == len(written[shard]) == 4, "a command landed off its scope's shard"
    for _ in range(2):  # a redelivery: the handler does not run again
        for shard in SHARDS:
            consume(scopes_of(shard, 1)[0], f"m-{shard}")
    for shard in SHARDS:
        assert _rows(shards, shard, "messages") == 1
    assert relay_rounds() == 8 and relay_rounds() == 0
    ids = [c.id for c in published.seen]
    assert sorted(ids) == sorted(i for shard in SHARDS for i in written[shard]) and len(set(ids)) == len(ids)
    now = stats()
    assert {s: (now.shards[s].completed, now.shards[s].messages) for s in SHARDS} == {s: (4, 1) for s in SHARDS}
    assert (now.completed, now.messages) == (8, 2)
    assert purge() == 2 * (4 + 1 + 4)  # each shard: its records, its message, its published commands
    after = stats()
    assert (after.completed, after.messages) == (0, 0)
    for shard in SHARDS:
        assert shards.effects[shard].count() == 4 + 1  # the runs' effects and the message's handler, once each


@pytest.mark.idem_api("sync")
def test_outbox_consume_stats_and_purge_through_shards(idem_engine: EngineUnderTest) -> None:
    """ShardedStore: `add_command` in an effect writes the command on its scope's shard, a relay of the sharded store
    publishes every shard's commands exactly once, `consume` records a message on its scope's shard, and `stats` and
    `purge` cover every shard."""
    with two_shards(idem_engine) as shards:
        store, published = shards.store, _Collect()
        relay = Relay(store, {"*": published}, stats_every=0)

        def run(scope: str, key: str) -> str:
            def effect(conn: Connection) -> str:
                shards.effect_for(scope, key)(conn)
                return store.add_command(conn, "orders", {"key": key})

            return str(store.run(scope=scope, operation="order:v1", key=key, request={}, effect=effect).response)

        def consume(scope: str, message_id: str) -> None:
            store.consume(subscriber="projection", message_id=message_id, scope=scope,
                          handler=lambda conn: shards.effects[store.shard_for(scope)].apply(conn, message_id))

        def rounds() -> int:
            total = 0
            while n := relay.run_once():
                total += n
            return total

        _features_through_shards(shards, run, consume, rounds, store.stats,
                                 lambda: store.purge(older_than=timedelta(0)), published)


@pytest.mark.idem_api("async")
def test_async_outbox_consume_stats_and_purge_through_shards(idem_engine: EngineUnderTest) -> None:
    """AsyncShardedStore: what the sync check proves, through the async store and an AsyncRelay."""
    from idem_dialects import AsyncIdempotencyStore, AsyncShardedStore

    with two_shards(idem_engine) as shards:
        loop = asyncio.new_event_loop()
        proxies = shards.proxies
        urls = {s: proxies[s].provision.plaintext_url(idem_engine.url, "127.0.0.1", proxies[s].port)
                .set(database=shards.databases[s]) for s in SHARDS}  # the async driver's own "no TLS"
        stores = {s: AsyncIdempotencyStore.from_url(urls[s], table_prefix=shards.prefixes[s]) for s in SHARDS}
        store = AsyncShardedStore(stores, by_crc32)
        published = _Collect()
        relay = AsyncRelay(store, {"*": published}, stats_every=0)

        def run(scope: str, key: str) -> str:
            async def effect(conn: Any) -> str:
                await conn.run_sync(shards.effects[store.shard_for(scope)].apply, f"{scope}|{key}")
                return await store.add_command(conn, "orders", {"key": key})

            result = loop.run_until_complete(store.run(scope=scope, operation="order:v1", key=key, request={},
                                                       effect=effect))
            return str(result.response)

        def consume(scope: str, message_id: str) -> None:
            async def handler(conn: Any) -> None:
                await conn.run_sync(shards.effects[store.shard_for(scope)].apply, message_id)

            loop.run_until_complete(store.consume(subscriber="projection", message_id=message_id, scope=scope,
                                                  handler=handler))

        def rounds() -> int:
            total = 0
            while n := loop.run_until_complete(relay.run_once()):
                total += n
            return total

        try:
            _features_through_shards(shards, run, consume, rounds, lambda: loop.run_until_complete(store.stats()),
                                     lambda: loop.run_until_complete(store.purge(older_than=timedelta(0))),
                                     published)
        finally:
            for own in stores.values():
                loop.run_until_complete(own.close())
            loop.close()
