"""Lease renewal: a leased claim is renewed while its effect runs (sync thread, async task), fenced by the claim token,
and the heartbeat stops when the effect ends, whatever way it ends. On SQLite and PostgreSQL 15, sync and async."""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from consumer_common import await_for, wait_for
from sqlalchemy import text
from sqlalchemy.engine import make_url

from idem_dialects import IdempotencyStore, LeaseLost, RequestInFlight
from idem_dialects.claims import Claims
from idem_dialects.engines import Unavailable, get
from idem_dialects.outcomes import Claimed
from idem_dialects.steps import Flow

# Renewed every third of it (0.5 s): a renewal would have to be more than a second late for the claim to lapse.
LEASE = timedelta(seconds=1.5)
# Renewals that outlast the lease they started with (each lands a third of a lease after the one before).
PAST_THE_LEASE = 4
REQ = {"amount": 1}


@dataclass
class Urls:
    sync: str
    asynchronous: str
    prefix: str


@pytest.fixture(params=["sqlite", "postgresql"])
def urls(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Urls]:
    prefix = f"hb{secrets.token_hex(3)}_"
    if request.param == "sqlite":
        path = tmp_path / "hb.db"
        found = Urls(f"sqlite:///{path}", f"sqlite+aiosqlite:///{path}", prefix)
    else:
        try:
            url = make_url(get("postgresql").provide().url)
        except Unavailable as exc:
            pytest.skip(f"postgresql unavailable: {exc}")
        found = Urls(url.render_as_string(hide_password=False),
                     url.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False), prefix)
    store = IdempotencyStore.from_url(found.sync, table_prefix=prefix)
    store.create_tables()
    try:
        yield found
    finally:
        store.drop_tables()
        store.close()


class Renewals:
    """Counts the renewals the heartbeat starts (the real fenced UPDATE still runs), with their start times."""

    def __init__(self, claims: Claims, fail: bool = False) -> None:
        self.started: list[float] = []
        self.held: list[bool] = []
        renew = claims.renew

        def counted(claimed: Claimed, lease: float) -> Flow[bool]:
            self.started.append(time.monotonic())
            if fail:
                raise RuntimeError("renewal failed")
            held = yield from renew(claimed, lease)
            self.held.append(held)
            return held

        claims.renew = counted  # type: ignore[method-assign]


def sync_store(urls: Urls) -> IdempotencyStore:
    return IdempotencyStore.from_url(urls.sync, table_prefix=urls.prefix)


def async_store(urls: Urls) -> Any:
    pytest.importorskip("greenlet", reason="the async store needs greenlet")
    from idem_dialects import AsyncIdempotencyStore

    return AsyncIdempotencyStore.from_url(urls.asynchronous, table_prefix=urls.prefix)


def waits_on_write_lock(store: Any) -> bool:
    """A store.run effect runs in a transaction; where the engine has one write lock, that transaction holds it, so
    a retry cannot take the claim over: it waits for the effect to commit and replays (no heartbeat there)."""
    return bool(store.features.writers == 1)


def check_retry(store: Any, answer: Any) -> None:
    """What a retry gets while the first effect, renewing its lease, still runs: RequestInFlight with a retry
    delay; or, where it waits on the engine's write lock, the first response replayed once that commits."""
    if isinstance(answer, RequestInFlight):
        assert not waits_on_write_lock(store)
        assert answer.retry_after > 0
    else:
        assert waits_on_write_lock(store), "the retry took the claim over"
        assert answer.replayed and answer.response == {"charged": 1}


# --- an effect outliving its lease: the retry comes once the lease would be over, while the effect still runs ------


