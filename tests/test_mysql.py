"""MySQL/MariaDB backend on a live server: byte-exact keys under hostile collations and charsets, duplicate
detection by error code only, locking reads for the loser, and the classification of retryable errors.

Servers come from the engine catalogue: ``mariadb`` (IDEM_URL_MARIADB, the local service on 127.0.0.1:3306, or a
container) and ``mysql-8.4`` (IDEM_URL_MYSQL_8_4 or a container); each check skips with the reason when its server
cannot be had. On MariaDB every check runs through both backend names (``mariadb`` and ``mysql``); on MySQL only
through ``mysql``. The user must be allowed to create databases (the charset/collation checks make their own).

The loser's reads, retryable errors and engine facts: tests/test_mysql_concurrency.py.
"""

from __future__ import annotations

import secrets
import unicodedata
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from mysql_common import *  # noqa: F403  (fixtures: admin, make_database, make_store, server, server_url)
from mysql_common import BACKENDS, REQ, _records, _respond
from sqlalchemy import Column, MetaData, Table, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DataError, IntegrityError
from sqlalchemy.schema import CreateTable

from idem_dialects import IdempotencyStore, InvalidKey
from idem_dialects.conformance.support import Effects
from idem_dialects.dialects.mysql_errors import error_code

# --- schema ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_schema_is_byte_exact_and_fits_the_index(make_store: Callable[..., IdempotencyStore], backend: str) -> None:
    """Identity columns are VARBINARY(1020) (no collation, NO PAD); tables are InnoDB with DYNAMIC rows and a
    utf8mb4 default; responses are LONGBLOB; times are DATETIME(6)."""
    store = make_store(backend)
    with store.engine.connect() as conn:
        for table in (store.tables.records, store.tables.messages):
            ddl = conn.exec_driver_sql(f"SHOW CREATE TABLE {table.name}").one()[1].lower()
            assert "engine=innodb" in ddl and "row_format=dynamic" in ddl and "charset=utf8mb4" in ddl
            for column in table.primary_key.columns:
                assert f"`{column.name}` varbinary(1020) not null" in ddl
        ddl = conn.exec_driver_sql(f"SHOW CREATE TABLE {store.tables.records.name}").one()[1].lower()
        assert "`response` longblob" in ddl and "`locked_until` datetime(6) not null" in ddl
        assert "`claim_token` varchar(64) character set ascii collate ascii_bin not null" in ddl


@pytest.mark.parametrize("backend", BACKENDS)
def test_create_tables_draws_no_warning(make_store: Callable[..., IdempotencyStore], backend: str) -> None:
    """The tables' DDL is warning-free: a named primary key would draw 1280 ("Name ... ignored for PRIMARY key"),
    which asyncmy logs on every create_tables."""
    store = make_store(backend)
    with store.engine.connect() as conn:
        for table in (store.tables.records, store.tables.messages):
            conn.exec_driver_sql(f"DROP TABLE {table.name}")  # created again by the same DDL, on this session
            conn.exec_driver_sql(str(CreateTable(table).compile(conn)))
            assert conn.exec_driver_sql("SHOW WARNINGS").all() == []


def test_utf8mb4_bin_pads_spaces(admin: Engine) -> None:
    """Why keys are VARBINARY: even the binary utf8mb4 collation ignores trailing spaces in a unique index."""
    name = f"idem_pad_{secrets.token_hex(3)}"
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE TEMPORARY TABLE {name} (k VARCHAR(10) CHARACTER SET utf8mb4 "
                             f"COLLATE utf8mb4_bin PRIMARY KEY) ENGINE=InnoDB")
        conn.exec_driver_sql(f"INSERT INTO {name} VALUES ('k')")
        with pytest.raises(IntegrityError) as err:
            conn.exec_driver_sql(f"INSERT INTO {name} VALUES ('k ')")
        assert error_code(err.value) == 1062


# --- byte-exact keys ---------------------------------------------------------------------------------------

