"""The protocol, written once and free of I/O: claim -> compare -> effect -> complete, leases, retries, retention.

Every operation is a flow (`steps.py`): a generator that yields steps and is sent their results. The sync store
executes those steps with plain calls and the async store awaits them, so neither holds a decision of its own.
Generator-driven steps rather than one API generated from the other (httpcore's unasync): the SQL of every step is
the backends' sync code in both stores (the async one runs it through SQLAlchemy's greenlet bridge), so the two
differ only in how four kinds of step are executed, which two short loops say better than a generated second copy.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Delete, Engine, Update, bindparam, delete, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.schema import Table

from . import dialects
from .dialects.base import Backend, configured_isolation
from .errors import (
    ClaimRaced,
    IdemWarning,
    InvalidPayload,
    LeaseLost,
    RequestInFlight,
    RequestMismatch,
    RetryCause,
    UnsupportedIsolation,
)
from .features import Features
from .fingerprint import Encoder, decode_response, encode_response, fingerprint, payload_fingerprint
from .guard import guard
from .keys import MAX_IDENTITY_BYTES, check_identifier, check_identity_size
from .limits import OnInFlight, check_batch_size, check_on_in_flight, check_retention, check_status, lease_seconds
from .outcomes import Claimed, Delivery, Disposition, InFlight, Mismatch, Outcome, Replayed, Result
from .retention import DEFAULT_RETENTION, Stats, purge_targets
from .retention import stats as read_stats
from .retry import EffectFailed, RetryPolicy, effect_failure, retrying
from .schema import KEY_COLUMNS, Tables, build_tables, check_prefix
from .steps import Begin, Effect, Flow, Heartbeat, rowcount, sql, transaction
from .telemetry import MeterProvider, Telemetry, TracerProvider

T = TypeVar("T")
_Fenceable = TypeVar("_Fenceable", Update, Delete)
NO_PAYLOAD: Any = object()
# What a consumer does with a message whose id was first processed with a different payload.
OnMismatch = Disposition | Callable[[RequestMismatch], Disposition]
# A claim that keeps changing under us (purged, taken over, rolled back) this many times in a row is contention
# `run` should back off from, not a loop to spin in.
_CLAIM_ROUNDS = 5
# The Retry-After of a duplicate answered in flight without waiting: the first request's end is unknown (no lease).
CONFLICT_RETRY_AFTER = 1.0
_BUSY: Any = object()  # a claim statement that met another transaction's lock on the key and did not wait
log = logging.getLogger("idem_dialects")
_warned: set[str] = set()  # what driver logging would expose, warned of once per process


@dataclass(frozen=True, slots=True)
class Reply:
    """What an effect may return to store a status other than `run`'s default with its response."""

    response: Any
    status: int = 200


def check_isolation(backend: Backend, level: str | None) -> None:
    """Refuse, before any SQL, an isolation level the backend does not guarantee the protocol under."""
    if level is not None and level not in backend.features.isolation_levels:
        raise UnsupportedIsolation(backend.name, level, backend.features.isolation_levels)


@dataclass(frozen=True, slots=True)
class Request:
    """A request validated and fingerprinted once, before any SQL, however many attempts it takes."""

    scope: str
    operation: str
    key: str
    fingerprint: str
    lease: float | None
    # One claim token for every attempt of one run: a leased retry that finds this token on an in-flight record
    # knows the claim is its own (its COMMIT went through, the reply was lost) and carries on as the owner.
    token: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def ident(self) -> dict[str, str]:
        return {"scope": self.scope, "operation": self.operation, "idem_key": self.key}

    def claimed(self, *, taken_over: bool = False) -> Claimed:
        return Claimed(self.scope, self.operation, self.key, self.fingerprint, self.token, self.lease is not None,
                       taken_over)


def reply(response: Any, status: int) -> tuple[Any, int]:
    """(response, status) to store for what an effect returned: a `Reply` carries its own status."""
    if isinstance(response, Reply):
        return response.response, check_status(response.status)
    return response, status


def finished(outcome: Outcome, req: Request) -> Result:
    """What `run` answers for an outcome other than Claimed: the replayed Result, or the error it maps to."""
    if isinstance(outcome, Replayed):
        return Result(outcome.response, outcome.status, replayed=not outcome.own)
    ident = (req.scope, req.operation, req.key)
    if isinstance(outcome, Mismatch):
        raise RequestMismatch(*ident, outcome.stored_fingerprint, outcome.given_fingerprint)
    assert isinstance(outcome, InFlight)
    raise RequestInFlight(*ident, outcome.retry_after)


