"""The URL options idem-dialects consumes (failover_window, pooler, purge, writers): read into features, checked
before any connection, kept from the driver, turned into driver settings; and the store's warning about a retry
budget shorter than the declared failover window. No server needed."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from sqlalchemy import create_engine, make_url

from idem_dialects import IdempotencyStore, IdemWarning, RetryPolicy
from idem_dialects.dialects import load
from idem_dialects.dialects.options import driver_url
from idem_dialects.errors import InvalidURLOption

pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'idem-dialects[postgresql]')")
PG = "postgresql+psycopg://u@localhost/db"


def _features(url: str) -> Any:
    parsed = make_url(url)
    return load(parsed.get_backend_name()).url_features(parsed)


def test_options_become_features() -> None:
    assert _features(f"{PG}?failover_window=12.5").failover_window == 12.5
    assert _features(PG).failover_window is None and _features(PG).session_state
    assert not _features(f"{PG}?pooler=transaction").session_state
    assert _features(f"{PG}?pooler=session").session_state
    assert _features("mariadb+pymysql://u@h/db?writers=single&failover_window=10").failover_window == 10


@pytest.mark.parametrize(("url", "problem"), [
    (f"{PG}?failover_window=soon", "'soon' is not a positive number of seconds"),
    (f"{PG}?failover_window=0", "'0' is not a positive number of seconds"),
    (f"{PG}?failover_window=nan", "'nan' is not a positive number of seconds"),
    (f"{PG}?pooler=statement", "'statement' is not one of session, transaction"),
    (f"{PG}?pooler=transaction&pooler=session", "given more than once"),
    (f"{PG}?writers=single", "the postgresql backend has no such option (it has: failover_window, pooler, purge)"),
    ("mariadb+pymysql://u@h/db?pooler=transaction", "the mariadb backend has no such option"),
    ("mariadb+pymysql://u@h/db?writers=one", "'one' is not one of all, single"),
    ("sqlite:///x.db?failover_window=5", "the sqlite backend has no such option (it has: none)"),
])
@pytest.mark.filterwarnings("ignore:Query string argument")  # SQLAlchemy about sqlite:///x.db?failover_window
def test_wrong_options_fail_before_any_connection(url: str, problem: str) -> None:
    with pytest.raises(InvalidURLOption) as err:
        IdempotencyStore.from_url(url)
    assert problem in str(err.value) and err.value.option in str(err.value)


def test_options_never_reach_the_driver() -> None:
    """The do_connect listener takes the options out of the driver's connect() arguments; a plain connection (no
    store) uses `driver_url`."""
    url = f"{PG}?pooler=transaction&failover_window=15&connect_timeout=3"
    store = IdempotencyStore.from_url(url, retry=RetryPolicy(total=20))
    params: dict[str, Any] = dict(store.engine.dialect.create_connect_args(store.engine.url)[1])
    assert {"pooler", "failover_window"} <= set(params)
    store.engine.dialect.dispatch.do_connect(store.engine.dialect, None, [], params)
    assert "pooler" not in params and "failover_window" not in params
    assert params["connect_timeout"] == "3" and params["prepare_threshold"] is None
    assert driver_url(make_url(url)).render_as_string() == f"{PG}?connect_timeout=3"
    store.close()


@pytest.mark.parametrize(("driver", "expected"), [
    ("psycopg", {"prepare_threshold": None}),
    ("asyncpg", {"statement_cache_size": 0, "prepared_statement_cache_size": 0}),
])
def test_transaction_pooler_turns_prepared_statements_off(driver: str, expected: dict[str, Any]) -> None:
    """The backend's do_connect listener turns the driver's prepared statements off for a declared pooler, and marks
    the connection's pool record so (a lost prepared statement there is then the caller's own error); a plain URL's
    first connection goes without them too, marked to ask whether a pooler is in front; ``pooler=session`` keeps
    them."""
    pytest.importorskip(driver)

    class Record:
        info: dict[str, Any]

        def __init__(self) -> None:
            self.info = {}

    def connect(url: str) -> tuple[dict[str, Any], dict[str, Any]]:
        engine = create_engine(url)
        try:
            load("postgresql")(engine)
            params: dict[str, Any] = {}
            record = Record()
            engine.dialect.dispatch.do_connect(engine.dialect, record, [], params)
            return params, record.info
        finally:
            engine.dispose()

    params, info = connect(f"postgresql+{driver}://u@h/db?pooler=transaction")
    assert expected.items() <= params.items() and info == {"idem_dialects.unprepared": True}
    if driver == "asyncpg":  # PostgreSQL's unnamed statement: nothing outlives its execution
        assert params["prepared_statement_name_func"]() == ""
    params, info = connect(f"postgresql+{driver}://u@h/db")
    assert expected.items() <= params.items()
    assert info == {"idem_dialects.unprepared": True, "idem_dialects.pooler_probe": True}
    assert connect(f"postgresql+{driver}://u@h/db?pooler=session") == ({}, {})


def test_short_retry_budget_warns_once() -> None:
    url = f"{PG}?failover_window=50"
    with pytest.warns(IdemWarning, match=r"RetryPolicy.total = 45 s\) is shorter than .* failover window \(50 s"):
        store = IdempotencyStore.from_url(url)
    store.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        IdempotencyStore.from_url(url, retry=RetryPolicy(total=60)).close()
        IdempotencyStore.from_url(PG, retry=RetryPolicy(total=1)).close()  # no window declared: nothing to say


def test_the_default_retry_budget_covers_a_default_patroni_failover() -> None:
    """Patroni left at its defaults keeps a dead leader's key for up to its ttl (30 s), then promotes the replica:
    measured 23.7-24.7 s from the kill to the first acknowledgement (tools/failover_window.py default). The default
    budget covers the worst case, the whole ttl plus a loop, so no caller gets RetriesExhausted; a stack that takes
    longer says so in the URL and the store warns."""
    from idem_dialects.engines.patroni import DEFAULT_TIMING

    ttl, loop_wait, _ = DEFAULT_TIMING
    assert RetryPolicy().total >= ttl + loop_wait > 24.7
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a window the default budget covers: no warning
        IdempotencyStore.from_url(f"{PG}?failover_window=40").close()
