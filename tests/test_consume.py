"""The idempotent consumer (`consume`) on every live engine, through both stores: the handler and the message's
record in one transaction, a redelivery acknowledged without the handler, a changed payload routed to the caller's
dead-letter decision, the handler's error unchanged, racing duplicates applied once, retention by `purge`."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from async_common import async_store_class
from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select
from sqlalchemy.engine import URL, Connection

from idem_dialects import (
    AsyncMisuse,
    Delivery,
    Disposition,
    IdempotencyStore,
    InvalidKey,
    InvalidPayload,
    RequestMismatch,
)
from idem_dialects.errors import MissingDriver
from idem_dialects.url import async_url


class Applied:
    """`<prefix>applied`: one row per handler run that committed (no unique key: a second run would show)."""

    def __init__(self, store: IdempotencyStore) -> None:
        self.engine = store.engine
        self.table = Table(f"{store.table_prefix}applied", MetaData(), Column("message_id", String(64)),
                           Column("amount", Integer))

    def handler(self, message_id: str, amount: int = 1, calls: list[str] | None = None) -> Any:
        def apply(conn: Connection) -> str:
            if calls is not None:
                calls.append(message_id)
            conn.execute(insert(self.table).values(message_id=message_id, amount=amount))
            return f"applied {message_id}"

        return apply

    def count(self, message_id: str | None = None) -> int:
        stmt = select(func.count()).select_from(self.table)
        if message_id is not None:
            stmt = stmt.where(self.table.c.message_id == message_id)
        with self.engine.connect() as conn:
            return int(conn.execute(stmt).scalar_one())


@pytest.fixture
def store(live_engine: Any) -> Iterator[IdempotencyStore]:
    with IdempotencyStore.from_url(live_engine.url, table_prefix=f"cons_{uuid.uuid4().hex[:8]}_") as made:
        made.create_tables()
        applied = Applied(made)
        applied.table.create(made.engine)
        try:
            yield made
        finally:
            applied.table.drop(made.engine)
            made.drop_tables()


def test_redelivery_is_acknowledged_without_running_the_handler(store: IdempotencyStore) -> None:
    applied, calls = Applied(store), []
    first = store.consume(subscriber="billing", message_id="m-1", payload=b"debit 5",
                          handler=applied.handler("m-1", calls=calls))
    assert first == Delivery(Disposition.ACK, duplicate=False, value="applied m-1")
    for _ in range(3):
        again = store.consume(subscriber="billing", message_id="m-1", payload=b"debit 5",
                              handler=applied.handler("m-1", calls=calls))
        assert again == Delivery(Disposition.ACK, duplicate=True)
    assert calls == ["m-1"] and applied.count("m-1") == 1
    # Another subscriber of the same message is another consumer: it runs its own handler once.
    other = store.consume(subscriber="audit", message_id="m-1", payload=b"debit 5", handler=applied.handler("m-1"))
    assert not other.duplicate and applied.count("m-1") == 2


def test_changed_payload_goes_to_the_callers_dead_letter_decision(store: IdempotencyStore) -> None:
    applied = Applied(store)
    store.consume(subscriber="s", message_id="m", payload={"amount": 5}, handler=applied.handler("m"))
    changed = store.consume(subscriber="s", message_id="m", payload={"amount": 6}, handler=applied.handler("m"))
    assert changed.disposition is Disposition.DEAD_LETTER and not changed.duplicate  # the default
    assert isinstance(changed.mismatch, RequestMismatch) and changed.mismatch.key == "m"
    acked = store.consume(subscriber="s", message_id="m", payload={"amount": 6}, handler=applied.handler("m"),
                          on_mismatch=Disposition.ACK)
    assert acked.disposition is Disposition.ACK and acked.mismatch is not None
    seen: list[RequestMismatch] = []

    def decide(mismatch: RequestMismatch) -> Disposition:
        seen.append(mismatch)
        return Disposition.RETRY

    held = store.consume(subscriber="s", message_id="m", payload={"amount": 6}, handler=applied.handler("m"),
                         on_mismatch=decide)
    assert held.disposition is Disposition.RETRY and seen == [held.mismatch]
    assert applied.count("m") == 1  # the handler never ran for the changed payload

    class Stop(Exception):
        pass

    def refuse(mismatch: RequestMismatch) -> Disposition:
        raise Stop

    with pytest.raises(Stop):
        store.consume(subscriber="s", message_id="m", payload={"amount": 6}, handler=applied.handler("m"),
                      on_mismatch=refuse)


def test_handler_error_reaches_the_caller_and_records_nothing(store: IdempotencyStore) -> None:
    applied = Applied(store)
    failure = LookupError("no such account")

    def failing(conn: Connection) -> None:
        applied.handler("m")(conn)  # written, then rolled back with the record
        raise failure

    with pytest.raises(LookupError) as err:
        store.consume(subscriber="s", message_id="m", payload=b"x", handler=failing)
    assert err.value is failure and applied.count() == 0
    retried = store.consume(subscriber="s", message_id="m", payload=b"x", handler=applied.handler("m"))
    assert not retried.duplicate and applied.count("m") == 1


def test_racing_duplicates_run_the_handler_once(store: IdempotencyStore) -> None:
    """The same message delivered to several consumers at once (a duplicate publish, a redelivery racing a slow
    first delivery): one handler run commits, every other delivery is a duplicate."""
    applied = Applied(store)
    workers = 4 if store.features.concurrent_connections else 1
    for round_ in range(10):
        message_id, barrier = f"race-{round_}", threading.Barrier(workers)
        outcomes: list[Delivery] = []

        def consume(message_id: str = message_id, barrier: threading.Barrier = barrier,
                    outcomes: list[Delivery] = outcomes) -> None:
            barrier.wait()
            outcomes.append(store.consume(subscriber="s", message_id=message_id, payload=b"p",
                                          handler=applied.handler(message_id)))

        threads = [threading.Thread(target=consume) for _ in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(o.duplicate for o in outcomes) == [False] + [True] * (workers - 1)
        assert applied.count(message_id) == 1


def test_bad_input_is_refused_before_any_sql(store: IdempotencyStore) -> None:
    applied = Applied(store)

    async def async_handler(conn: Any) -> None:
        pass

    with pytest.raises(InvalidKey):
        store._inbox.consume(subscriber="s", message_id="")  # the flow is refused before it is driven
    with pytest.raises(InvalidKey):
        store.consume(subscriber="s", message_id="", handler=async_handler)  # the id first, then the handler
    with pytest.raises(AsyncMisuse, match="handler is an `async def` function"):
        store.consume(subscriber="s", message_id="m", handler=async_handler)
    with pytest.raises(InvalidPayload, match="on_mismatch"):
        store.consume(subscriber="s", message_id="m", handler=applied.handler("m"), on_mismatch="ack")  # type: ignore[arg-type]
    with pytest.raises(InvalidPayload, match="handler"):
        store.consume(subscriber="s", message_id="m", handler=None)  # type: ignore[arg-type]
    assert applied.count() == 0


def test_purge_forgets_processed_messages_past_the_window(store: IdempotencyStore) -> None:
    """Retention as for requests: a message older than the window is forgotten (a redelivery after that would run
    the handler again, so the window must outlast the broker's redelivery horizon); a newer one is kept."""
    applied = Applied(store)
    store.consume(subscriber="s", message_id="old", handler=applied.handler("old"))
    assert store.purge(older_than=timedelta(hours=1)) == 0
    assert store.consume(subscriber="s", message_id="old", handler=applied.handler("old")).duplicate
    assert store.purge(older_than=timedelta(0)) == 1
    assert not store.consume(subscriber="s", message_id="old", handler=applied.handler("old")).duplicate


def test_async_store_consumes_the_same_way(store: IdempotencyStore) -> None:
    applied = Applied(store)
    url: URL = store.engine.url
    try:
        aurl = async_url(url)
    except MissingDriver as exc:
        pytest.skip(f"no async driver for {url.get_backend_name()}: {exc}")

    aio_store = async_store_class()

    async def main() -> list[Delivery]:
        async with aio_store.from_url(aurl, table_prefix=store.table_prefix) as aio:
            async def handler(conn: Any) -> Any:
                return await conn.run_sync(applied.handler("a-1"))

            async def failing(conn: Any) -> None:
                raise KeyError("bad")

            with pytest.raises(KeyError):
                await aio.consume(subscriber="s", message_id="a-1", payload=b"p", handler=failing)
            with pytest.raises(AsyncMisuse, match="handler must be an `async def`"):
                await aio.consume(subscriber="s", message_id="a-1", handler=lambda conn: None)
            racing = await asyncio.gather(*(aio.consume(subscriber="s", message_id="a-1", payload=b"p",
                                                        handler=handler) for _ in range(3)))
            changed = await aio.consume(subscriber="s", message_id="a-1", payload=b"q", handler=handler,
                                        on_mismatch=Disposition.ACK)
            return [*racing, changed]

    *racing, changed = asyncio.run(main())
    assert sorted(d.duplicate for d in racing) == [False, True, True] and applied.count("a-1") == 1
    assert changed.disposition is Disposition.ACK and changed.mismatch is not None
