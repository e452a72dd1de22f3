"""Retention without DELETE storms: generations dropped whole on PostgreSQL and MariaDB (a claim reads the previous
generation before it inserts, a rotation carries claims not completed forward), `stats` from the engine's estimates
on large tables, and MariaDB's row-by-row purge at READ COMMITTED."""

from __future__ import annotations

import secrets
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import text

from idem_dialects import ConfigurationError, IdempotencyStore, RequestMismatch
from idem_dialects import retention as retention_module
from idem_dialects.dialects.maintenance import Maintenance
from idem_dialects.engines import Server
from idem_dialects.outcomes import Claimed
from idem_dialects.steps import Begin


@pytest.fixture
def store(db_server: Server) -> Iterator[IdempotencyStore]:
    made = IdempotencyStore.from_url(db_server.url, table_prefix=f"g{secrets.token_hex(3)}_")
    made.create_tables(generations=True)
    yield made
    made.drop_tables()
    made.close()


def count(store: IdempotencyStore, table: str) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


def test_a_record_in_the_previous_generation_replays_and_mismatches(store: IdempotencyStore) -> None:
    calls: list[int] = []
    store.run(scope="a", operation="op", key="k", request={"x": 1}, effect=lambda c: calls.append(1) or {"v": 1})
    assert store.purge() == 0  # the previous generation was empty: the current one becomes it, nothing dropped
    assert count(store, store.tables.previous.name) == 1 and count(store, store.tables.records.name) == 0
    again = store.run(scope="a", operation="op", key="k", request={"x": 1}, effect=lambda c: calls.append(2))
    assert (again.response, again.replayed, calls) == ({"v": 1}, True, [1])
    with pytest.raises(RequestMismatch):
        store.run(scope="a", operation="op", key="k", request={"x": 2}, effect=lambda c: calls.append(3))
    assert count(store, store.tables.records.name) == 0  # a replay from the previous generation writes nothing


def test_a_generation_is_dropped_only_once_all_of_it_is_past_retention(store: IdempotencyStore) -> None:
    store.run(scope="a", operation="op", key="old", request={}, effect=lambda c: 1)
    store.purge(older_than=timedelta(seconds=1))  # rotate: "old" is now in the previous generation
    store.run(scope="a", operation="op", key="new", request={}, effect=lambda c: 2)
    assert store.purge(older_than=timedelta(hours=1)) == 0  # "old" is within the hour: nothing dropped
    assert count(store, store.tables.previous.name) == 1
    time.sleep(1.1)
    assert store.purge(older_than=timedelta(seconds=1)) == 1  # "old" dropped whole; "new" became the previous one
    assert count(store, store.tables.previous.name) == 1
    replay = store.run(scope="a", operation="op", key="new", request={}, effect=lambda c: 3)
    assert (replay.response, replay.replayed) == (2, True)


def test_a_claim_not_completed_is_carried_forward_and_completes(store: IdempotencyStore) -> None:
    with store.transaction() as conn:
        held = store.claim(conn, scope="a", operation="op", key="leased", request={}, lease=timedelta(minutes=5))
    assert isinstance(held, Claimed)
    store.purge(older_than=timedelta(seconds=1))
    store.purge(older_than=timedelta(seconds=1))  # two rotations: it would be gone if it had stayed behind
    with store.transaction() as conn:
        store.complete(conn, held, {"done": True})  # fenced in the current table, where it was carried
    replay = store.run(scope="a", operation="op", key="leased", request={}, effect=lambda c: {"done": False})
    assert (replay.response, replay.replayed) == ({"done": True}, True)


def test_claims_racing_rotations_run_each_effect_once(store: IdempotencyStore) -> None:
    """Threads claim 40 keys twice each while rotations run: every key's effect once, every retry a replay."""
    effects: Counter[str] = Counter()
    lock = threading.Lock()
    errors: list[BaseException] = []
    stop = threading.Event()

    def effect(key: str) -> object:
        def run(conn: object) -> str:
            with lock:
                effects[key] += 1
            return key
        return run

    def claimer(n: int) -> None:
        try:
            for _round in range(2):
                for i in range(40):
                    key = f"k{i}"
                    result = store.run(scope="s", operation="op", key=key, request={}, effect=effect(key))
                    assert result.response == key
        except BaseException as exc:
            errors.append(exc)

    def rotator() -> None:
        while not stop.is_set():
            try:
                store.purge(older_than=timedelta(hours=1))  # within retention: rotates only when due, i.e. empty
                store.purge(older_than=timedelta(microseconds=1))
            except BaseException as exc:
                errors.append(exc)
            time.sleep(0.01)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(4)]
    rot = threading.Thread(target=rotator)
    rot.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    rot.join()
    assert errors == []
    # A record dropped (past the 1 us window) lets its key run again; within the run, each key's first effect ran
    # once and its retries replayed or ran after a drop: never two effects for one key at once.
    assert set(effects) == {f"k{i}" for i in range(40)}


