"""psycopg 3 (``postgresql+psycopg://``), sync and async: its async connection runs the store's statements
natively; it prepares a statement server-side after its fifth execution on a connection (never behind a
transaction-mode pooler)."""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from typing import Any, NamedTuple, NoReturn
from weakref import WeakKeyDictionary

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from ..sqla import driver_connection, raise_as_adapter
from ..steps import Shape
from . import Compiled, Driver, read_async

# libpq's PQTRANS_IDLE, PQTRANS_INTRANS and PQTRANS_INERROR, PGRES_COMMAND_OK and PGRES_TUPLES_OK, PQ_PIPELINE_OFF
# (psycopg.pq's TransactionStatus, ExecStatus and PipelineStatus are IntEnums of them), and libpq's PG_DIAG_SQLSTATE:
# read without importing psycopg here.
_IDLE, _INTRANS, _INERROR, _COMMAND_OK, _TUPLES_OK, _PIPELINE_OFF, _SQLSTATE = 0, 2, 3, 1, 2, 0, ord("C")


def session_id_is_pooled(dbapi_connection: Any, told: int) -> bool:
    """True if the server session's own pid differs from the one the server named at connect (BackendKeyData): a
    pooler such as PgBouncer names a client id of its own there, since the client's sessions may change. Asked on
    a connection without prepared statements, in a transaction rolled back at once."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("SELECT pg_backend_pid()")
        own = cursor.fetchone()[0]
    finally:
        cursor.close()
    dbapi_connection.rollback()
    return bool(own != told)


class Psycopg(Driver):
    def without_prepared_statements(self, params: dict[str, Any]) -> None:
        params["prepare_threshold"] = None  # never prepare (default: after 5 executions)

    def behind_pooler(self, dbapi_connection: Any, driver_connection: Any) -> bool | None:
        return session_id_is_pooled(dbapi_connection, driver_connection.info.backend_pid)

    def install(self, engine: Engine) -> None:
        if engine.dialect.is_async:  # the async store's statements go on psycopg's cursor: nothing prepared to track
            return
        for name, listener in (("rollback", _rolling_back), ("rollback_savepoint", _rolling_back),
                               ("reset", _resetting)):
            if not event.contains(engine, name, listener):
                event.listen(engine, name, listener)

    # psycopg sends a query and reads its answer without blocking, letting go of the GIL around each libpq call on
    # the way (about a dozen hand-offs per round trip among 8 threads: a BEGIN, a SELECT and a COMMIT took 100 µs of
    # client CPU on one thread and 350 µs each on 8). libpq's blocking PQexec lets go of it once, so the store sends
    # its transactions' BEGIN and COMMIT that way. Only a plain BEGIN: a connection with an isolation level, read_only
    # or deferrable (psycopg's BEGIN names them), in autocommit or in pipeline mode is left to psycopg.
    def begin_sync(self, dbapi_connection: Any) -> None:
        if _plain_begin(dbapi_connection):
            _exec(dbapi_connection, b"BEGIN")

    # The statement that opens a transaction (a claim, most often) goes with its BEGIN in one query to PQexec, as
    # EXECUTE of a statement the store prepared on the connection, its parameters as literals: one round trip and one
    # hand-off of the GIL instead of two round trips and a dozen hand-offs (a replay is then this and the COMMIT).
    # Keys, tokens, numbers and times only: a statement carrying anything else (bytes: a response, a payload) goes
    # on psycopg's cursor, so no server log or pg_stat_activity shows it.
    # The statement is prepared in the same query the first time a connection meets it; only where psycopg would
    # prepare statements itself (not behind a transaction-mode pooler), and only for the transaction's first
    # statement: whatever fails there fails before anything of the transaction, so the query is sent again (a
    # statement psycopg's DEALLOCATE ALL dropped) or left to psycopg's cursor (one it cannot prepare).
    def open_sync(self, dbapi_connection: Any, plan: Compiled, parameters: Any) -> tuple[Any, Any] | None:
        if dbapi_connection.prepare_threshold is None or not _plain_begin(dbapi_connection):
            return None
        form = _FORMS.get(plan.sql, _UNSEEN)
        if form is _UNSEEN:
            form = _FORMS[plan.sql] = _form(plan.sql, parameters)
        if form is None:
            return None
        values = [parameters[key] for key in form.keys]
        if not all(type(value) in _QUOTED for value in values):  # a response, a payload: never in the query's text
            return None
        from psycopg.adapt import Transformer

        # A transformer per statement: it holds its connection, which a cached one would keep alive.
        transformer = Transformer(dbapi_connection)
        quote = transformer.as_literal
        execute = b"BEGIN; EXECUTE " + form.name + b"(" + b",".join([quote(value) for value in values]) + b")"
        known = _PREPARED.get(dbapi_connection)
        if known is None:
            known = _PREPARED[dbapi_connection] = set()
        pgconn = dbapi_connection.pgconn
        for _ in range(2):
            prepared = form.name in known
            with dbapi_connection.lock:
                result = pgconn.exec_(execute if prepared else form.prepare + execute)
            if result.status == _TUPLES_OK or result.status == _COMMAND_OK:
                known.add(form.name)
                return _answer(transformer, plan, result)
            state = result.error_field(_SQLSTATE)
            began = pgconn.transaction_status == _INERROR  # the BEGIN ran, so the PREPARE before it did
            if began and not prepared:
                known.add(form.name)
            if began and state in _GONE:
                # Our statement dropped (psycopg's DEALLOCATE ALL after a rollback) or out of date (its tables
                # altered): nothing but the BEGIN ran. Prepared again in the next query.
                known.discard(form.name)
                _exec(dbapi_connection, b"ROLLBACK")
                if state != _DROPPED:
                    _exec(dbapi_connection, b"DEALLOCATE " + form.name)
                continue
            if not prepared and pgconn.transaction_status == _IDLE:
                if state == _DUPLICATE:  # prepared on this session already (under its SQL's hash): use it
                    known.add(form.name)
                    continue
                if state is not None and state.startswith(b"42") and state not in _PASSING:
                    _FORMS[plan.sql] = None  # a statement the server cannot prepare: psycopg's cursor from now on
                return None  # the PREPARE failed, nothing else ran: psycopg's cursor says why, or runs it
            _raise(dbapi_connection, result, b"BEGIN; EXECUTE")
        return None

    def commit_sync(self, dbapi_connection: Any) -> None:
        # Nothing begun, a failed transaction (its COMMIT rolls back) or a pipeline: left to psycopg's commit.
        pgconn = dbapi_connection.pgconn
        if pgconn.transaction_status == _INTRANS and pgconn.pipeline_status == _PIPELINE_OFF:
            _exec(dbapi_connection, b"COMMIT")

    async def execute(self, connection: Any, plan: Compiled, parameters: Any) -> Any:
        # psycopg's own connection lock serializes statements (SQLAlchemy's adapter takes no mutex for it either).
        raw = driver_connection(connection)
        try:
            async with raw.cursor() as cursor:
                await cursor.execute(plan.sql, parameters)
                return await read_async(cursor, plan)
        except Exception as error:
            raise_as_adapter(connection, error)


def _rolling_back(conn: Connection, *args: Any) -> None:
    """Before a rollback (of a transaction or to a savepoint) that psycopg sends: psycopg then deallocates every
    prepared statement on the connection once it has prepared any of its own, the store's with them, so the store
    prepares its statement again with the next query rather than finding it missing (a round trip and a ROLLBACK
    more)."""
    try:
        dbapi_connection = conn.connection.dbapi_connection
    except Exception:  # invalidated or closed: nothing of it is used again
        return
    _resetting(dbapi_connection)


def _resetting(dbapi_connection: Any, *args: Any) -> None:
    """Before the pool rolls a connection back as it takes it back (`_rolling_back`)."""
    known = None if dbapi_connection is None else _PREPARED.get(dbapi_connection)
    if known is not None and dbapi_connection.pgconn.transaction_status != _IDLE:  # idle: psycopg sends nothing
        known.clear()


def _plain_begin(dbapi_connection: Any) -> bool:
    """Whether the store may begin the connection's next transaction with a plain BEGIN of its own: nothing begun, no
    pipeline, and none of what psycopg's own BEGIN names (an isolation level, read_only, deferrable)."""
    pgconn = dbapi_connection.pgconn
    return (pgconn.transaction_status == _IDLE and pgconn.pipeline_status == _PIPELINE_OFF
            and not dbapi_connection.autocommit and dbapi_connection.isolation_level is None
            and dbapi_connection.read_only is None and dbapi_connection.deferrable is None)


