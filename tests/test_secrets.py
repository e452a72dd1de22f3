"""Nothing the user stored -- response, request, claim token -- appears in an exception or a log line, on every
live engine: `complete()` is made to fail (a CHECK constraint or trigger on the record table) with a response
holding ``sk_live_secret``, and every text of the error (str, repr, notes, chained causes and contexts, the
formatted traceback) and every log record is searched for it, its hex and the claim token."""

from __future__ import annotations

import asyncio
import logging
import traceback
import uuid
from importlib import import_module
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.exc import DBAPIError

from idem_dialects import AsyncIdempotencyStore, Claimed, IdempotencyStore

engines: Any = import_module("idem_dialects.engines")

SECRET = "sk_live_secret"
# What makes the fenced UPDATE of complete() fail on each engine (the table name is formatted in).
BREAK_COMPLETE = {
    "sqlite": "CREATE TRIGGER {t}_no BEFORE UPDATE ON {t} BEGIN SELECT RAISE(ABORT, 'complete refused'); END",
    # PostgreSQL's DETAIL for a CHECK violation repeats the whole row ("Failing row contains (...)").
    "postgresql": "ALTER TABLE {t} ADD CONSTRAINT {t}_small CHECK (response IS NULL OR length(response) < 5)",
    "mariadb": "ALTER TABLE {t} ADD CONSTRAINT {t}_small CHECK (response IS NULL OR length(response) < 5)",
}


def every_text(exc: BaseException) -> str:
    """All text an error carries: the formatted chain (causes, contexts, notes) plus each link's repr and args."""
    parts = ["".join(traceback.format_exception(exc))]
    seen: set[int] = set()
    link: BaseException | None = exc
    stack = [exc]
    while stack:
        link = stack.pop()
        if link is None or id(link) in seen:
            continue
        seen.add(id(link))
        parts += [str(link), repr(link), repr(link.args), *getattr(link, "__notes__", [])]
        if isinstance(link, DBAPIError):
            parts += [str(link.orig), repr(link.orig)]
        stack += [link.__cause__, link.__context__]  # type: ignore[list-item]
    return "\n".join(parts)


def forbidden(token: str) -> list[str]:
    return [SECRET, SECRET.encode().hex(), token]


