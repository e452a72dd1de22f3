"""The row-by-row purge walks the completion index range by range and paces itself (idem_dialects/purging.py), and a
rotation of generations waits for its lock attempt by attempt: what each removes is counted in the database, whatever
the batch size, the completion times shared by many records (a bulk load) and the claims racing it; a live claim and
a record within retention never go. Outcomes only: speed is the benchmark's business (bench --measure purge)."""

from __future__ import annotations

import secrets
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from idem_dialects import IdempotencyStore, InvalidPayload, purging
from idem_dialects import store as store_module
from idem_dialects.cli import main
from idem_dialects.dialects.maintenance import ROTATION_LAST_WAIT, rotation_wait
from idem_dialects.engines import Unavailable, get
from idem_dialects.purging import BATCH_SECONDS, MIN_BATCH, Pacer
from idem_dialects.steps import Sleep

OLD = datetime.now(UTC) - timedelta(days=2)  # completed two days ago: past a day's retention
ENGINES = ["sqlite", "postgresql", "mariadb"]


@pytest.fixture(params=ENGINES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[IdempotencyStore]:
    if request.param == "sqlite":
        url: Any = f"sqlite:///{tmp_path / 'purge.db'}"
    else:
        try:
            server = get(request.param).provide()
        except Unavailable as exc:
            pytest.skip(f"{request.param} unavailable: {exc}")
        request.addfinalizer(server.stop)
        url = server.url
    made = IdempotencyStore.from_url(url, table_prefix=f"p{secrets.token_hex(3)}_")
    made.create_tables()
    yield made
    made.drop_tables()
    made.close()


def add(store: IdempotencyStore, scope: str, count: int, completed: datetime | None, *,
        spread: timedelta = timedelta(0), locked_until: datetime | None = None, created: datetime = OLD) -> None:
    """`count` records of `scope`, completed at `completed` (plus i * `spread` for the i-th: zero, all at one
    moment as a bulk load stamps them), or claims never completed (`completed` None) leased until `locked_until`."""
    rows = [{"scope": scope, "operation": "op", "idem_key": f"{scope}-{i:06d}", "fingerprint": "0" * 64,
             "claim_token": secrets.token_hex(16), "created_at": created, "locked_until": locked_until or created,
             "completed_at": None if completed is None else completed + i * spread,
             "status": None if completed is None else 200, "response": None if completed is None else b'{"ok":1}'}
            for i in range(count)]
    with store.engine.begin() as conn:
        for start in range(0, count, 1000):
            conn.execute(store.tables.records.insert(), rows[start:start + 1000])


def scopes(store: IdempotencyStore) -> Counter[str]:
    records = store.tables.records
    with store.engine.connect() as conn:
        return Counter({row[0]: row[1] for row in conn.execute(
            select(records.c.scope, func.count()).group_by(records.c.scope))})


@pytest.mark.parametrize("layout", ["one moment", "spread", "a moment inside a spread"])
def test_the_walk_removes_exactly_what_is_past_retention(store: IdempotencyStore, layout: str) -> None:
    """Old records in ranges of 100 (a group sharing one completion time seven batches long where the layout has one),
    beside records within retention, live claims created as long ago, and abandoned claims: the old and the abandoned
    go, counted; the rest stays."""
    now = datetime.now(UTC)
    if layout == "one moment":
        add(store, "old", 1500, OLD)
    elif layout == "spread":
        add(store, "old", 1500, OLD, spread=timedelta(milliseconds=3))
    else:
        add(store, "old", 400, OLD - timedelta(hours=1), spread=timedelta(milliseconds=3))
        add(store, "tie", 700, OLD)
        add(store, "late", 400, OLD + timedelta(hours=1), spread=timedelta(milliseconds=3))
    add(store, "recent", 300, now, spread=timedelta(milliseconds=1))
    add(store, "live", 5, None, locked_until=now + timedelta(hours=1))  # in flight, created two days ago
    add(store, "dead", 7, None)  # never completed, lease over two days ago: abandoned
    assert store.purge(older_than=timedelta(days=1), batch_size=100) == 1500 + 7
    assert scopes(store) == Counter({"recent": 300, "live": 5})


def test_claims_racing_the_purge_are_never_touched(store: IdempotencyStore) -> None:
    """Threads claim new keys and replay recent ones while the purge walks 3,000 old records (600 on SQLite): the purge
    removes the old ones only, no recent key runs its effect again, and every key claimed during it is there after."""
    old = 600 if store.backend.name == "sqlite" else 3000  # one writer: there the claims take turns with batches
    add(store, "old", old, OLD, spread=timedelta(microseconds=7))
    recent = [f"r{i}" for i in range(40)]
    for key in recent:
        store.run(scope="recent", operation="op", key=key, request={}, effect=lambda conn: "first")
    effects: Counter[str] = Counter()
    errors: list[BaseException] = []
    done = threading.Event()
    lock = threading.Lock()

    def effect(key: str) -> Any:
        def run(conn: object) -> str:
            with lock:
                effects[key] += 1
            return "again"
        return run

    def claimer(n: int) -> None:
        i = 0
        try:
            while not done.is_set() or i < 10:
                store.run(scope="new", operation="op", key=f"w{n}-{i}", request={}, effect=effect(f"w{n}-{i}"))
                replay = store.run(scope="recent", operation="op", key=recent[i % len(recent)], request={},
                                   effect=effect(recent[i % len(recent)]))
                assert replay.replayed and replay.response == "first"
                i += 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    try:
        removed = store.purge(older_than=timedelta(days=1), batch_size=64, pace=0.5)
    finally:
        done.set()
        for thread in threads:
            thread.join()
    assert errors == []
    assert removed == old
    found = scopes(store)
    assert found["old"] == 0 and found["recent"] == len(recent)
    assert found["new"] == sum(effects.values()) and all(count == 1 for count in effects.values())


def test_a_walk_that_cannot_move_on_ends_in_plain_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A range that deletes nothing and leads back to itself (its rows another purge's, or a driver reading the
    column coarser than the engine keeps it): the purge does not loop on it, and what is left goes in batches."""
    def stuck(self: purging.Walk, position: purging.Position, size: int) -> Any:
        return 0, position
        yield  # pragma: no cover - a flow

    monkeypatch.setattr(purging.Walk, "step", stuck)
    with IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'stuck.db'}") as store:
        store.create_tables()
        add(store, "old", 250, OLD, spread=timedelta(milliseconds=1))
        add(store, "recent", 20, datetime.now(UTC))
        assert store.purge(older_than=timedelta(days=1), batch_size=100) == 250
        assert scopes(store) == Counter({"recent": 20})


def test_a_paced_purge_waits_between_batches(store: IdempotencyStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """pace below 1: a pause after every batch but a table's last; pace 1: none. The pauses' lengths are the Pacer's
    (test below), not asserted here."""
    pauses: list[float] = []
    monkeypatch.setattr(store_module.time, "sleep", pauses.append)
    add(store, "old", 250, OLD, spread=timedelta(milliseconds=1))
    assert store.purge(older_than=timedelta(days=1), batch_size=100, pace=1.0) == 250
    assert pauses == []
    add(store, "old", 250, OLD, spread=timedelta(milliseconds=1))
    assert store.purge(older_than=timedelta(days=1), batch_size=100, pace=0.25) == 250
    assert len(pauses) >= 2 and all(p > 0 for p in pauses)


def test_the_pacer_bounds_the_share_of_time_in_batches() -> None:
    pacer = Pacer(1000, 0.25)

    def pause(took: float) -> list[float]:
        return [step.seconds for step in pacer.pause(took) if isinstance(step, Sleep)]

    assert pause(0.02) == [pytest.approx(0.06)]  # t (1/pace - 1): batches fill a quarter of the time
    assert pacer.size == 1000
    pause(BATCH_SECONDS * 4)  # slower than the target: the next batch is half as big
    assert pacer.size == 500
    for _ in range(20):
        pause(BATCH_SECONDS * 4)
    assert pacer.size == MIN_BATCH
    for _ in range(20):
        pause(BATCH_SECONDS / 4)  # fast again: doubled back, never past the batch size asked for
    assert pacer.size == 1000
    assert [step for step in Pacer(10, 1.0).pause(5.0)] == []  # pace 1: no pause at all


@pytest.mark.parametrize("pace", [0, -0.5, 1.5, True, float("nan"), "0.5"])
def test_pace_out_of_bounds_is_refused_before_any_sql(pace: Any, tmp_path: Path) -> None:
    with IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'x.db'}") as store:
        with pytest.raises(InvalidPayload, match="pace"):
            store.purge(pace=pace)


def test_the_command_takes_a_pace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    assert main(["init", url, "--quiet"]) == 0
    assert main(["purge", url, "--older-than", "1d", "--pace", "0.25"]) == 0
    assert "purged 0 rows" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exited:
        main(["purge", url, "--older-than", "1d", "--pace", "0"])
    assert exited.value.code == 64


def test_a_rotation_waits_longer_only_attempt_by_attempt() -> None:
    waits = [rotation_wait(attempt) for attempt in range(12)]
    assert waits[0] == 0.05 and waits == sorted(waits) and waits[-1] == ROTATION_LAST_WAIT
    assert rotation_wait(0, floor=1.0) == 1.0  # an engine whose lock wait is in whole seconds (MySQL, MariaDB)


@pytest.mark.parametrize("engine", ["postgresql", "mariadb"])
def test_a_rotation_behind_a_long_transaction_retries_and_drops_exactly(engine: str,
                                                                       request: pytest.FixtureRequest) -> None:
    """A claim's transaction holds the tables longer than the rotation's first lock wait: that attempt times out
    (claims queued behind it go on), a later one rotates once the claim has completed, and the rows dropped are the
    previous generation's, counted; the held record is in the generation that became the previous one, and
    replays."""
    try:
        server = get(engine).provide()
    except Unavailable as exc:
        pytest.skip(f"{engine} unavailable: {exc}")
    request.addfinalizer(server.stop)
    store = IdempotencyStore.from_url(server.url, table_prefix=f"r{secrets.token_hex(3)}_")
    store.create_tables(generations=True)
    try:
        for i in range(20):
            store.run(scope="s", operation="op", key=f"old{i}", request={}, effect=lambda conn: 1)
        assert store.purge(older_than=timedelta(0)) == 0  # the first rotation: an empty previous generation
        held = threading.Event()
        release = threading.Event()
        outcome: list[Any] = []

        def holder() -> None:
            def effect(conn: object) -> str:
                held.set()
                release.wait(10)
                return "held"
            outcome.append(store.run(scope="s", operation="op", key="held", request={}, effect=effect))

        thread = threading.Thread(target=holder)
        thread.start()
        assert held.wait(10)
        timer = threading.Timer(2.5, release.set)  # longer than a first attempt waits on either engine
        timer.start()
        try:
            before = sum(store.retries.values())
            assert store.purge(older_than=timedelta(0)) == 20  # the previous generation, dropped whole
        finally:
            release.set()
            thread.join()
            timer.cancel()
        assert sum(store.retries.values()) > before  # the first attempt gave up on the lock and was retried
        assert outcome and outcome[0].response == "held"
        with store.engine.connect() as conn:
            current = conn.execute(select(store.tables.records.c.idem_key)).scalars().all()
            previous = conn.execute(select(store.tables.previous.c.idem_key)).scalars().all()
        assert current == [] and previous == ["held"]
        assert store.run(scope="s", operation="op", key="held", request={}, effect=lambda conn: "again").replayed
    finally:
        store.drop_tables()
        store.close()
