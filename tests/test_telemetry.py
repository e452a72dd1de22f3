"""Metrics and traces with the OpenTelemetry SDK installed, read back from its in-memory reader and exporter: the
counters say exactly what happened, on SQLite and PostgreSQL 15, through the sync and the async store; spans nest
(SQLAlchemy's under the run, the run under the HTTP request, that under the server's) and never carry a key, a scope
or a payload."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from async_common import async_store_class
from otel_common import Sdk, every_attribute, private_sdk, sdk
from sqlalchemy.engine import make_url

from idem_dialects import (
    IdempotencyStore,
    LeaseLost,
    RequestInFlight,
    RequestMismatch,
    RetryCause,
    TransientError,
)
from idem_dialects.engines import Unavailable, get

EXPECTED = {"claimed": 10, "replayed": 5, "mismatch": 1, "in_flight": 1}
LEASE = timedelta(minutes=5)


@pytest.fixture(scope="module")
def otel() -> Sdk:
    return sdk()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(sync URL, async URL) of SQLite and of the machine's PostgreSQL 15 (skipped with the reason if it is not up)."""
    if request.param == "sqlite":
        path = tmp_path_factory.mktemp("otel") / "otel.db"
        yield f"sqlite:///{path}", f"sqlite+aiosqlite:///{path}"
        return
    try:
        server = get("postgresql").provide()
    except Unavailable as exc:
        pytest.skip(f"postgresql: {exc}")
    url = make_url(server.url)
    yield url.render_as_string(hide_password=False), url.set(drivername="postgresql+asyncpg").render_as_string(
        hide_password=False)
    server.stop()


def _prefix() -> str:
    return f"ot{uuid.uuid4().hex[:8]}_"


def _fail(conn: Any) -> Any:
    raise AssertionError("the effect ran again")


async def _afail(conn: Any) -> Any:
    raise AssertionError("the effect ran again")


def _sync_scenario(url: str, op: str) -> str:
    """10 first-time runs (the last one leased, answering one in-flight run from inside its effect), 5 replays and
    1 mismatch; returns the store's backend name."""
    with IdempotencyStore.from_url(url, table_prefix=_prefix()) as store:
        store.create_tables()
        ident = {"scope": "tenant", "operation": op}
        for n in range(9):
            store.run(**ident, key=f"k{n}", request={"n": n}, effect=lambda conn: {"ok": True})
        answers: list[RequestInFlight] = []

        def holder(conn: Any) -> Any:
            try:
                store.run(**ident, key="k9", request={"n": 9}, effect=_fail, lease=LEASE)
            except RequestInFlight as exc:
                answers.append(exc)
            return {"ok": True}

        store.run(**ident, key="k9", request={"n": 9}, effect=holder, lease=LEASE)
        assert len(answers) == 1
        for n in range(5):
            assert store.run(**ident, key=f"k{n}", request={"n": n}, effect=_fail).replayed
        with pytest.raises(RequestMismatch):
            store.run(**ident, key="k0", request={"n": "changed"}, effect=_fail)
        store.drop_tables()
        return store.backend.name


def _async_scenario(url: str, op: str) -> str:
    async def main() -> str:
        async with async_store_class().from_url(url, table_prefix=_prefix()) as store:
            await store.create_tables()
            ident = {"scope": "tenant", "operation": op}

            async def ok(conn: Any) -> Any:
                return {"ok": True}

            for n in range(9):
                await store.run(**ident, key=f"k{n}", request={"n": n}, effect=ok)
            answers: list[RequestInFlight] = []

            async def holder(conn: Any) -> Any:
                try:
                    await store.run(**ident, key="k9", request={"n": 9}, effect=_afail, lease=LEASE)
                except RequestInFlight as exc:
                    answers.append(exc)
                return {"ok": True}

            await store.run(**ident, key="k9", request={"n": 9}, effect=holder, lease=LEASE)
            assert len(answers) == 1
            for n in range(5):
                assert (await store.run(**ident, key=f"k{n}", request={"n": n}, effect=_afail)).replayed
            with pytest.raises(RequestMismatch):
                await store.run(**ident, key="k0", request={"n": "changed"}, effect=_afail)
            await store.drop_tables()
            return store.backend.name

    return asyncio.run(main())


