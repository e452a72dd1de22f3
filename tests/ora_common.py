"""Oracle test helpers shared by tests/test_oracle*.py: an engine that never connects, compiled SQL, real
python-oracledb exception objects, and a scripted connection for the read paths (skipped without oracledb)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from datetime import datetime
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import oracle
from sqlalchemy.engine import Dialect, Engine

from idem_dialects.dialects.oracle import (
    OracleBackend,
)
from idem_dialects.fingerprint import encode_response

oracledb = pytest.importorskip("oracledb")
ora_errors = importlib.import_module("oracledb.errors")  # whose _Error the thin driver raises with (not re-exported)

CLOSED_PORT_URL = "oracle+oracledb://u:p@127.0.0.1:1/?service_name=FREEPDB1"
REQ = {"amount": 100}


# --- helpers ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    """An oracle+oracledb engine that is never connected (port 1 is closed): its dialect is the real one."""
    eng = create_engine(CLOSED_PORT_URL)
    yield eng
    eng.dispose()


@pytest.fixture
def backend(engine: Engine) -> OracleBackend:
    return OracleBackend(engine)


def sql(stmt: Any, dialect: Dialect | None = None) -> str:
    return " ".join(str(stmt.compile(dialect=dialect or oracle.dialect())).split())


def bound(compiled: Any, dialect: Dialect, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The parameters as the driver receives them (after each type's bind processor)."""
    out = {}
    for name, value in compiled.construct_params(params).items():
        proc = compiled.binds[name].type.dialect_impl(dialect).bind_processor(dialect)
        out[name] = proc(value) if proc else value
    return out


def ora_error(code: int, message: str) -> Exception:
    """Exactly what python-oracledb thin mode raises for a server error: it builds
    ``errors._Error(message, code=<number from the wire>, offset=...)`` and raises ``error.exc_type(error)``."""
    err = ora_errors._Error(message, code=code, offset=0)
    return err.exc_type(err)  # type: ignore[no-any-return]


def wrapped(orig: Exception, engine: Engine, statement: str = "INSERT INTO idem_records ...") -> sa_exc.DBAPIError:
    """Wrap a driver error the way SQLAlchemy's Connection does (class chosen by name, disconnect detected)."""
    dialect = engine.dialect
    wrapped_exc = sa_exc.DBAPIError.instance(
        statement, {}, orig, dialect.loaded_dbapi.Error,
        connection_invalidated=dialect.is_disconnect(orig, None, None), dialect=dialect,
    )
    assert isinstance(wrapped_exc, sa_exc.DBAPIError)
    return wrapped_exc


ORA_00001 = ("ORA-00001: unique constraint (APP.IDEM_RECORDS_PK) violated on table APP.IDEM_RECORDS columns"
             " (SCOPE, OPERATION, IDEM_KEY)\nORA-03301: (ORA-00001 details) row with column values"
             " (SCOPE:'73', OPERATION:'6F70', IDEM_KEY:'6B') already exists")
ORA_01400 = 'ORA-01400: cannot insert NULL into ("APP"."IDEM_RECORDS"."IDEM_KEY")'
ORA_02291 = "ORA-02291: integrity constraint (APP.FK_ACCT) violated - parent key not found"
# Adversarial: constraint names are user text, so the message can say anything.
ORA_02291_SAYS_00001 = ('ORA-02291: integrity constraint (APP."ORA-00001: unique constraint violated") violated'
                        " - parent key not found")
ORA_08177 = "ORA-08177: can't serialize access for this transaction"
ORA_00060 = "ORA-00060: deadlock detected while waiting for resource"
ORA_00054 = "ORA-00054: resource busy and acquire with NOWAIT specified or timeout expired"
ORA_30006 = "ORA-30006: resource busy; acquire with WAIT timeout expired"
ORA_03113 = "ORA-03113: end-of-file on communication channel"


class Result:
    def __init__(self, row: Any = None, rowcount: int = 1) -> None:
        self.row, self.rowcount = row, rowcount

    def first(self) -> Any:
        return self.row

    def all(self) -> list[Any]:
        return [] if self.row is None else [self.row]

    def close(self) -> None:
        """What SQLAlchemy's loop does with a result whose rows it does not read."""


class ScriptedConnection:
    """Stands in for a Connection to Oracle: compiles each statement with the real oracledb dialect, records the
    SQL and the driver-level parameters, and answers from a script (a Result, or an exception to raise)."""

    def __init__(self, engine: Engine, script: list[Any], isolation_level: str | None = None) -> None:
        self.dialect = engine.dialect
        self.connection = SimpleNamespace(dbapi_connection=None)  # no driver connection behind it
        self.info: dict[str, Any] = {}
        self.script = list(script)
        self.statements: list[tuple[str, dict[str, Any]]] = []
        self.options = {"isolation_level": isolation_level} if isolation_level else {}

    def get_execution_options(self) -> dict[str, Any]:
        return self.options

    def execute(self, stmt: Any, params: Mapping[str, Any] | None = None) -> Result:
        compiled = stmt.compile(dialect=self.dialect)
        self.statements.append((" ".join(str(compiled).split()), bound(compiled, self.dialect, params)))
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        assert isinstance(step, Result)
        return step

    def begin_nested(self) -> Any:
        raise AssertionError("the Oracle claim needs no savepoint")


def winner_row(fp: str, response: Any, status: int = 201) -> SimpleNamespace:
    now = datetime(2026, 1, 1, 12, 0, 0)
    return SimpleNamespace(fingerprint=fp, claim_token="t" * 32, completed_at=now, locked_until=now, db_now=now,
                           status=status, response=encode_response(response))