class Core:
    """What the sync and async stores share: the backend, the tables, validation, and every flow."""

    def __init__(self, engine: Engine, table_prefix: str, retry: RetryPolicy | None, encoder: Encoder | None,
                 retention: timedelta = DEFAULT_RETENTION, *, tracer_provider: TracerProvider | None = None,
                 meter_provider: MeterProvider | None = None) -> None:
        self.engine = engine
        self.encoder = encoder  # turns values that are not plain JSON (Decimal, datetime, ...) into JSON
        self.table_prefix = check_prefix(table_prefix)
        self.retry = retry or RetryPolicy()
        self.backend: Backend = dialects.load(engine.url.get_backend_name())(engine)
        self.backend.check_retry_budget(self.retry.total)  # warns if shorter than the URL's failover_window
        check_isolation(self.backend, configured_isolation(engine))
        self.tables: Tables = build_tables(self.table_prefix, self.backend)
        guard(engine, self.backend, (self.tables.records.name, self.tables.messages.name))
        # The portable identity limit, or the backend's own if lower (checked before any SQL).
        self.identity_limit = min(MAX_IDENTITY_BYTES, self.backend.features.max_identity_bytes or MAX_IDENTITY_BYTES)
        self.retries: Counter[str] = Counter()  # retries absorbed, by cause, since the store was made
        self._retries_lock = threading.Lock()
        self.retention = check_retention(retention)  # what `purge` deletes when not told, and `stats` counts
        self.telemetry = Telemetry(self.backend.db_system_name, self.backend.db_namespace(),
                                   tracer_provider=tracer_provider, meter_provider=meter_provider)

    @property
    def features(self) -> Features:
        return self.backend.features

    # --- validation, before any SQL ----------------------------------------------------------------------------

    def request(self, scope: object, operation: object, key: object, request: object,
                lease: timedelta | None) -> Request:
        fields = {"scope": check_identifier("scope", scope), "operation": check_identifier("operation", operation),
                  "key": check_identifier("key", key)}
        check_identity_size(fields, self.identity_limit)  # one limit on every engine
        return Request(fields["scope"], fields["operation"], fields["key"],
                       fingerprint(request, encoder=self.encoder), lease_seconds(lease))

    def checked(self, conn: Connection) -> None:
        """A caller's connection for the step-by-step API: its isolation level allowed, then `ready`."""
        check_isolation(self.backend, configured_isolation(conn))
        self.ready(conn)

    def ready(self, conn: Connection) -> None:
        """A connection about to run the store's statements: refused, before any of them, if its driver commits every
        statement alone (connect_args={"autocommit": True}, sqlite3's isolation_level=None, ...: a failing effect
        would leave its claim behind and run again); the features refined from the server on first use."""
        setting = self.backend.autocommit_setting(conn)
        if setting is not None:
            raise UnsupportedIsolation(self.backend.name, "AUTOCOMMIT", self.features.isolation_levels, setting)
        exposure = self.backend.log_exposure()
        if exposure is not None and exposure not in _warned:
            _warned.add(exposure)
            warnings.warn(exposure, IdemWarning, stacklevel=2)
        self.backend.live_features(conn)

    # --- the step-by-step protocol -----------------------------------------------------------------------------

    def claim(self, req: Request, *, wait: bool = True) -> Flow[Outcome]:
        """Claim the key, or tell why not: Mismatch, Replayed, InFlight, or Claimed (possibly taken over). With
        `wait=False`, a claim that would wait for another transaction's uncommitted claim of the key is InFlight."""
        return self.telemetry.claim(req.operation, self._claim(req, wait))

    def _claim_or_read(self, conn: Connection, values: dict[str, Any], clock: dict[str, float], ident: dict[str, str],
                       wait: bool) -> tuple[bool, Any]:
        """The backend's claim statement (`claim_or_read`); without `wait`, under the backend's no-wait mechanism,
        and (False, _BUSY) if it met another transaction's lock on the key instead of waiting for it."""
        t, backend = self.tables.records, self.backend
        if wait:
            return backend.claim_or_read(conn, t, values, clock, ident)
        try:
            with backend.not_waiting(conn, t, ident):
                return backend.claim_or_read(conn, t, values, clock, ident)
        except DBAPIError as exc:
            if backend.is_lock_busy(exc):
                return False, _BUSY
            raise

    def _claim(self, req: Request, wait: bool = True) -> Flow[Outcome]:
        t, backend, ident = self.tables.records, self.backend, req.ident
        # An atomic claim is never visible uncommitted; if it is ever committed without `complete`, it was
        # abandoned, so its lease is already over and the next caller takes it over.
        hold = req.lease or 0.0
        clock = {"created_at": 0.0, "locked_until": hold}
        values = dict(ident, fingerprint=req.fingerprint, claim_token=req.token)
        for _ in range(_CLAIM_ROUNDS):
            inserted, row = yield from sql(lambda c: self._claim_or_read(c, values, clock, ident, wait))
            if inserted:
                return req.claimed()
            if row is _BUSY:  # the transaction may be unusable now (PostgreSQL): the caller ends it
                return InFlight(CONFLICT_RETRY_AFTER, datetime.now(UTC) + timedelta(seconds=CONFLICT_RETRY_AFTER))
            if row is None:
                continue  # the winner rolled back or was purged after our insert saw it: claim again
            if row.fingerprint != req.fingerprint:
                return Mismatch(row.fingerprint, req.fingerprint)
            if row.completed_at is not None:
                return Replayed(decode_response(bytes(row.response)), row.status, row.completed_at,
                                own=row.claim_token == req.token)
            if req.lease is not None and row.claim_token == req.token:
                log.info("resuming our own claim on key %r (its commit went through, the reply was lost)", req.key)
                return req.claimed()
            if row.locked_until > row.db_now:
                return InFlight((row.locked_until - row.db_now).total_seconds(), row.locked_until)
            # The holder's lease is over: take the claim over, fenced on the token we saw.
            takeover = backend.prepared(("takeover", t, hold), lambda: self._fenced(update(t)).values(
                claim_token=bindparam("new_token", type_=t.c.claim_token.type), locked_until=backend.now_plus(hold)))
            params = backend.params(ident, "w_") | {"w_claim_token": row.claim_token, "new_token": req.token}
            if (yield from rowcount(takeover, params)) == 1:
                log.warning("took over the claim on key %r in %r/%r: its holder's lease ended without completing",
                            req.key, req.scope, req.operation)
                return req.claimed(taken_over=True)
        raise ClaimRaced(f"key {req.key!r} in {req.scope!r}/{req.operation!r} changed under {_CLAIM_ROUNDS} claims")

    def complete(self, claimed: Claimed, response: Any, status: int = 200) -> Flow[None]:
        """Store the result in the caller's transaction, fenced by the claim token (LeaseLost if taken over).
        Validates eagerly: bad input raises here, before the flow runs."""
        body = encode_response(response, self.encoder)
        check_status(status)
        return self._complete(claimed, body, status)

    def _complete(self, claimed: Claimed, body: bytes, status: int) -> Flow[None]:
        t, backend = self.tables.records, self.backend
        stmt = backend.prepared(("complete", t), lambda: self._fenced(update(t)).values(
            completed_at=backend.now(), locked_until=backend.now(), **backend.binds(t, ("status", "response"))))
        params = self._fence_params(claimed) | backend.params({"status": status, "response": body})
        if (yield from rowcount(stmt, params)) != 1:
            log.warning("lost the claim on key %r in %r/%r before completing it (taken over or completed)",
                        claimed.key, claimed.scope, claimed.operation)
            self.telemetry.lease_lost(claimed.operation)
            raise LeaseLost(claimed.scope, claimed.operation, claimed.key, claimed.token)

    def release(self, claimed: Claimed) -> Flow[bool]:
        """Give up a claim that was not completed, so the next attempt may claim at once; False if not held."""
        t = self.tables.records
        stmt = self.backend.prepared(("release", t), lambda: self._fenced(delete(t)))
        params = self._fence_params(claimed)
        return (yield from rowcount(stmt, params)) == 1

    def renew(self, claimed: Claimed, lease: float) -> Flow[bool]:
        """Extend a leased claim to `lease` seconds from now (the database's clock), fenced by the claim token like
        `complete`: False if the claim is no longer ours (taken over, completed, released or purged)."""
        t, backend = self.tables.records, self.backend
        stmt = backend.prepared(("renew", t, lease), lambda: self._fenced(update(t)).values(
            locked_until=backend.now_plus(lease)))
        return (yield from rowcount(stmt, self._fence_params(claimed))) == 1

    def heartbeat(self, claimed: Claimed, lease: float, *, in_transaction: bool = False) -> Heartbeat | None:
        """What keeps `claimed` alive while its effect runs: a renewal every third of the lease, so two beats may
        fail before a retry could take the claim over. None where no renewal could run meanwhile: an effect inside
        a transaction on an engine with one write lock holds (or will take) that lock, which every renewal needs;
        and until that transaction ends no one else can take the claim over either."""
        if in_transaction and self.features.writers == 1:
            return None
        return Heartbeat(lease / 3, lambda: self._beat(claimed, lease))

    def _beat(self, claimed: Claimed, lease: float) -> Flow[bool]:
        """One renewal in a transaction of its own; True to keep beating. Logged without tokens or stored values."""
        try:
            held = yield from transaction(self.renew(claimed, lease))
        except Exception as exc:  # the next beat tries again; the effect goes on either way
            log.warning("could not renew the lease on key %r in %r/%r: %s", claimed.key, claimed.scope,
                        claimed.operation, type(exc).__name__)
            return True
        if not held:
            log.warning("lost the claim on key %r in %r/%r while its effect runs (its lease ended and it was taken"
                        " over, or it was released)", claimed.key, claimed.scope, claimed.operation)
            self.telemetry.lease_lost(claimed.operation)
        return held

    def _fenced(self, stmt: _Fenceable) -> _Fenceable:
        """`stmt` restricted to one record, still in flight, still held by the claim token w_claim_token."""
        t = self.tables.records
        names = (*KEY_COLUMNS, "claim_token")
        return stmt.where(*(t.c[n] == b for n, b in self.backend.binds(t, names, "w_").items()),
                          t.c.completed_at.is_(None))

    @staticmethod
    def _fence_params(claimed: Claimed) -> dict[str, Any]:
        return {"w_scope": claimed.scope, "w_operation": claimed.operation, "w_idem_key": claimed.key,
                "w_claim_token": claimed.token}

    def accept_message(self, subscriber: str, message_id: str, payload: Any = NO_PAYLOAD) -> Flow[bool]:
        """True the first time (subscriber, message_id) is seen, in the caller's transaction; False on redelivery.
        A redelivery whose payload differs from the first one's raises RequestMismatch. Validates eagerly."""
        ident, fp = self._message(subscriber, message_id, payload)
        return self.telemetry.message(ident["subscriber"], self._accept_message(ident, fp))

    def _message(self, subscriber: object, message_id: object, payload: Any) -> tuple[dict[str, str], str | None]:
        """A message's identity and payload fingerprint, validated before any SQL."""
        ident = {"subscriber": check_identifier("subscriber", subscriber),
                 "message_id": check_identifier("message_id", message_id)}
        check_identity_size(ident, self.identity_limit)
        return ident, None if payload is NO_PAYLOAD else payload_fingerprint(payload, self.encoder)

    def _accept_message(self, ident: dict[str, str], fp: str | None) -> Flow[bool]:
        t, backend = self.tables.messages, self.backend
        for _ in range(_CLAIM_ROUNDS):
            if (yield from sql(lambda c: backend.insert_if_absent(c, t, dict(ident, fingerprint=fp),
                                                                 {"processed_at": 0.0}))):
                return True
            row = yield from sql(lambda c: backend.read_row(c, t, ident))
            if row is None:
                continue  # purged or rolled back in between
            if fp is not None and row.fingerprint is not None and row.fingerprint != fp:
                raise RequestMismatch(ident["subscriber"], "message", ident["message_id"], row.fingerprint, fp)
            return False
        raise ClaimRaced(f"message {ident['message_id']!r} of {ident['subscriber']!r} changed under"
                         f" {_CLAIM_ROUNDS} attempts")

    # --- the idempotent consumer ---------------------------------------------------------------------------------

    def consume(self, *, subscriber: str, message_id: str, payload: Any = NO_PAYLOAD,
                on_mismatch: OnMismatch = Disposition.DEAD_LETTER, retry: RetryPolicy | None = None) -> Flow[Delivery]:
        """Run the handler (an `Effect` step) and record the message in one transaction, re-run on the backend's
        retryable errors like `run`; a message processed before is acknowledged without running the handler, and
        one whose payload differs from the first one's gets the disposition `on_mismatch` chooses (a Disposition,
        or a function of the RequestMismatch that returns one). The handler's own error reaches the caller
        unchanged. Validates eagerly: bad input raises here, before the flow runs."""
        ident, fp = self._message(subscriber, message_id, payload)
        if not (isinstance(on_mismatch, Disposition) or callable(on_mismatch)):
            raise InvalidPayload("on_mismatch", f"must be a Disposition or a function returning one, got"
                                                f" {type(on_mismatch).__name__}")
        return self._consumed(ident, fp, on_mismatch, retry)

    def _consumed(self, ident: dict[str, str], fp: str | None, on_mismatch: OnMismatch,
                  retry: RetryPolicy | None) -> Flow[Delivery]:
        delivery = yield from self.retrying(lambda: transaction(self._consume(ident, fp)), retry)
        if delivery.mismatch is not None:
            chosen = on_mismatch(delivery.mismatch) if callable(on_mismatch) else on_mismatch
            delivery = Delivery(Disposition(chosen), mismatch=delivery.mismatch)
        # The one place a message's fate is known: accepted (handler ran), duplicate, or mismatched.
        return delivery

    def _consume(self, ident: dict[str, str], fp: str | None) -> Flow[Delivery]:
        try:  # counted as accepted, duplicate or mismatch where every consumer form is counted
            accepted = yield from self.telemetry.message(ident["subscriber"], self._accept_message(ident, fp))
        except RequestMismatch as mismatch:
            return Delivery(Disposition.DEAD_LETTER, mismatch=mismatch)  # its disposition is the caller's choice
        if not accepted:
            return Delivery(Disposition.ACK, duplicate=True)
        return Delivery(Disposition.ACK, value=(yield from self.call_effect(operation=ident["subscriber"])))

    # --- the whole protocol in one call ------------------------------------------------------------------------

    def run(self, *, scope: str, operation: str, key: str, request: Any, status: int = 200,
            lease: timedelta | None = None, retry: RetryPolicy | None = None,
            on_effect: Callable[[Any], Any] | None = None, on_in_flight: OnInFlight = "wait") -> Flow[Result]:
        """Claim, run the effect (an `Effect` step) and store its response once; replay it to every retry.
        `on_effect` turns the effect's value into what is stored (an adapter's hook; its errors roll back like the
        effect's own). `on_in_flight`: see the stores' `run`. Validates eagerly: bad input raises here, before the
        flow runs."""
        req = self.request(scope, operation, key, request, lease)
        check_status(status)
        wait = check_on_in_flight(on_in_flight)
        if lease is None:
            def once() -> Flow[Result]:
                return self._atomic(req, status, on_effect, wait)
        else:
            def once() -> Flow[Result]:
                return self._leased(req, status, on_effect)
        return self.telemetry.run(req.operation, once,
                                  lambda attempt: self.retrying(attempt, retry))

    def retrying(self, attempt: Callable[[], Flow[T]], policy: RetryPolicy | None = None) -> Flow[T]:
        """`attempt()` re-run on the backend's retryable errors within the retry budget, counted in `retries`."""
        return retrying(policy or self.retry, self.retry_cause, attempt, self._count_retry)

    def retry_cause(self, exc: BaseException) -> RetryCause | None:
        """Why a flow may run its attempt again after `exc` (None: it propagates). The backend's classification; an
        adapter whose transactions can be nested in its caller's (Django's atomic blocks) narrows it."""
        return self.backend.retry_cause(exc)

    def _count_retry(self, cause: str) -> None:
        with self._retries_lock:
            self.retries[cause] += 1
        self.telemetry.retry(cause)

    def _atomic(self, req: Request, status: int, on_effect: Callable[[Any], Any] | None,
                wait: bool = True) -> Flow[Result]:
        def body() -> Flow[Result]:
            outcome = yield from self.claim(req, wait=wait)
            if not isinstance(outcome, Claimed):
                return finished(outcome, req)
            response, code = yield from self.effect(status, on_effect, req.operation)
            yield from self.complete(outcome, response, code)
            return Result(response, code, replayed=False)

        return (yield from transaction(body(), Begin.CLAIM))

    def _leased(self, req: Request, status: int, on_effect: Callable[[Any], Any] | None) -> Flow[Result]:
        try:
            outcome = yield from transaction(self.claim(req), Begin.CLAIM)
        except BaseException as exc:
            if not isinstance(exc, Exception):
                # Cancelled (or interrupted) around the claim's COMMIT, which may have gone through: release what
                # may be ours (fenced by this run's token, so nothing else), or retries would wait out the lease.
                yield from self.release_after(req.claimed(), exc)
            raise
        if not isinstance(outcome, Claimed):
            return finished(outcome, req)

        assert req.lease is not None
        beat = self.heartbeat(outcome, req.lease, in_transaction=True)

        def body() -> Flow[tuple[Any, int]]:
            response, code = yield from self.effect(status, on_effect, req.operation, beat)
            yield from self.complete(outcome, response, code)
            return response, code

        try:
            response, code = yield from transaction(body())
        except LeaseLost:
            raise
        except BaseException as exc:
            # Let the next attempt (a retry of ours or the client's) claim at once instead of waiting out the lease.
            yield from self.release_after(outcome, exc)
            raise
        return Result(response, code, replayed=False)

    def effect(self, status: int, on_effect: Callable[[Any], Any] | None = None,
               operation: str = "", heartbeat: Heartbeat | None = None) -> Flow[tuple[Any, int]]:
        """Call the effect: (response, status) to store."""
        return reply((yield from self.call_effect(on_effect, operation, heartbeat)), status)

    def call_effect(self, on_effect: Callable[[Any], Any] | None = None, operation: str = "",
                    heartbeat: Heartbeat | None = None) -> Flow[Any]:
        """Call the effect (or a consumer's handler) and return its value, timed for telemetry under `operation`;
        with `heartbeat`, a leased claim is renewed meanwhile. Its error is marked as the effect's (EffectFailed,
        unwrapped by `retrying`), so nothing the store's cleanup raises after it can take its place."""
        started = time.perf_counter()
        try:
            response = yield Effect(heartbeat)
            if on_effect is not None:
                response = on_effect(response)
        except GeneratorExit:
            raise
        except BaseException as exc:
            self.telemetry.effect(operation, time.perf_counter() - started, exc)
            raise EffectFailed(exc) from exc
        self.telemetry.effect(operation, time.perf_counter() - started, None)
        return response

    def release_after(self, claimed: Claimed, error: BaseException) -> Flow[None]:
        """Release `claimed` in a transaction of its own after `error`, even if cancelled meanwhile; a release that
        fails becomes a note on the error (the lease still ends on its own)."""
        try:
            yield from transaction(self.release(claimed), shielded=True)
        except BaseException as release_error:
            failed = effect_failure(error)
            (error if failed is None else failed.error).add_note(
                f"releasing the claim also failed (not retried): {type(release_error).__name__}")

    # --- schema and retention ----------------------------------------------------------------------------------

    def create_tables(self) -> Flow[None]:
        """Create the tables (and indexes) that do not exist yet. Safe from many processes at once (workers starting
        together): busy errors are retried like `run`'s, and a CREATE that lost the race to another creator (an
        "already exists" error the backend recognises) is run again, its check then finding what the other made."""
        for round_no in range(_CLAIM_ROUNDS):
            try:
                yield from self.retrying(
                    lambda: transaction(sql(lambda c: self.tables.metadata.create_all(c, checkfirst=True))))
                return
            except DBAPIError as exc:
                if round_no == _CLAIM_ROUNDS - 1 or not self.backend.is_already_created(exc):
                    raise

    def drop_tables(self) -> Flow[None]:
        yield from transaction(sql(lambda c: self.tables.metadata.drop_all(c, checkfirst=True)))

    def purge(self, older_than: timedelta | None = None, batch_size: int = 1000,
              progress: Callable[[str, int], None] | None = None) -> Flow[int]:
        """Delete records completed (or abandoned, lease over) longer than `older_than` (default: the retention)
        ago, and processed messages as old, in batches of one transaction each, each retried like `run`. A live
        in-flight claim is never touched. `progress(table, deleted)` is called after each batch. Validates eagerly."""
        window = self.retention if older_than is None else check_retention(older_than, "older_than")
        check_batch_size(batch_size)
        return self._purge(list(purge_targets(self.tables, self.backend, window).items()), batch_size, progress)

    def stats(self) -> Flow[Stats]:
        """Records by state, the backlog past the retention, table sizes (`retention.stats`)."""
        return read_stats(self.tables, self.backend, self.retention)

    def _purge(self, targets: list[tuple[Table, ColumnElement[bool]]], batch_size: int,
               progress: Callable[[str, int], None] | None) -> Flow[int]:
        total = 0
        for table, condition in targets:
            while True:
                def batch(table: Table = table, condition: ColumnElement[bool] = condition) -> Flow[int]:
                    return transaction(sql(lambda c: self.backend.purge_batch(c, table, condition, batch_size)))

                deleted = yield from self.retrying(batch)
                self.telemetry.purged(table.name, deleted)
                total += deleted
                if progress is not None:
                    progress(table.name, deleted)
                if deleted < batch_size:
                    break
        return total