def test_sync_outliving_effect_runs_once_and_the_retry_is_in_flight(urls: Urls) -> None:
    with sync_store(urls) as store:
        runs: list[int] = []
        started, answered, retrying = threading.Event(), threading.Event(), threading.Event()
        results: list[Any] = []
        renewals = Renewals(store.claims)
        one_writer = waits_on_write_lock(store)

        def effect(conn: Any) -> dict[str, int]:
            runs.append(1)
            started.set()
            if one_writer:  # the retry waits on this transaction's write lock: it cannot be answered meanwhile
                retrying.wait(60)
            else:
                answered.wait(60)  # runs until the retry has its answer
            return {"charged": len(runs)}

        first = threading.Thread(target=lambda: results.append(store.run(
            scope="s", operation="pay", key="k1", request=REQ, effect=effect, lease=LEASE)))
        first.start()
        assert started.wait(30)
        if one_writer:  # nothing renews it here: the lease is over once its time has passed
            time.sleep(LEASE.total_seconds() + 0.1)
            retrying.set()
        else:  # the lease it started with is over: only its renewals hold the claim now
            wait_for(lambda: renewals.held.count(True) >= PAST_THE_LEASE, 60, "the heartbeat")
        try:
            check_retry(store, store.run(scope="s", operation="pay", key="k1", request=REQ, effect=effect,
                                         lease=LEASE))
        except RequestInFlight as exc:
            check_retry(store, exc)
        finally:
            answered.set()
        first.join(60)
        assert results[0].response == {"charged": 1} and not results[0].replayed
        assert len(runs) == 1
        again = store.run(scope="s", operation="pay", key="k1", request=REQ, effect=effect, lease=LEASE)
        assert again.replayed and again.response == {"charged": 1} and len(runs) == 1


def test_async_outliving_effect_runs_once_and_the_retry_is_in_flight(urls: Urls) -> None:
    store = async_store(urls)

    async def scenario() -> None:
        runs: list[int] = []
        started, answered, retrying = asyncio.Event(), asyncio.Event(), asyncio.Event()
        renewals = Renewals(store.claims)
        one_writer = waits_on_write_lock(store)

        async def effect(conn: Any) -> dict[str, int]:
            runs.append(1)
            started.set()
            if one_writer:  # the retry waits on this transaction's write lock: it cannot be answered meanwhile
                await asyncio.wait_for(retrying.wait(), 60)
            else:
                await asyncio.wait_for(answered.wait(), 60)  # runs until the retry has its answer
            return {"charged": len(runs)}

        first = asyncio.create_task(store.run(scope="s", operation="pay", key="k1", request=REQ, effect=effect,
                                              lease=LEASE))
        await asyncio.wait_for(started.wait(), 30)
        if one_writer:  # nothing renews it here: the lease is over once its time has passed
            await asyncio.sleep(LEASE.total_seconds() + 0.1)
            retrying.set()
        else:  # the lease it started with is over: only its renewals hold the claim now
            await await_for(lambda: renewals.held.count(True) >= PAST_THE_LEASE, 60, "the heartbeat")
        try:
            check_retry(store, await store.run(scope="s", operation="pay", key="k1", request=REQ, effect=effect,
                                               lease=LEASE))
        except RequestInFlight as exc:
            check_retry(store, exc)
        finally:
            answered.set()
        result = await first
        assert result.response == {"charged": 1} and not result.replayed
        assert len(runs) == 1
        await store.close()

    asyncio.run(scenario())


# --- the heartbeat's life: renews meanwhile, stops after, fenced, never in the effect's way ------------------------


def test_sync_heartbeat_renews_while_the_effect_runs_and_stops_when_it_returns(urls: Urls) -> None:
    with sync_store(urls) as store:
        if waits_on_write_lock(store):
            pytest.skip("one write lock, held by the effect's transaction: store.run renews nothing there")
        renewals = Renewals(store.claims)
        result = store.run(scope="s", operation="pay", key="k2", request=REQ, lease=LEASE,
                           effect=lambda conn: wait_for(lambda: len(renewals.held) >= 2, 60, "the heartbeat") or "done")
        returned = time.monotonic()
        assert result.response == "done"
        time.sleep(1.0)  # two heartbeat intervals: none may start now
        assert len(renewals.started) >= 2 and all(renewals.held)
        assert all(t <= returned for t in renewals.started)


def test_async_heartbeat_renews_while_the_effect_runs_and_stops_when_it_returns(urls: Urls) -> None:
    store = async_store(urls)

    async def scenario() -> None:
        if waits_on_write_lock(store):
            pytest.skip("one write lock, held by the effect's transaction: store.run renews nothing there")
        renewals = Renewals(store.claims)

        async def effect(conn: Any) -> str:
            await await_for(lambda: len(renewals.held) >= 2, 60, "the heartbeat")
            return "done"

        result = await store.run(scope="s", operation="pay", key="k2", request=REQ, lease=LEASE, effect=effect)
        returned = time.monotonic()
        assert result.response == "done"
        await asyncio.sleep(1.0)
        assert len(renewals.started) >= 2 and all(renewals.held)
        assert all(t <= returned for t in renewals.started)
        await store.close()

    asyncio.run(scenario())


