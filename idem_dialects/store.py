"""IdempotencyStore: claim -> compare -> complete, the same on every engine; the backend supplies the SQL."""

from __future__ import annotations

import functools
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import timedelta
from types import TracebackType
from typing import Any, Self, TypeVar

from sqlalchemy import Delete, Engine, Update, and_, bindparam, delete, or_, update
from sqlalchemy.engine import URL, Connection
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.schema import Table

from . import dialects
from .dialects.base import Backend, configured_isolation
from .errors import AsyncMisuse, ClaimRaced, LeaseLost, RequestMismatch, RetryCause
from .features import Features
from .fingerprint import Encoder, decode_response, encode_response, payload_fingerprint
from .guard import build_engine, guard, parse_url
from .guard import engine_options as guarded_options
from .keys import MAX_IDENTITY_BYTES, check_identifier, check_identity_size
from .limits import check_batch_size, check_older_than
from .limits import check_status as _check_status
from .outcomes import Claimed, InFlight, Mismatch, Outcome, Replayed, Result
from .protocol import Reply as Reply  # re-exported: its home before the async store shared it
from .protocol import Request as _Request
from .protocol import check_isolation as _check_isolation
from .protocol import finished, is_async_dialect, owning_engine, refuse_async_effect, refuse_awaitable, reply
from .retry import EffectFailed, RetryPolicy, call_with_retry, effect_failure
from .schema import KEY_COLUMNS, Tables, build_tables, check_prefix

_NO_PAYLOAD: Any = object()
_Fenceable = TypeVar("_Fenceable", Update, Delete)
# A claim that keeps changing under us (purged, taken over, rolled back) this many times in a row is contention
# `run` should back off from, not a loop to spin in.
_CLAIM_ROUNDS = 5
log = logging.getLogger("idem_dialects")