def _exec(dbapi_connection: Any, command: bytes) -> None:
    """`command` by libpq's PQexec, under the connection's lock as psycopg runs its own; a failure raised as psycopg
    raises it (`_raise`)."""
    with dbapi_connection.lock:
        result = dbapi_connection.pgconn.exec_(command)
    if result.status != _COMMAND_OK:
        _raise(dbapi_connection, result, command)


def _raise(dbapi_connection: Any, result: Any, command: bytes) -> NoReturn:
    """A failed PQexec raised as psycopg raises it: OperationalError on a lost connection (then `broken`, which
    SQLAlchemy reads as a disconnect), else the class its SQLSTATE names."""
    from psycopg import OperationalError
    from psycopg.errors import error_from_result

    encoding = dbapi_connection.info.encoding
    if dbapi_connection.broken:
        raise OperationalError(f"{command.decode()} failed: {result.get_error_message(encoding)}")
    raise error_from_result(result, encoding=encoding)


class _Form(NamedTuple):
    """A statement as the store prepares it: its name (a hash of its SQL, so one prepared under it is this one), the
    PREPARE that makes it, and its parameters' keys in the order of its $n."""

    name: bytes
    prepare: bytes
    keys: tuple[str, ...]


_QUOTED = frozenset({str, int, float, bool, type(None), datetime})  # what the store quotes as a literal
_UNSEEN: Any = object()
_FORMS: dict[str, _Form | None] = {}  # by the statement's SQL (pyformat); None: not prepared (psycopg's cursor runs it)
# Per psycopg connection: the names the store prepared on it, as far as it knows.
_PREPARED: WeakKeyDictionary[Any, set[bytes]] = WeakKeyDictionary()
_PLACEHOLDER = re.compile(r"%\(([^)]*)\)s|%%")
_DROPPED, _CHANGED, _DUPLICATE = b"26000", b"0A000", b"42P05"  # no such prepared statement; cached plan changed
_GONE = (_DROPPED, _CHANGED)
_PASSING = (b"42P01", b"42501")  # no such table, no privilege: may be put right while the process runs


