"""One error vocabulary, typed features and the store's guards: what every backend shares, checked without a server
where none is needed (SQLite otherwise)."""

from __future__ import annotations

import logging
import sqlite3
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from idem_dialects_bench.workload import call_with_retry
from sqlalchemy import create_engine, event
from sqlalchemy.pool import StaticPool

import idem_dialects as idem
from idem_dialects.conformance.support import StatementLog
from idem_dialects.dialects import load, names
from idem_dialects.dialects.base import configured_isolation
from idem_dialects.retry import RetryPolicy


def test_http_statuses() -> None:
    assert idem.InvalidKey.http_status == idem.InvalidPayload.http_status == 400
    assert idem.RequestMismatch.http_status == 422
    assert idem.RequestInFlight.http_status == idem.LeaseLost.http_status == 409
    assert idem.RetriesExhausted.http_status == idem.TransientError.http_status == 503
    assert idem.IdemError.http_status is None and idem.ConfigurationError.http_status is None


def test_keyed_and_transient_bases() -> None:
    for cls in (idem.RequestMismatch, idem.RequestInFlight, idem.LeaseLost):
        assert issubclass(cls, idem.KeyedError)
    assert idem.ClaimRaced.cause is idem.RetryCause.CLAIM_RACE
    assert idem.WinnerNotVisible.cause is idem.RetryCause.SERIALIZATION
    assert issubclass(idem.UnsupportedEngine, idem.ConfigurationError)
    assert issubclass(idem.UnsupportedIsolation, idem.ConfigurationError)
    lost = idem.LeaseLost("s", "op", "k", token="sk_secret_token")
    assert lost.token == "sk_secret_token" and "sk_secret_token" not in str(lost)


def test_every_exported_class_is_in_all() -> None:
    """The tests here use the vocabulary as `idem.<name>`, so each name they touch is exported; this checks the
    other direction without repeating the list: every class of ours the package exposes is in `__all__` (a star
    import and the docs see it), and every `__all__` entry resolves."""
    ours = {name for name, value in vars(idem).items()
            if isinstance(value, type) and value.__module__.startswith("idem_dialects.")}
    assert ours and ours <= set(idem.__all__)
    assert all(hasattr(idem, name) for name in idem.__all__)
    assert {"ClaimRaced", "WinnerNotVisible", "TransientError", "RetryCause", "Features", "IdemWarning"} <= ours


@pytest.mark.parametrize("backend", ["sqlite", "postgresql", "mysql", "mariadb", "mssql", "oracle"])
def test_every_backend_classifies_the_library_transient_errors(backend: str) -> None:
    cls = load(backend)
    classifier = cls.classifier(cls.__new__(cls))
    for exc in (idem.ClaimRaced("x"), idem.WinnerNotVisible("t")):
        assert classifier.retry_cause(exc) is exc.cause


def test_unknown_feature_names_the_known_ones() -> None:
    features = idem.Features()
    assert features.has("concurrent_connections")
    with pytest.raises(KeyError, match="known features: concurrent_connections, exclusive_claim, multi_primary,"
                                       " processes, session_state, synchronous_standby"):
        features.has("no_such_feature")


@pytest.mark.parametrize("backend", sorted(set(names()) & {"sqlite", "postgresql", "mysql", "mariadb", "mssql",
                                                            "oracle"}))
def test_backends_declare_their_features(backend: str) -> None:
    features = load(backend).base_features
    assert features.isolation_levels and "AUTOCOMMIT" not in features.isolation_levels
    assert set(idem.Features.flags()) <= set(features.as_json())


def test_private_isolation_attribute_still_exists() -> None:
    """create_engine(isolation_level=...) has no public accessor; configured_isolation reads a private attribute.
    If SQLAlchemy moves it, this fails loudly (instead of the guard silently letting AUTOCOMMIT through)."""
    engine = create_engine("sqlite://", isolation_level="AUTOCOMMIT", poolclass=StaticPool)
    assert engine.dialect._on_connect_isolation_level == "AUTOCOMMIT"
    assert configured_isolation(engine) == "AUTOCOMMIT"
    assert configured_isolation(create_engine("sqlite://").execution_options(isolation_level="SERIALIZABLE")) \
        == "SERIALIZABLE"


@pytest.mark.parametrize("level", ["AUTOCOMMIT", "READ UNCOMMITTED"])
def test_undeclared_isolation_refused_before_sql(tmp_path: Path, level: str) -> None:
    statements: list[str] = []
    engine = create_engine(f"sqlite:///{tmp_path / 'x.db'}", isolation_level=level)
    event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    with pytest.raises(idem.UnsupportedIsolation) as err:
        idem.IdempotencyStore(engine)
    assert err.value.level == level and err.value.supported == ("SERIALIZABLE",)
    assert "SERIALIZABLE" in str(err.value) and statements == []
    with pytest.raises(idem.UnsupportedIsolation):
        idem.IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'y.db'}", isolation_level=level)


def test_connection_level_autocommit_refused(tmp_path: Path) -> None:
    with idem.IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'x.db'}") as store:
        store.create_tables()
        with store.engine.connect() as conn:
            auto = conn.execution_options(isolation_level="AUTOCOMMIT")
            with pytest.raises(idem.UnsupportedIsolation):
                store.claim(auto, scope="s", operation="op", key="k", request={})