def test_heartbeat_stops_when_the_effect_raises_and_its_error_is_unchanged(urls: Urls) -> None:
    with sync_store(urls) as store:
        renewals = Renewals(store.claims, fail=True)  # every renewal fails: logged, never the effect's business
        error = ValueError("the effect's own")

        def effect(conn: Any) -> None:
            if not waits_on_write_lock(store):  # (where it renews at all)
                wait_for(lambda: len(renewals.started) >= 2, 60, "the heartbeat")
            raise error

        with pytest.raises(ValueError) as raised:
            store.run(scope="s", operation="pay", key="k3", request=REQ, lease=LEASE, effect=effect)
        assert raised.value is error
        returned = time.monotonic()
        time.sleep(1.0)
        assert all(t <= returned for t in renewals.started)
        if not waits_on_write_lock(store):
            assert len(renewals.started) >= 2
        # The claim was released after the failure: the next attempt runs at once.
        assert store.run(scope="s", operation="pay", key="k3", request=REQ, lease=LEASE,
                         effect=lambda conn: "ok").response == "ok"


def test_async_heartbeat_failing_leaves_the_effects_error_and_result_alone(urls: Urls) -> None:
    store = async_store(urls)

    async def scenario() -> None:
        renewals = Renewals(store.claims, fail=True)
        error = KeyError("the effect's own")

        async def beats(count: int) -> None:
            if not waits_on_write_lock(store):  # (where it renews at all)
                await await_for(lambda: len(renewals.started) >= count, 60, "the heartbeat")

        async def failing(conn: Any) -> None:
            await beats(2)
            raise error

        async def fine(conn: Any) -> str:
            await beats(4)
            return "stored"

        with pytest.raises(KeyError) as raised:
            await store.run(scope="s", operation="pay", key="k4", request=REQ, lease=LEASE, effect=failing)
        assert raised.value is error
        result = await store.run(scope="s", operation="pay", key="k5", request=REQ, lease=LEASE, effect=fine)
        assert result.response == "stored"
        if not waits_on_write_lock(store):
            assert len(renewals.started) >= 4
        await store.close()

    asyncio.run(scenario())


def test_async_heartbeat_stops_when_the_task_is_cancelled(urls: Urls) -> None:
    store = async_store(urls)

    async def scenario() -> None:
        renewals = Renewals(store.claims)
        started = asyncio.Event()

        async def effect(conn: Any) -> None:
            started.set()
            await asyncio.sleep(30)

        task = asyncio.create_task(store.run(scope="s", operation="pay", key="k6", request=REQ, lease=LEASE,
                                             effect=effect))
        await asyncio.wait_for(started.wait(), 30)
        if not waits_on_write_lock(store):  # (where it renews at all) cancelled while the heartbeat beats
            await await_for(lambda: len(renewals.held) >= 1, 60, "the heartbeat")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        ended = time.monotonic()
        await asyncio.sleep(1.0)
        assert all(t <= ended for t in renewals.started)
        await store.close()

    asyncio.run(scenario())


def test_a_lost_claim_stops_the_heartbeat_and_is_logged_without_the_token(
        urls: Urls, caplog: pytest.LogCaptureFixture) -> None:
    with sync_store(urls) as store:
        if waits_on_write_lock(store):
            pytest.skip("one write lock, held by the effect's transaction: store.run renews nothing there")
        renewals = Renewals(store.claims)
        tokens: list[str] = []
        records = store.tables.records.name

        def effect(conn: Any) -> str:
            wait_for(lambda: len(renewals.held) >= 1, 60, "the heartbeat")
            with store.engine.begin() as other:  # someone else holds the claim now (a takeover's new token)
                tokens.append(other.execute(text(f"SELECT claim_token FROM {records}")).scalar_one())
                other.execute(text(f"UPDATE {records} SET claim_token = 'someone-else'"))
            wait_for(lambda: False in renewals.held, 60, "the heartbeat")  # the next renewal finds the claim gone
            return "late"

        with caplog.at_level(logging.WARNING, logger="idem_dialects"), pytest.raises(LeaseLost):
            store.run(scope="s", operation="pay", key="k7", request=REQ, lease=LEASE, effect=effect)
        assert renewals.held[-1] is False and renewals.held.count(False) == 1  # stopped at the first lost renewal
        lost = [r for r in caplog.records if "while its effect runs" in r.getMessage()]
        assert len(lost) == 1 and lost[0].levelno == logging.WARNING
        assert not any(tokens[0] in r.getMessage() or "late" in r.getMessage() for r in caplog.records)