class IdempotencyStore:
    """Idempotency records for one database. Thread-safe; share one per engine.

    A context manager: `close()` (or leaving the `with` block) disposes of an engine the store created itself
    (`from_url`) and leaves an engine the caller passed in alone."""

    # True only for the async store's core, which runs these methods on an async driver through SQLAlchemy's
    # greenlet bridge (AsyncConnection.run_sync).
    _bridged = False

    def __init__(
        self, engine: Engine, *, table_prefix: str = "idem_", retry: RetryPolicy | None = None,
        encoder: Encoder | None = None,
    ) -> None:
        if not self._bridged and is_async_dialect(engine):  # an AsyncEngine, or an Engine on an asyncio driver
            raise AsyncMisuse(f"IdempotencyStore needs a sync SQLAlchemy Engine, got {type(engine).__name__} on an"
                              " asyncio driver; use idem_dialects.AsyncIdempotencyStore for an AsyncEngine")
        self.engine = engine
        # Turns values that are not plain JSON (Decimal, datetime, ...) into JSON; None refuses them.
        self.encoder = encoder
        self.table_prefix = check_prefix(table_prefix)
        self.retry = retry or RetryPolicy()
        self.backend: Backend = dialects.load(engine.url.get_backend_name())(engine)
        self.backend.check_retry_budget(self.retry.total)  # warns if shorter than the URL's failover_window
        _check_isolation(self.backend, configured_isolation(engine))
        self.tables: Tables = build_tables(table_prefix, self.backend)
        guard(engine, self.backend, (self.tables.records.name, self.tables.messages.name))
        # The portable identity limit, or the backend's own if lower (checked before any SQL).
        self.identity_limit = min(MAX_IDENTITY_BYTES, self.backend.features.max_identity_bytes or MAX_IDENTITY_BYTES)
        # Retries `run` absorbed, by cause, since this store was made (what the matrix reports per engine).
        self.retries: Counter[str] = Counter()
        self._retries_lock = threading.Lock()
        self._owns_engine = False

    @classmethod
    def from_url(
        cls, url: str | URL, *, table_prefix: str = "idem_", retry: RetryPolicy | None = None,
        encoder: Encoder | None = None, **engine_options: Any
    ) -> IdempotencyStore:
        """Build the engine (options go to `create_engine`) and the backend its dialect name selects."""
        parsed = parse_url(url)
        if is_async_dialect(parsed):
            raise AsyncMisuse(f"{parsed.drivername} is an asyncio driver: use"
                              f" idem_dialects.AsyncIdempotencyStore.from_url for it, or a sync driver here")
        backend = dialects.load(parsed.get_backend_name())
        parsed = backend.resolve_url(parsed)
        engine = build_engine(parsed, guarded_options(backend, parsed, engine_options))
        return owning_engine(lambda: cls(engine, table_prefix=table_prefix, retry=retry, encoder=encoder),
                             engine.dispose)

    @property
    def features(self) -> Features:
        """What the backend offers on this database (refined from the server once a connection was made)."""
        return self.backend.features

    def close(self) -> None:
        """Dispose of the engine's connections if this store created the engine; a caller's engine is theirs."""
        if self._owns_engine:
            self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"IdempotencyStore({self.engine.url.render_as_string()!r}, table_prefix={self.table_prefix!r})"

    # --- schema ----------------------------------------------------------------------------------------------

    def create_tables(self) -> None:
        with self.engine.begin() as conn:
            self.tables.metadata.create_all(conn, checkfirst=True)

    def drop_tables(self) -> None:
        with self.engine.begin() as conn:
            self.tables.metadata.drop_all(conn, checkfirst=True)

    # --- the step-by-step API --------------------------------------------------------------------------------

    def transaction(self) -> AbstractContextManager[Connection]:
        """A connection in a transaction begun the way the engine needs; commits on success."""
        return self._transaction(self.backend.transaction)

    @contextmanager
    def _transaction(self, begin: Callable[[Connection], AbstractContextManager[None]]) -> Iterator[Connection]:
        with self.backend.connect(self.engine) as conn:
            self.backend.live_features(conn)
            with begin(conn):
                yield conn

    def claim(
        self,
        conn: Connection,
        *,
        scope: str,
        operation: str,
        key: str,
        request: Any,
        lease: timedelta | None = None,
    ) -> Outcome:
        """Claim the key, or tell why not. Atomic by default; with `lease` the claim is meant to commit alone."""
        req = _Request.check(scope, operation, key, request, lease, self.encoder, self.identity_limit)
        _check_isolation(self.backend, configured_isolation(conn))
        self.backend.live_features(conn)
        return self._claim(conn, req)

    def _claim(self, conn: Connection, req: _Request) -> Outcome:
        t, backend, ident = self.tables.records, self.backend, req.ident
        leased = req.lease is not None
        # An atomic claim is never visible uncommitted; if it is ever committed without `complete`, it was
        # abandoned, so its lease is already over and the next caller takes it over.
        hold = req.lease or 0.0
        clock = {"created_at": 0.0, "locked_until": hold}
        token = req.token
        values = dict(ident, fingerprint=req.fingerprint, claim_token=token)
        for _ in range(_CLAIM_ROUNDS):
            inserted, row = backend.claim_or_read(conn, t, values, clock, ident)
            if inserted:
                return Claimed(req.scope, req.operation, req.key, req.fingerprint, token, leased)
            if row is None:
                continue  # the winner rolled back or was purged after our insert saw it: claim again
            if row.fingerprint != req.fingerprint:
                return Mismatch(row.fingerprint, req.fingerprint)
            if row.completed_at is not None:
                return Replayed(decode_response(bytes(row.response)), row.status, row.completed_at,
                                own=row.claim_token == token)
            if leased and row.claim_token == token:
                log.info("resuming our own claim on key %r (its commit went through, the reply was lost)", req.key)
                return Claimed(req.scope, req.operation, req.key, req.fingerprint, token, leased)
            if row.locked_until > row.db_now:
                return InFlight((row.locked_until - row.db_now).total_seconds(), row.locked_until)
            # The holder's lease is over: take the claim over, fenced on the token we saw.
            takeover = backend.prepared(("takeover", t, hold), lambda: self._fenced(update(t)).values(
                claim_token=bindparam("new_token", type_=t.c.claim_token.type), locked_until=backend.now_plus(hold)))
            params = backend.params(ident, "w_") | {"w_claim_token": row.claim_token, "new_token": token}
            if conn.execute(takeover, params).rowcount == 1:
                log.warning("took over the claim on key %r in %r/%r: its holder's lease ended without completing",
                            req.key, req.scope, req.operation)
                return Claimed(req.scope, req.operation, req.key, req.fingerprint, token, leased, taken_over=True)
        raise ClaimRaced(f"key {req.key!r} in {req.scope!r}/{req.operation!r} changed under {_CLAIM_ROUNDS} claims")

    def complete(self, conn: Connection, claimed: Claimed, response: Any, status: int = 200) -> None:
        """Store the result in the caller's transaction, fenced by the claim token (LeaseLost if taken over)."""
        body = encode_response(response, self.encoder)
        _check_status(status)
        t, backend = self.tables.records, self.backend
        stmt = backend.prepared(("complete", t), lambda: self._fenced(update(t)).values(
            completed_at=backend.now(), locked_until=backend.now(), **backend.binds(t, ("status", "response"))))
        if conn.execute(stmt, self._fence_params(claimed) | backend.params({"status": status, "response": body})
                        ).rowcount != 1:
            log.warning("lost the claim on key %r in %r/%r before completing it (taken over or completed)",
                        claimed.scope, claimed.operation, claimed.key)
            raise LeaseLost(claimed.scope, claimed.operation, claimed.key, claimed.token)

    def release(self, conn: Connection, claimed: Claimed) -> bool:
        """Give up a claim that was not completed, so the next attempt may claim at once; False if not held."""
        t = self.tables.records
        stmt = self.backend.prepared(("release", t), lambda: self._fenced(delete(t)))
        return conn.execute(stmt, self._fence_params(claimed)).rowcount == 1

    def _fenced(self, stmt: _Fenceable) -> _Fenceable:
        """`stmt` restricted to one record, still in flight, still held by the claim token w_claim_token."""
        t = self.tables.records
        names = (*KEY_COLUMNS, "claim_token")
        return stmt.where(*(t.c[n] == b for n, b in self.backend.binds(t, names, "w_").items()),
                          t.c.completed_at.is_(None))

    def _fence_params(self, claimed: Claimed) -> dict[str, Any]:
        return {"w_scope": claimed.scope, "w_operation": claimed.operation, "w_idem_key": claimed.key,
                "w_claim_token": claimed.token}

    def accept_message(
        self, conn: Connection, *, subscriber: str, message_id: str, payload: Any = _NO_PAYLOAD
    ) -> bool:
        """True the first time (subscriber, message_id) is seen, in the caller's transaction; False on redelivery.
        A redelivery whose payload differs from the first one's raises RequestMismatch."""
        ident = {
            "subscriber": check_identifier("subscriber", subscriber),
            "message_id": check_identifier("message_id", message_id),
        }
        check_identity_size(ident, self.identity_limit)
        fp = None if payload is _NO_PAYLOAD else payload_fingerprint(payload, self.encoder)
        _check_isolation(self.backend, configured_isolation(conn))
        t = self.tables.messages
        for _ in range(_CLAIM_ROUNDS):
            if self.backend.insert_if_absent(conn, t, dict(ident, fingerprint=fp), {"processed_at": 0.0}):
                return True
            row = self.backend.read_row(conn, t, ident)
            if row is None:
                continue  # purged or rolled back in between
            if fp is not None and row.fingerprint is not None and row.fingerprint != fp:
                raise RequestMismatch(subscriber, "message", message_id, row.fingerprint, fp)
            return False
        raise ClaimRaced(f"message {message_id!r} of {subscriber!r} changed under {_CLAIM_ROUNDS} attempts")

    # --- the whole protocol in one call ----------------------------------------------------------------------

    def run(
        self,
        *,
        scope: str,
        operation: str,
        key: str,
        request: Any,
        effect: Callable[[Connection], Any],
        status: int = 200,
        lease: timedelta | None = None,
        retry: RetryPolicy | None = None,
    ) -> Result:
        """Claim, run `effect(conn)` and store its response once; replay it to every retry.

        Raises RequestMismatch, RequestInFlight, InvalidKey, or RetriesExhausted when retryable errors
        (busy, serialization failure, deadlock, lock timeout, lost connection) outlast the retry budget.
        `effect` may return `Reply(response, status)` to store a status other than `status`.
        """
        # Validate everything before the first connection, so bad input never costs a round trip.
        req = _Request.check(scope, operation, key, request, lease, self.encoder, self.identity_limit)
        _check_status(status)
        refuse_async_effect(effect)
        run_once = self._run_atomic if lease is None else self._run_leased
        return call_with_retry(retry or self.retry, self.retry_cause, lambda: run_once(req, effect, status),
                               self._count_retry)

    def _count_retry(self, cause: str) -> None:
        with self._retries_lock:
            self.retries[cause] += 1

    def retry_cause(self, exc: BaseException) -> RetryCause | None:
        """Why `run` would retry after `exc` (None: it propagates unchanged)."""
        return self.backend.retry_cause(exc)

    def _run_atomic(self, req: _Request, effect: Callable[[Connection], Any], status: int) -> Result:
        with self._transaction(self.backend.claim_transaction) as conn:
            outcome = self._claim(conn, req)
            if not isinstance(outcome, Claimed):
                return self._finished(outcome, req)
            response, code = self._call(effect, conn, status)
            self.complete(conn, outcome, response, code)
            return Result(response, code, replayed=False)

    def _run_leased(self, req: _Request, effect: Callable[[Connection], Any], status: int) -> Result:
        with self._transaction(self.backend.claim_transaction) as conn:
            outcome = self._claim(conn, req)
        if not isinstance(outcome, Claimed):
            return self._finished(outcome, req)
        try:
            with self.transaction() as conn:
                response, code = self._call(effect, conn, status)
                self.complete(conn, outcome, response, code)
        except LeaseLost:
            raise
        except BaseException as exc:
            # Let the next attempt (a retry of ours or the client's) claim at once instead of waiting out the lease.
            try:
                with self.transaction() as conn:
                    self.release(conn, outcome)
            except Exception as release_error:  # the lease still ends on its own; the first error matters more
                failed = effect_failure(exc)
                (exc if failed is None else failed.error).add_note(
                    f"releasing the claim also failed (not retried): {type(release_error).__name__}")
            raise
        return Result(response, code, replayed=False)

    @staticmethod
    def _call(effect: Callable[[Connection], Any], conn: Connection, status: int) -> tuple[Any, int]:
        try:
            response = effect(conn)
        except BaseException as exc:
            # Marked as the effect's: a rollback that fails after it cannot take its place (see EffectFailed).
            raise EffectFailed(exc) from exc
        refuse_awaitable(response)
        return reply(response, status)

    _finished = staticmethod(finished)

    # --- retention -------------------------------------------------------------------------------------------

    def purge(self, older_than: timedelta, batch_size: int = 1000,
              progress: Callable[[str, int], None] | None = None) -> int:
        """Delete records completed (or abandoned, lease over) longer than `older_than` ago, and processed
        messages as old, in batches of one transaction each. A live in-flight claim is never touched.
        `progress(table, deleted)` is called after each batch."""
        total = 0
        for table, condition in self._purge_targets(older_than, batch_size):
            while True:
                batch = functools.partial(self._purge_batch, table, condition, batch_size)
                deleted = call_with_retry(self.retry, self.retry_cause, batch, self._count_retry)
                total += deleted
                if progress is not None:
                    progress(table.name, deleted)
                if deleted < batch_size:
                    break
        return total

    def _purge_targets(self, older_than: timedelta, batch_size: int) -> list[tuple[Table, ColumnElement[bool]]]:
        """What purge deletes, table by table (validated first; shared with the async store)."""
        check_older_than(older_than)
        check_batch_size(batch_size)
        cutoff = self.backend.now_plus(-older_than.total_seconds())
        r, m = self.tables.records.c, self.tables.messages.c
        return [
            (self.tables.records, or_(
                and_(r.completed_at.is_not(None), r.completed_at < cutoff),
                and_(r.completed_at.is_(None), r.locked_until < self.backend.now(), r.created_at < cutoff),
            )),
            (self.tables.messages, m.processed_at < cutoff),
        ]

    def _purge_batch(self, table: Table, condition: ColumnElement[bool], batch_size: int) -> int:
        # Each batch is its own short transaction, retried like run's (busy, serialization failure, deadlock).
        with self.transaction() as conn:
            return self.backend.purge_batch(conn, table, condition, batch_size)