def test_driver_autocommit_on_a_callers_connection_refused_before_sql(tmp_path: Path) -> None:
    """The step-by-step API on a connection whose sqlite3 connection was put in autocommit mode directly (no
    SQLAlchemy isolation level): refused before any SQL, naming the setting; inside `store.transaction()`, where
    the backend itself sets isolation_level=None to issue its own BEGIN, the claim proceeds."""
    log = StatementLog()
    with idem.IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'x.db'}", statement_hook=log) as store:
        store.create_tables()
        statements = log.sql
        statements.clear()
        with store.engine.connect() as conn:
            conn.connection.dbapi_connection.isolation_level = None  # type: ignore[union-attr]
            with pytest.raises(idem.UnsupportedIsolation) as err:
                store.claim(conn, scope="s", operation="op", key="k", request={})
            conn.connection.dbapi_connection.isolation_level = ""  # type: ignore[union-attr]
        assert err.value.setting == "pysqlite's connect_args={'isolation_level': None}" and statements == []
        with store.transaction() as conn:
            assert isinstance(store.claim(conn, scope="s", operation="op", key="k", request={}), idem.Claimed)


class _AutocommitConnection(sqlite3.Connection):
    """sqlite3 as Python 3.12+ opens it with autocommit=True (commit() and rollback() then do nothing)."""

    autocommit = True


def test_sqlite3_autocommit_attribute_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    engine = create_engine("sqlite://", creator=lambda: sqlite3.connect(path, factory=_AutocommitConnection))
    store = idem.IdempotencyStore(engine)
    try:
        with pytest.raises(idem.UnsupportedIsolation, match="autocommit=True"):
            store.create_tables()
    finally:
        engine.dispose()


def test_close_disposes_only_an_engine_it_created(tmp_path: Path) -> None:
    disposed: list[str] = []
    with idem.IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'a.db'}") as store:
        event.listen(store.engine.pool, "close", lambda *a: disposed.append("own"))
        store.create_tables()
    assert disposed  # its pooled connection was closed
    engine = create_engine(f"sqlite:///{tmp_path / 'b.db'}")
    with idem.IdempotencyStore(engine) as theirs:
        theirs.create_tables()
    with engine.connect():  # still usable: the caller's engine was left alone
        pass
    engine.dispose()


def test_retries_and_exhaustion_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    failures = [idem.ClaimRaced("x"), idem.ClaimRaced("x")]

    def flaky() -> str:
        if failures:
            raise failures.pop()
        return "ok"

    def classify(exc: BaseException) -> idem.RetryCause | None:
        return exc.cause if isinstance(exc, idem.TransientError) else None

    with caplog.at_level(logging.INFO, logger="idem_dialects"):
        assert call_with_retry(RetryPolicy(total=5), classify, flaky) == "ok"
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.INFO]
    assert "claim race" in caplog.records[0].getMessage()
    caplog.clear()

    def always() -> Any:
        raise idem.ClaimRaced("x")

    with caplog.at_level(logging.INFO, logger="idem_dialects"), pytest.raises(idem.RetriesExhausted) as err:
        call_with_retry(RetryPolicy(total=0.05, initial=0.01, max_wait=0.02), classify, always)
    assert caplog.records[-1].levelno == logging.WARNING and "giving up" in caplog.records[-1].getMessage()
    assert err.value.causes == {idem.RetryCause.CLAIM_RACE: err.value.attempts}


def test_one_attempt_is_not_called_a_retry() -> None:
    with pytest.raises(idem.RetriesExhausted) as err:
        call_with_retry(RetryPolicy(max_attempts=1), lambda e: idem.RetryCause.DEADLOCK, lambda: (_ for _ in ()).throw(
            idem.ClaimRaced("x")))
    assert err.value.attempts == 1 and "after 1 attempt " in str(err.value) and "retried" not in str(err.value)


def test_takeover_and_lease_loss_are_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with idem.IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'x.db'}") as store:
        store.create_tables()
        with store.transaction() as conn:
            first = store.claim(conn, scope="s", operation="op", key="k", request={}, lease=timedelta(seconds=0.01))
        import time

        time.sleep(0.05)
        with caplog.at_level(logging.WARNING, logger="idem_dialects"):
            with store.transaction() as conn:
                store.claim(conn, scope="s", operation="op", key="k", request={}, lease=timedelta(seconds=30))
            with pytest.raises(idem.LeaseLost), store.transaction() as conn:
                store.complete(conn, first, {"token": "sk_live_secret"})  # type: ignore[arg-type]
    messages = [r.getMessage() for r in caplog.records]
    assert any("took over" in m for m in messages) and any("lost the claim" in m for m in messages)
    assert not any("sk_live_secret" in m or first.token in m for m in messages)  # type: ignore[union-attr]


def test_memory_sqlite_warning_has_its_category() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idem.IdempotencyStore(create_engine("sqlite://"))
    assert [w.category for w in caught] == [idem.IdemWarning]