NFC, NFD = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
KEYS = [
    "key", "Key", "KEY", "kéy", "key ", " key", "ke y", "key\t", "key\n", "key  ",
    NFC, NFD, "cafe", "CAFÉ",
    "ß", "ss", "\u00a0key", "k\u200bey",
    "\U0001f600", "\U0001f601", "\U0001f600 ", "key\U0001f600",
    "a" * 255, "a" * 254 + "A", "\U0001f600" * 255, "\U0001f600" * 254 + "\U0001f601",
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("db_options", "charset"), [
    ("CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci", None),
    ("CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci", "latin1"),
    ("CHARACTER SET latin1 COLLATE latin1_swedish_ci", None),
    ("CHARACTER SET latin1 COLLATE latin1_swedish_ci", "latin1"),
], ids=["ci-db", "ci-db-latin1-conn", "latin1-db", "latin1-db-latin1-conn"])
def test_keys_are_byte_exact(make_database: Callable[[str], str], make_store: Callable[..., IdempotencyStore],
                             backend: str, db_options: str, charset: str | None) -> None:
    """Keys differing by case, accent, normalization form, whitespace anywhere or a 4-byte character are
    distinct records, in a case-insensitive database and a latin1 one, over a utf8mb4 or latin1 connection;
    255-character keys (1020 bytes in every identity column) fit the index."""
    assert len(set(KEYS)) == len(KEYS) and NFC != NFD
    store = make_store(backend, make_database(db_options), charset)
    if charset:
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT @@character_set_connection").scalar() == charset
    for key in KEYS:
        result = store.run(scope="s", operation="op", key=key, request=REQ, effect=_respond(key))
        assert not result.replayed, f"{key!r} collided with an earlier key"
    for scope, operation in [("S", "op"), ("s ", "op"), ("s", "OP"), ("s", "op "), ("é", "op"), ("e\u0301", "op")]:
        result = store.run(scope=scope, operation=operation, key="key", request=REQ, effect=lambda conn: "x")
        assert not result.replayed, f"{scope!r}/{operation!r} collided"
    wide = "\U0001f600" * 255
    fill = "\U0001f600" * 169 + "abc"  # 1020 + 1 + 679 = 1700 bytes: the widest identity every engine takes
    assert not store.run(scope=wide, operation="o", key=fill, request=REQ, effect=lambda conn: "wide").replayed
    with pytest.raises(InvalidKey, match="1700"):  # 3 x 1020 bytes would fit InnoDB, but not every engine
        store.run(scope=wide, operation=wide, key=wide, request=REQ, effect=lambda conn: "never")
    for key in KEYS:
        again = store.run(scope="s", operation="op", key=key, request=REQ, effect=lambda conn: "never")
        assert again.replayed and again.response == key
    stored = [(r.scope, r.operation, r.idem_key) for r in _records(store)]
    assert len(stored) == len(KEYS) + 7
    assert {k for s, o, k in stored if (s, o) == ("s", "op")} == set(KEYS)
    assert (wide, "o", fill) in stored


@pytest.mark.parametrize("backend", BACKENDS)
def test_message_ids_are_byte_exact(make_database: Callable[[str], str],
                                    make_store: Callable[..., IdempotencyStore], backend: str) -> None:
    """Processed-message identities compare byte for byte too."""
    store = make_store(backend, make_database("CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci"))
    ids = ["m", "M", "m ", " m", NFC, NFD, "\U0001f600"]
    with store.transaction() as conn:
        assert all(store.accept_message(conn, subscriber="sub", message_id=m) for m in ids)
    with store.transaction() as conn:
        assert not any(store.accept_message(conn, subscriber="sub", message_id=m) for m in ids)
        assert store.accept_message(conn, subscriber="SUB", message_id="m")


# --- duplicates: by error code, only for the primary key ----------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_only_a_primary_key_duplicate_is_a_duplicate(make_store: Callable[..., IdempotencyStore],
                                                     backend: str) -> None:
    """insert_if_absent returns False only when the primary key row exists; a 1062 from another unique index,
    NOT NULL (1048) and an over-long value (1406, strict mode even if the session had none) all propagate,
    and a duplicate leaves the transaction usable."""
    store = make_store(backend, connect_args={"init_command": "SET SESSION sql_mode=''"})
    b = store.backend
    metadata = MetaData()
    table = Table(f"{store.table_prefix}uq", metadata, Column("k", b.columns.key, primary_key=True),
                  Column("u", b.columns.key, nullable=False, unique=True), **b.columns.table_options)
    metadata.create_all(store.engine)

    def insert(conn: Any, values: dict[str, Any]) -> bool:
        return store.drive(b.insert_if_absent(table, values), conn)  # the backend's statement flow, on conn

    try:
        with store.transaction() as conn:
            assert insert(conn, {"k": "a", "u": "x"})
            assert not insert(conn, {"k": "a", "u": "y"})
            with pytest.raises(IntegrityError) as err:
                insert(conn, {"k": "b", "u": "x"})  # the other unique index
            assert error_code(err.value) == 1062
            with pytest.raises(IntegrityError) as err:
                insert(conn, {"k": "c", "u": None})
            assert error_code(err.value) == 1048
            with pytest.raises(DataError) as too_long:
                insert(conn, {"k": "d" * 1021, "u": "z"})
            assert error_code(too_long.value) == 1406
            assert "STRICT" in conn.exec_driver_sql("SELECT @@SESSION.sql_mode").scalar_one()
            assert insert(conn, {"k": "e", "u": "w"})  # still the same live transaction
        with store.engine.connect() as conn:
            assert sorted(conn.execute(select(table.c.k)).scalars()) == ["a", "e"]
    finally:
        metadata.drop_all(store.engine)


@pytest.mark.parametrize("lease", [None, timedelta(seconds=30)], ids=["atomic", "leased"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_effect_unique_violation_surfaces(make_store: Callable[..., IdempotencyStore], backend: str,
                                          lease: timedelta | None) -> None:
    """An effect violating its own unique index raises that IntegrityError (1062 on the effect's table) from
    run, once, not retried, and leaves no idempotency record behind."""
    store = make_store(backend)
    effects = Effects(store)
    effects.create()
    try:
        with store.engine.begin() as conn:
            effects.apply(conn, "seed", ref="dup")
        calls = []

        def effect(conn: Connection) -> Any:
            calls.append(1)
            return effects.apply(conn, "k", ref="dup")

        with pytest.raises(IntegrityError) as err:
            store.run(scope="s", operation="op", key="k", request=REQ, effect=effect, lease=lease)
        assert error_code(err.value) == 1062 and effects.table.name in str(err.value.statement)
        assert calls == [1] and store.retries == {}
        assert _records(store) == [] and effects.per_key() == {"seed": 1}
    finally:
        effects.drop()