def test_keys_within_retention_are_never_run_twice_across_rotations(store: IdempotencyStore) -> None:
    effects: Counter[str] = Counter()
    for i in range(30):
        store.run(scope="s", operation="op", key=f"k{i}", request={}, effect=lambda c, i=i: effects.update([i]))
        if i % 7 == 0:
            store.purge(older_than=timedelta(hours=1))
            store.purge(older_than=timedelta(hours=1))
    for i in range(30):
        assert store.run(scope="s", operation="op", key=f"k{i}", request={}, effect=lambda c: None).replayed
    assert set(effects.values()) == {1}


def test_stats_on_a_large_table_answers_from_estimates(store: IdempotencyStore,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    with store.transaction() as conn:
        store.claim(conn, scope="a", operation="op", key="held", request={}, lease=timedelta(minutes=5))
    store.run(scope="a", operation="op", key="done", request={}, effect=lambda c: 1)
    exact = store.stats()
    assert exact.estimated == () and (exact.in_flight, exact.completed) == (1, 1)
    monkeypatch.setattr(retention_module, "EXACT_BELOW", 0)  # as on a table of millions of rows
    estimated = store.stats()
    # The backlog is the planner's estimate where the engine gives one it stands behind (PostgreSQL), else counted.
    ranged = type(store.backend.maintenance).older_than is not Maintenance.older_than
    assert set(estimated.estimated) == {"records", "completed", "messages", "purgeable_messages"} | (
        {"purgeable"} if ranged else set())
    assert estimated.stale == ()
    assert estimated.in_flight == 1 and estimated.expired == 0  # claims not completed: always counted
    assert estimated.as_dict()["estimated"] == list(estimated.estimated)


def test_sqlite_keeps_no_generations(tmp_path: object) -> None:
    with IdempotencyStore.from_url(f"sqlite:///{tmp_path}/g.db") as store:
        with pytest.raises(ConfigurationError, match="no generations"):
            store.create_tables(generations=True)


def test_mariadb_purges_at_read_committed(db_server: Server) -> None:
    if db_server.url.get_backend_name() != "mariadb":
        pytest.skip("a MySQL/MariaDB fact")
    with IdempotencyStore.from_url(db_server.url, pool_size=1) as store:
        with store.engine.connect() as conn:
            with store.backend.transaction(conn, Begin.PURGE):
                assert conn.exec_driver_sql("SELECT @@tx_isolation").scalar() == "READ-COMMITTED"
        with store.engine.connect() as conn:  # the same DBAPI connection, back from the pool at its own level
            assert conn.exec_driver_sql("SELECT @@tx_isolation").scalar() == "REPEATABLE-READ"


def test_the_async_store_reads_the_previous_generation(db_server: Server) -> None:
    import asyncio

    from idem_dialects import AsyncIdempotencyStore, dialects

    drivers = dialects.usable_drivers(dialects.load(db_server.url.get_backend_name()), asynchronous=True)
    if not drivers:
        pytest.skip("no async driver installed")

    async def main() -> None:
        url = db_server.url.set(drivername=f"{db_server.url.get_backend_name()}+{drivers[0]}")
        async with AsyncIdempotencyStore.from_url(url, table_prefix=f"g{secrets.token_hex(3)}_") as store:
            await store.create_tables(generations=True)
            try:
                async def effect(conn: object) -> int:
                    return 1

                await store.run(scope="a", operation="op", key="k", request={}, effect=effect)
                await store.purge()  # rotation: the record is in the previous generation now
                replay = await store.run(scope="a", operation="op", key="k", request={}, effect=effect)
                assert replay.replayed and replay.response == 1
            finally:
                await store.drop_tables()

    asyncio.run(main())


def test_init_generations_creates_the_previous_table(db_server: Server) -> None:
    from idem_dialects.cli import main

    prefix = f"g{secrets.token_hex(3)}_"
    assert main(["init", db_server.url.render_as_string(hide_password=False), "--table-prefix", prefix,
                 "--generations", "--quiet"]) == 0
    with IdempotencyStore.from_url(db_server.url, table_prefix=prefix) as store:
        assert count(store, store.tables.previous.name) == 0
        store.drop_tables()