@pytest.mark.parametrize("wrapped", [False, True], ids=["from_url", "wrapped-engine"])
def test_failing_complete_reveals_no_stored_value(live_engine: Any, wrapped: bool,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    if not wrapped:  # SQLAlchemy's engine log (statements; parameters unless hidden): the caller's choice for
        caplog.set_level(logging.INFO, logger="sqlalchemy.engine")  # an engine of their own (README: Secrets)
    prefix = f"sec_{uuid.uuid4().hex[:6]}_"
    if wrapped:  # the caller's engine, built without hide_parameters
        store = IdempotencyStore(create_engine(live_engine.url), table_prefix=prefix)
    else:
        store = IdempotencyStore.from_url(live_engine.url, table_prefix=prefix)
    store.create_tables()
    try:
        with store.engine.begin() as conn:
            conn.exec_driver_sql(BREAK_COMPLETE[store.backend.name].format(t=store.tables.records.name))
        with pytest.raises(DBAPIError) as err, store.transaction() as conn:
            claimed = store.claim(conn, scope="acct:1", operation="pay:v1", key="k1",
                                  request={"card": SECRET, "password": SECRET})
            assert isinstance(claimed, Claimed)
            store.complete(conn, claimed, {"token": SECRET, "blob": SECRET * 3})
        text = every_text(err.value)
        logged = "\n".join(r.getMessage() + repr(r.args) for r in caplog.records)
        for value in forbidden(claimed.token):
            assert value not in text, f"{value!r} leaked into the error:\n{text[-3000:]}"
            assert value not in logged, f"{value!r} leaked into a log line"
        assert "refused" in text or "small" in text  # the error still says what failed
        assert wrapped or any(r.name.startswith("sqlalchemy.engine") for r in caplog.records)
    finally:
        store.drop_tables()
        store.engine.dispose()


def test_the_effects_own_errors_keep_their_parameters(tmp_path: Any) -> None:
    """Only the store's statements are redacted: an effect's error on the caller's table reaches them unchanged."""
    engine = create_engine(f"sqlite:///{tmp_path / 'own.db'}")
    store = IdempotencyStore(engine)
    store.create_tables()
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE mine (v TEXT NOT NULL)")

    def effect(conn: Any) -> None:
        conn.exec_driver_sql("INSERT INTO mine (v) VALUES (?)", (None,))

    with pytest.raises(DBAPIError) as err:
        store.run(scope="s", operation="op", key="k", request={}, effect=effect)
    assert not err.value.hide_parameters and "[parameters: (None,)]" in str(err.value)
    engine.dispose()


def test_library_errors_never_carry_stored_values(tmp_path: Any) -> None:
    """Every error of the library's own a caller can provoke with a secret in the request, response, payload or claim:
    none repeats it (paths and type names only; fingerprints are hashes; the token stays an attribute)."""
    from datetime import timedelta
    from decimal import Decimal

    from idem_dialects import InvalidPayload, LeaseLost, RequestMismatch

    errors: list[BaseException] = []
    with IdempotencyStore.from_url(f"sqlite:///{tmp_path / 's.db'}") as store:
        store.create_tables()
        request = {"card": SECRET}
        store.run(scope="s", operation="op", key="k", request=request, effect=lambda conn: {"token": SECRET})
        with pytest.raises(RequestMismatch) as mismatch:
            store.run(scope="s", operation="op", key="k", request={"card": SECRET + "2"}, effect=lambda conn: 1)
        errors.append(mismatch.value)
        for bad in ({"token": SECRET, "amount": Decimal("1.10")}, {"token": SECRET, "n": float("nan")},
                    {"token": SECRET, "deep": [[[[SECRET]]]], "big": 10**5000}, {"token": SECRET, "s": {SECRET}}):
            with pytest.raises(InvalidPayload) as invalid:
                store.run(scope="s", operation="op", key="k2", request=bad, effect=lambda conn: 1)
            errors.append(invalid.value)
            with pytest.raises(InvalidPayload) as invalid:
                store.run(scope="s", operation="op", key="k3", request={}, effect=lambda conn, bad=bad: bad)
            errors.append(invalid.value)
        with store.transaction() as conn:
            store.accept_message(conn, subscriber="sub", message_id="m", payload={"card": SECRET})
        with pytest.raises(RequestMismatch) as redelivery, store.transaction() as conn:
            store.accept_message(conn, subscriber="sub", message_id="m", payload={"card": SECRET + "x"})
        errors.append(redelivery.value)
        with store.transaction() as conn:
            claimed = store.claim(conn, scope="s", operation="op", key="leased", request=request,
                                  lease=timedelta(seconds=60))
        assert isinstance(claimed, Claimed)
        with store.transaction() as conn:  # someone else completes it first, then our complete is fenced off
            store.complete(conn, claimed, {"token": SECRET})
        with pytest.raises(LeaseLost) as lost, store.transaction() as conn:
            store.complete(conn, claimed, {"token": SECRET})
        errors.append(lost.value)
    for error in errors:
        text = every_text(error)
        for value in forbidden(claimed.token):
            assert value not in text, f"{value!r} in {type(error).__name__}: {text[-2000:]}"


def test_from_url_engines_hide_parameters_sync_and_async(tmp_path: Any) -> None:
    """Both stores' from_url build engines with hide_parameters (no stored value in an error or SQLAlchemy's echo),
    unless the caller says otherwise."""
    sync = IdempotencyStore.from_url(f"sqlite:///{tmp_path / 's.db'}")
    shown = IdempotencyStore.from_url(f"sqlite:///{tmp_path / 's.db'}", hide_parameters=False)
    asyn = AsyncIdempotencyStore.from_url(f"sqlite+aiosqlite:///{tmp_path / 'a.db'}")
    try:
        assert sync.engine.hide_parameters and asyn.engine.sync_engine.hide_parameters
        assert not shown.engine.hide_parameters
    finally:
        sync.close(), shown.close()
        asyncio.run(asyn.close())
