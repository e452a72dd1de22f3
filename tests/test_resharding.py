"""Changing a sharded store's placement without running a key twice: the default chooser (rendezvous hashing) moves
about 1/(N+1) of the scopes when a shard is added, a `Move` routes a moving scope's keys through its old shard's
records, `move_records` copies them to the new shard, and nothing runs again or is lost after the store routes by
the new placement alone. Each shard's retry budget applies on every path, and RetriesExhausted names the shard."""

from __future__ import annotations

import json
import sqlite3
import zlib
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from idem_dialects import IdempotencyStore, RequestInFlight, RetriesExhausted, RetryPolicy, ShardedStore
from idem_dialects.claims import MOVED
from idem_dialects.http import IdempotencyPolicy
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