@pytest.mark.parametrize("api", ["sync", "async"])
def test_counters_read_exactly_what_happened(otel: Sdk, database: tuple[str, str], api: str) -> None:
    op = f"debit-{uuid.uuid4().hex[:6]}:v1"
    url = database[0] if api == "sync" else database[1]
    backend = (_sync_scenario if api == "sync" else _async_scenario)(url, op)

    assert otel.tally("idempotency.outcomes", op) == EXPECTED
    assert otel.tally("idempotency.claim.wait", op) == EXPECTED  # one measured wait per claim decision
    assert otel.tally("idempotency.run.duration", op) == EXPECTED  # one per run, by its outcome
    assert otel.tally("idempotency.effect.duration", op) == {"None": 10}  # the effect ran once per key
    points = [(name, attrs) for name, attrs, _ in otel.points() if attrs.get("idempotency.operation") == op]
    assert {attrs["db.system.name"] for _, attrs in points} == {backend}
    database = make_url(url).database
    assert database is not None
    # The database's name; on SQLite the file's name, not where it lives.
    assert {attrs["db.namespace"] for _, attrs in points} == {Path(database).name if backend == "sqlite" else database}

    runs = [s for s in otel.spans() if s.name == "idempotency run" and s.attributes["idempotency.operation"] == op]
    assert Counter(s.attributes["idempotency.outcome"] for s in runs) == EXPECTED
    assert {s.attributes["idempotency.attempts"] for s in runs} == {1}
    assert {s.attributes["db.system.name"] for s in runs} == {backend}
    # The in-flight answer was asked from inside the leased run's effect: its span is that run's child.
    (inner,) = [s for s in runs if s.attributes["idempotency.outcome"] == "in_flight"]
    (outer,) = [s for s in runs if s.context.span_id == inner.parent.span_id]
    assert outer.attributes["idempotency.outcome"] == "claimed"


def test_takeover_lease_lost_retries_messages_and_purge_are_counted(otel: Sdk, tmp_path: Path) -> None:
    op = f"op-{uuid.uuid4().hex[:6]}"
    with IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'x.db'}", table_prefix="x_") as store:
        store.create_tables()
        with store.transaction() as conn:  # a claim whose holder then stalls past its lease
            stale = store.claim(conn, scope="s", operation=op, key="k", request={}, lease=timedelta(milliseconds=1))
        time.sleep(0.05)
        store.run(scope="s", operation=op, key="k", request={}, effect=lambda conn: 1)  # takes it over
        with pytest.raises(LeaseLost), store.transaction() as conn:
            store.complete(conn, stale, "late")  # type: ignore[arg-type]

        tries = []

        def flaky(conn: Any) -> int:
            tries.append(1)
            if len(tries) == 1:
                raise _Transient()
            return 1

        store.run(scope="s", operation=op, key="k2", request={}, effect=flaky)
        subscriber = f"sub-{uuid.uuid4().hex[:6]}"
        for message_id, payload in [("m1", "a"), ("m1", "a"), ("m2", "b")]:
            with store.transaction() as conn:
                store.accept_message(conn, subscriber=subscriber, message_id=message_id, payload=payload)
        with pytest.raises(RequestMismatch), store.transaction() as conn:
            store.accept_message(conn, subscriber=subscriber, message_id="m1", payload="changed")
        time.sleep(0.01)  # past the database clock's last tick (milliseconds on SQLite)
        assert store.purge(older_than=timedelta(0)) == 2 + 2

    assert otel.tally("idempotency.outcomes", op) == {"claimed": 3, "takeover": 1, "lease_lost": 1}
    runs = [s for s in otel.spans() if s.name == "idempotency run" and s.attributes["idempotency.operation"] == op]
    assert [(s.attributes["idempotency.attempts"], s.attributes["idempotency.outcome"]) for s in runs] == [
        (1, "claimed"), (2, "claimed")]
    # Rare outcomes are events on the current span: the takeover on its run's, the lost lease on none (no span).
    assert [[e.attributes["idempotency.outcome"] for e in s.events] for s in runs] == [["takeover"], []]
    retried = Counter({attrs["idempotency.retry.cause"]: p.value for name, attrs, p in otel.points()
                       if name == "idempotency.retries" and attrs.get("db.namespace") == "x.db"})
    assert retried == {RetryCause.CLAIM_RACE.value: 1}
    messages = Counter({attrs["idempotency.outcome"]: p.value for name, attrs, p in otel.points()
                        if name == "idempotency.messages" and attrs["idempotency.subscriber"] == subscriber})
    assert messages == {"accepted": 2, "duplicate": 1, "mismatch": 1}
    purged = Counter({attrs["db.collection.name"]: p.value for name, attrs, p in otel.points()
                      if name == "idempotency.purge.rows" and attrs.get("db.namespace") == "x.db"})
    assert purged == {"x_records": 2, "x_messages": 2}