def _form(sql: str, parameters: Any) -> _Form | None:
    """`sql` (pyformat, as SQLAlchemy's psycopg dialect renders it) as a statement to prepare, or None for
    positional parameters."""
    if not isinstance(parameters, dict):
        return None
    keys: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        if match.group(1) is None:
            return "%"
        return f"${keys.setdefault(match.group(1), len(keys) + 1)}"

    body = _PLACEHOLDER.sub(number, sql)
    name = b"idem_" + hashlib.sha1(body.encode(), usedforsecurity=False).hexdigest()[:20].encode()
    return _Form(name, b"PREPARE " + name + b" AS " + body.encode() + b"; ", tuple(keys))


def _answer(transformer: Any, plan: Compiled, result: Any) -> tuple[Any, Any]:
    """The EXECUTE's answer as `read` gives a cursor's (answer, description)."""
    shape = plan.shape
    if shape is Shape.ROW or shape is Shape.ROWS:
        transformer.set_pgresult(result)
        rows = result.ntuples
        if shape is Shape.ROW:
            answer = transformer.load_row(0, tuple) if rows else None
        else:
            answer = transformer.load_rows(0, rows, tuple)
        description = ([(result.fname(i), result.ftype(i)) for i in range(result.nfields)]
                       if plan.wants_description else None)
        return answer, description
    return (result.command_tuples if shape is Shape.ROWCOUNT else None), None


# psycopg 3 takes autocommit when connecting (sync and async).
DRIVER = Psycopg("psycopg", "psycopg", "idem-dialects[postgresql]", asynchronous=True, native=True,
                 autocommit_args={"autocommit": True})