def test_renewal_is_fenced_by_the_claim_token(urls: Urls) -> None:
    """The renewal SQL itself: ours extends the lease; a claim we no longer hold is not renewed."""
    with sync_store(urls) as store:
        core = store.claims
        req = core.request("s", "pay", "k8", REQ, LEASE)
        with store.transaction() as conn:
            claimed = store.drive(core.claim(req), conn)
        assert isinstance(claimed, Claimed)
        with store.transaction() as conn:
            assert store.drive(core.renew(claimed, 60.0), conn) is True
        with store.transaction() as conn:  # a retry 1 s later finds a live lease: in flight, not taken over
            retry = core.request("s", "pay", "k8", REQ, LEASE)
            outcome = store.drive(core.claim(retry), conn)
        assert type(outcome).__name__ == "InFlight" and outcome.retry_after > 30  # type: ignore[union-attr]
        stranger = Claimed(claimed.scope, claimed.operation, claimed.key, claimed.fingerprint, "0" * 32, True, False)
        with store.transaction() as conn:
            assert store.drive(core.renew(stranger, 60.0), conn) is False
        with store.transaction() as conn:
            store.complete(conn, claimed, "done")
        with store.transaction() as conn:  # completed: nothing left to renew
            assert store.drive(core.renew(claimed, 60.0), conn) is False


# --- external-call mode (the HTTP flow): the handler runs outside any transaction, so every engine renews -----------


def _http_call(key: str) -> Any:
    from idem_dialects.http import HttpRequest

    return HttpRequest("POST", "/charge", [("idempotency-key", f'"{key}"'), ("content-type", "application/json")],
                       body=b'{"a": 1}')


def test_external_call_heartbeat_renews_and_stops_on_every_engine(urls: Urls) -> None:
    from idem_dialects.http import HttpResponse, IdempotencyPolicy
    from idem_dialects.http.runner import Idempotency

    with sync_store(urls) as store:
        renewals = Renewals(store.claims)
        runner = Idempotency(store, IdempotencyPolicy(global_scope=True, lease=LEASE))

        def handler(conn: Any) -> HttpResponse:
            assert conn is None  # outside any transaction: nothing holds a lock the renewal needs
            wait_for(lambda: len(renewals.held) >= 2, 60, "the heartbeat")
            return HttpResponse(201, [("content-type", "text/plain")], b"charged")

        resp = runner.handle(_http_call("e1"), handler)
        returned = time.monotonic()
        assert resp.status == 201 and resp.body == b"charged"
        time.sleep(1.0)
        assert len(renewals.started) >= 2 and all(renewals.held)
        assert all(t <= returned for t in renewals.started)


def test_async_external_call_heartbeat_renews_and_stops_on_every_engine(urls: Urls) -> None:
    from idem_dialects.http import HttpResponse, IdempotencyPolicy
    from idem_dialects.http.runner import AsyncIdempotency

    store = async_store(urls)

    async def scenario() -> None:
        renewals = Renewals(store.claims)
        runner = AsyncIdempotency(store, IdempotencyPolicy(global_scope=True, lease=LEASE))

        async def handler(conn: Any) -> HttpResponse:
            await await_for(lambda: len(renewals.held) >= 2, 60, "the heartbeat")
            return HttpResponse(201, [("content-type", "text/plain")], b"charged")

        resp = await runner.handle(_http_call("e2"), handler)
        returned = time.monotonic()
        assert resp.status == 201 and resp.body == b"charged"
        await asyncio.sleep(1.0)
        assert len(renewals.started) >= 2 and all(renewals.held)
        assert all(t <= returned for t in renewals.started)
        await store.close()

    asyncio.run(scenario())