@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_store_records_to_the_providers_it_is_given(otel: Sdk, tmp_path: Path, api: str) -> None:
    """Providers passed to a store (OpenTelemetry's convention for instrumentation) get its metrics and spans and the
    global ones nothing; the API's no-op tracer provider turns the store's spans off and leaves its metrics."""
    from opentelemetry.trace import NoOpTracerProvider

    own, meter_provider = private_sdk()
    traced, untraced = f"op-{uuid.uuid4().hex[:6]}", f"op-{uuid.uuid4().hex[:6]}"
    path = tmp_path / "own.db"
    runs = [(traced, "k1"), (traced, "k2"), (traced, "k1"), (untraced, "k1"), (untraced, "k1")]
    given = [{"tracer_provider": own.tracer_provider, "meter_provider": meter_provider},
             {"tracer_provider": NoOpTracerProvider(), "meter_provider": meter_provider}]
    if api == "sync":
        for providers, op in zip(given, (traced, untraced), strict=True):
            with IdempotencyStore.from_url(f"sqlite:///{path}", table_prefix="own_", **providers) as store:
                store.create_tables()
                for run_op, key in runs:
                    if run_op == op:
                        store.run(scope="s", operation=op, key=key, request={}, effect=lambda conn: 1)
    else:
        async def main() -> None:
            for providers, op in zip(given, (traced, untraced), strict=True):
                async with async_store_class().from_url(f"sqlite+aiosqlite:///{path}", table_prefix="own_",
                                                        **providers) as store:
                    await store.create_tables()

                    async def effect(conn: Any) -> int:
                        return 1

                    for run_op, key in runs:
                        if run_op == op:
                            await store.run(scope="s", operation=op, key=key, request={}, effect=effect)

        asyncio.run(main())

    assert own.tally("idempotency.outcomes", traced) == {"claimed": 2, "replayed": 1}
    assert own.tally("idempotency.outcomes", untraced) == {"claimed": 1, "replayed": 1}
    assert own.tally("idempotency.run.duration", untraced) == {"claimed": 1, "replayed": 1}
    spans = Counter((s.attributes["idempotency.operation"], s.attributes["idempotency.outcome"]) for s in own.spans())
    assert spans == {(traced, "claimed"): 2, (traced, "replayed"): 1}
    assert not otel.tally("idempotency.outcomes", traced) and not otel.tally("idempotency.outcomes", untraced)
    assert not [s for s in otel.spans() if s.attributes and s.attributes.get("idempotency.operation") in (traced,
                                                                                                          untraced)]


class _Transient(TransientError):
    cause = RetryCause.CLAIM_RACE


@pytest.mark.parametrize("api", ["sync", "async"])
def test_no_key_scope_or_payload_in_any_span_or_metric_attribute(otel: Sdk, tmp_path: Path, api: str) -> None:
    """Every attribute of every span, event and metric point exported so far in this process is searched."""
    secret = f"SECRET{uuid.uuid4().hex[:8]}"
    ident = {"scope": f"scope-{secret}", "operation": "op", "request": {"card": f"payload-{secret}"}}
    tracer = otel.tracer_provider.get_tracer("test")
    if api == "sync":
        with IdempotencyStore.from_url(f"sqlite:///{tmp_path / 's.db'}") as store:
            store.create_tables()
            store.run(**ident, key=f"key-{secret}", effect=lambda conn: f"response-{secret}")
            store.run(**ident, key=f"key-{secret}", effect=_fail)
            with pytest.raises(RequestMismatch):
                store.run(**ident | {"request": secret}, key=f"key-{secret}", effect=_fail)

            def boom(conn: Any) -> Any:
                raise ValueError(f"effect failed for {secret}")

            with pytest.raises(ValueError):
                store.run(**ident, key=f"key2-{secret}", effect=boom, lease=LEASE)
            with tracer.start_as_current_span("caller"), store.transaction() as conn:  # the claim notes an event
                store.claim(conn, **ident, key=f"key3-{secret}")
                store.accept_message(conn, subscriber="projection", message_id=f"msg-{secret}", payload=secret)
    else:
        async def main() -> None:
            async with async_store_class().from_url(f"sqlite+aiosqlite:///{tmp_path / 'a.db'}") as store:
                await store.create_tables()

                async def respond(conn: Any) -> str:
                    return f"response-{secret}"

                async def boom(conn: Any) -> Any:
                    raise ValueError(f"effect failed for {secret}")

                await store.run(**ident, key=f"key-{secret}", effect=respond)
                await store.run(**ident, key=f"key-{secret}", effect=_afail)
                with pytest.raises(RequestMismatch):
                    await store.run(**ident | {"request": secret}, key=f"key-{secret}", effect=_afail)
                with pytest.raises(ValueError):
                    await store.run(**ident, key=f"key2-{secret}", effect=boom)

        asyncio.run(main())

    found = every_attribute(otel)
    assert any("ValueError" in text for _, text in found)  # the failure is there, by its type only
    assert any("projection" in text for _, text in found) or api == "async"
    assert [where for where, text in found if secret in text] == []


@pytest.mark.parametrize("api", ["sync", "async"])
def test_sqlite_telemetry_names_the_database_file_never_its_path(otel: Sdk, tmp_path: Path, api: str) -> None:
    """db.namespace on SQLite is the file's name: the directory it sits in appears in no span or metric."""
    where = tmp_path / f"private-{uuid.uuid4().hex[:8]}"
    where.mkdir()
    op = f"ns-{uuid.uuid4().hex[:6]}"
    if api == "sync":
        with IdempotencyStore.from_url(f"sqlite:///{where / 'ns.db'}") as store:
            store.create_tables()
            store.run(scope="s", operation=op, key="k", request={}, effect=lambda conn: 1)
    else:
        async def main() -> None:
            async with async_store_class().from_url(f"sqlite+aiosqlite:///{where / 'ns.db'}") as store:
                await store.create_tables()

                async def effect(conn: Any) -> int:
                    return 1

                await store.run(scope="s", operation=op, key="k", request={}, effect=effect)

        asyncio.run(main())
    spans = [s for s in otel.spans() if s.attributes.get("idempotency.operation") == op]
    points = [attrs for _, attrs, _ in otel.points() if attrs.get("idempotency.operation") == op]
    assert spans and points
    assert {s.attributes["db.namespace"] for s in spans} | {a["db.namespace"] for a in points} == {"ns.db"}
    assert [place for place, text in every_attribute(otel) if where.name in text] == []


def test_consumed_messages_are_counted_where_every_consumer_form_is(otel: Sdk, tmp_path: Path) -> None:
    """`consume` (and so every broker adapter) counts its messages through the same hook as `accept_message`."""
    subscriber = f"consumer-{uuid.uuid4().hex[:6]}"
    with IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'c.db'}", table_prefix="c_") as store:
        store.create_tables()
        for message_id, payload in [("m1", "a"), ("m1", "a"), ("m2", "b"), ("m1", "changed")]:
            store.consume(subscriber=subscriber, message_id=message_id, payload=payload, handler=lambda conn: 1)
    messages = Counter({attrs["idempotency.outcome"]: p.value for name, attrs, p in otel.points()
                        if name == "idempotency.messages" and attrs["idempotency.subscriber"] == subscriber})
    assert messages == {"accepted": 2, "duplicate": 1, "mismatch": 1}
