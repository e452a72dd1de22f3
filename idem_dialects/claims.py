"""The claim state machine, written once and free of I/O: claim -> compare -> effect -> complete, leases, fencing,
takeovers, releases. Each operation is a flow (`steps.py`) that the sync and async loops execute alike.

`Claims` is also the declared API adapters build on (the HTTP layer's request flow, the bench): a store's `claims`,
driven by the store's `drive`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Delete, Update, bindparam, delete, update
from sqlalchemy.exc import DBAPIError

from .core import ROUNDS, Core, Request
from .dialects.base import binds, params, statement
from .errors import ClaimRaced, LeaseLost, RequestInFlight, RequestMismatch, RetryCause
from .features import Features
from .fingerprint import decode_response, encode_response
from .ids import Origin, entering, leaving
from .limits import OnInFlight, check_on_in_flight, check_status
from .outcomes import Claimed, InFlight, Mismatch, Outcome, Replayed, Result
from .retry import EffectFailed, RetryPolicy, effect_failure
from .schema import KEY_COLUMNS
from .steps import Begin, Effect, Flow, Heartbeat, Shape, Statement, rowcount, statements, transaction

T = TypeVar("T")
_Fenceable = TypeVar("_Fenceable", Update, Delete)
# The Retry-After of a duplicate answered in flight without waiting: the first request's end is unknown (no lease).
CONFLICT_RETRY_AFTER = 1.0
_BUSY: Any = object()  # a claim statement that met another transaction's lock on the key and did not wait
# The claim token of a forwarding mark: a sharded store moving the key's scope to another shard left it where the scope
# was placed before, so that no claim there runs the key again (a uuid4's hex is never this).
MOVED = "moved"
log = logging.getLogger("idem_dialects")


@dataclass(frozen=True, slots=True)
class Reply:
    """What an effect may return to store a status other than `run`'s default with its response."""

    response: Any
    status: int = 200


def reply(response: Any, status: int) -> tuple[Any, int]:
    """(response, status) to store for what an effect returned: a `Reply` carries its own status."""
    if isinstance(response, Reply):
        return response.response, check_status(response.status)
    return response, status


def result_of(outcome: Outcome, req: Request) -> Result:
    """What `run` answers for an outcome other than Claimed: the replayed Result, or the error it maps to."""
    if isinstance(outcome, Replayed):
        return Result(outcome.response, outcome.status, replayed=not outcome.own)
    ident = (req.scope, req.operation, req.key)
    if isinstance(outcome, Mismatch):
        raise RequestMismatch(*ident, outcome.stored_fingerprint, outcome.given_fingerprint)
    assert isinstance(outcome, InFlight)
    raise RequestInFlight(*ident, outcome.retry_after)


def _conflict() -> InFlight:
    """In flight where the claim's end is unknown here: retry after CONFLICT_RETRY_AFTER seconds."""
    return InFlight(CONFLICT_RETRY_AFTER, datetime.now(UTC) + timedelta(seconds=CONFLICT_RETRY_AFTER))


def fence_params(claimed: Claimed) -> dict[str, Any]:
    return {"w_scope": claimed.scope, "w_operation": claimed.operation, "w_idem_key": claimed.key,
            "w_claim_token": claimed.token}


class Claims:
    """The protocol's flows on one store's `Core`."""

    def __init__(self, core: Core) -> None:
        self.core = core

    # --- for adapters --------------------------------------------------------------------------------------------

    @property
    def features(self) -> Features:
        """What the backend offers on this database (refined from the server in the store's first transaction)."""
        return self.core.features

    def retrying(self, attempt: Callable[[], Flow[T]], policy: RetryPolicy | None = None) -> Flow[T]:
        """`attempt()` re-run on the backend's retryable errors within the store's retry budget, as `run` is."""
        return self.core.retrying(attempt, policy)

    def retry_cause(self, exc: BaseException) -> RetryCause | None:
        """Why `retrying` would run an attempt again after `exc` (None: it propagates unchanged)."""
        return self.core.retry_cause(exc)

    def span(self, name: str, operation: str, flow: Flow[T], describe: Callable[[T], dict[str, Any]]) -> Flow[T]:
        """`flow` under a span of the store's telemetry, current while it runs (an adapter's request span)."""
        return self.core.telemetry.span(name, operation, flow, describe)

    # --- claim -------------------------------------------------------------------------------------------------

    def request(self, scope: object, operation: object, key: object, request: object,
                lease: timedelta | None = None) -> Request:
        """Validate and fingerprint a request, before any SQL (InvalidKey, InvalidPayload)."""
        return self.core.request(scope, operation, key, request, lease)

    def claim(self, req: Request, *, wait: bool = True, fresh: bool = False) -> Flow[Outcome]:
        """Claim the key, or tell why not: Mismatch, Replayed, InFlight, or Claimed (possibly taken over). With
        `wait=False`, a claim that would wait for another transaction's uncommitted claim of the key is InFlight.
        `fresh`: the claim is the first statement of a transaction this store began with `Begin.CLAIM`."""
        # Only a forwarding claim (`forward`, with a mark) answers None: no generator more per claim to say so, nor
        # a cast() call.
        flow: Flow[Outcome] = self._claim(req, wait, fresh and self.core.own_transactions)  # type: ignore[assignment]
        if self.core.statement_steps:
            flow = statements(flow)
        return self.core.telemetry.claim(req.operation, flow)

    def forward(self, req: Request, hold: float, *, fresh: bool = False) -> Flow[Outcome | None]:
        """For a sharded store moving the key's scope from this shard to another: the key's record here decides
        (Replayed, Mismatch, or InFlight while its claim is live), or None where the key belongs to the new shard
        from now on: it had no record here (a forwarding mark is left in its place, claim token `MOVED`, its lease
        `hold` seconds), it had a mark, or its claim was abandoned (marked in its place, fenced on its token). It
        never claims the key here, so nothing runs here again; a claim here (from a process on the old placement)
        that meets a mark answers InFlight and never takes it over."""
        return self._claim(req, True, fresh and self.core.own_transactions, hold)

    def _not_waiting(self, values: dict[str, Any], clock: dict[str, float], ident: dict[str, str],
                     fresh: bool) -> Flow[tuple[bool, Any]]:
        """The backend's claim under its no-wait mechanism, and (False, _BUSY) if it met another transaction's lock
        on the key instead of waiting for it."""
        t, backend = self.core.tables.records, self.core.backend
        try:
            return (yield from backend.not_waiting(t, ident, backend.claim(t, values, clock, ident, fresh)))
        except DBAPIError as exc:
            if backend.errors.is_lock_busy(exc):
                return False, _BUSY
            raise

    def _claim(self, req: Request, wait: bool, fresh: bool, mark: float | None = None) -> Flow[Outcome | None]:
        # An atomic claim is never visible uncommitted; if it is ever committed without `complete`, it was
        # abandoned, so its lease is already over and the next caller takes it over. With `mark` (`forward`), the
        # row inserted or taken over is a forwarding mark held `mark` seconds, and None means: on the new shard.
        hold = (req.lease or 0.0) if mark is None else mark
        token = req.token if mark is None else MOVED
        clock = {"created_at": 0.0, "locked_until": hold}
        values = dict(req.ident, fingerprint=req.fingerprint, claim_token=token)
        previous = self.core.previous
        if previous is not None:
            # Generations: a record completed before the last rotation is in the previous table, which only a
            # rotation changes (and a rotation waits for this transaction's table locks), so reading it first is
            # not check-then-insert. Claims not completed are never there: a rotation carries them forward.
            row = yield from self.core.backend.read(previous, req.ident)
            fresh = False
            if row is not None and row.completed_at is not None:
                return Mismatch(row.fingerprint, req.fingerprint) if row.fingerprint != req.fingerprint else \
                    Replayed(decode_response(bytes(row.response)), row.status, row.completed_at,
                             own=row.claim_token == req.token)
        backend, records = self.core.backend, self.core.tables.records
        for _ in range(ROUNDS):
            # Waiting (the default), the backend's claim itself: a generator less in every step of the claim.
            inserted, row = yield from (backend.claim(records, values, clock, req.ident, fresh) if wait else
                                        self._not_waiting(values, clock, req.ident, fresh))
            fresh = False  # a claim round after the first runs in a transaction that has begun
            if inserted:
                return req.claimed() if mark is None else None
            if row is _BUSY:  # the transaction may be unusable now (PostgreSQL): the caller ends it
                return _conflict()
            if row is None:
                continue  # the winner rolled back or was purged after our insert saw it: claim again
            if row.claim_token == MOVED and mark is not None:
                return None
            if row.fingerprint != req.fingerprint:
                return Mismatch(row.fingerprint, req.fingerprint)
            if row.completed_at is not None:
                return Replayed(decode_response(bytes(row.response)), row.status, row.completed_at,
                                own=row.claim_token == req.token)
            if req.lease is not None and row.claim_token == req.token:
                log.info("resuming our own claim on key %r (its commit went through, the reply was lost)", req.key)
                return req.claimed()
            if row.claim_token == MOVED:
                return _conflict()  # the key lives on another shard now: never taken over here
            if row.locked_until > row.db_now:
                return InFlight((row.locked_until - row.db_now).total_seconds(), row.locked_until)
            # The holder's lease is over: take the claim over (or mark it moved), fenced on the token we saw.
            if (yield from rowcount(self._takeover(hold), fence_params(req.claimed()) | {
                    "w_claim_token": row.claim_token, "new_token": token})) == 1:
                if mark is not None:
                    return None
                log.warning("took over the claim on key %r in %r/%r: its holder's lease ended without completing",
                            req.key, req.scope, req.operation)
                return req.claimed(taken_over=True)
        raise ClaimRaced(f"key {req.key!r} in {req.scope!r}/{req.operation!r} changed under {ROUNDS} claims")

    # --- the fenced statements ---------------------------------------------------------------------------------

    def _fenced(self, stmt: _Fenceable) -> _Fenceable:
        """`stmt` restricted to one record, still in flight, still held by the claim token w_claim_token."""
        t = self.core.tables.records
        return stmt.where(*(t.c[n] == b for n, b in binds(t, (*KEY_COLUMNS, "claim_token"), "w_").items()),
                          t.c.completed_at.is_(None))

    def _statement(self, key: Any, build: Callable[[], Any]) -> Statement:
        backend, t = self.core.backend, self.core.tables.records
        return backend.prepared((key, t), lambda: statement(build(), Shape.ROWCOUNT, t))

    def _takeover(self, hold: float) -> Statement:
        t, backend = self.core.tables.records, self.core.backend
        return self._statement(("takeover", hold), lambda: self._fenced(update(t)).values(
            claim_token=bindparam("new_token", type_=t.c.claim_token.type), locked_until=backend.now_plus(hold)))

    # --- complete, release, renew ------------------------------------------------------------------------------

    def complete(self, claimed: Claimed, response: Any, status: int = 200) -> Flow[None]:
        """Store the result in the caller's transaction, fenced by the claim token (LeaseLost if taken over).
        Validates eagerly: bad input, or a response larger than the server takes (ResponseTooLarge), raises here,
        before the flow runs."""
        body = encode_response(response, self.core.encoder)
        check_status(status)
        self.core.check_response(body)
        flow = self._complete(claimed, body, status)
        return statements(flow) if self.core.statement_steps else flow

    def _complete(self, claimed: Claimed, body: bytes, status: int) -> Flow[None]:
        t, backend = self.core.tables.records, self.core.backend
        stmt = self._statement("complete", lambda: self._fenced(update(t)).values(
            completed_at=backend.now(), locked_until=backend.now(), **binds(t, ("status", "response"))))
        if (yield from rowcount(stmt, fence_params(claimed) | params({"status": status, "response": body}))) != 1:
            log.warning("lost the claim on key %r in %r/%r before completing it (taken over or completed)",
                        claimed.key, claimed.scope, claimed.operation)
            self.core.telemetry.lease_lost(claimed.operation)
            raise LeaseLost(claimed.scope, claimed.operation, claimed.key, claimed.token)

    def release(self, claimed: Claimed) -> Flow[bool]:
        """Give up a claim that was not completed, so the next attempt may claim at once; False if not held."""
        t = self.core.tables.records
        stmt = self._statement("release", lambda: self._fenced(delete(t)))
        return (yield from rowcount(stmt, fence_params(claimed))) == 1

    def renew(self, claimed: Claimed, lease: float) -> Flow[bool]:
        """Extend a leased claim to `lease` seconds from now (the database's clock), fenced by the claim token like
        `complete`: False if the claim is no longer ours (taken over, completed, released or purged)."""
        t, backend = self.core.tables.records, self.core.backend
        stmt = self._statement(("renew", lease), lambda: self._fenced(update(t)).values(
            locked_until=backend.now_plus(lease)))
        return (yield from rowcount(stmt, fence_params(claimed))) == 1

    def heartbeat(self, claimed: Claimed, lease: float, *, in_transaction: bool = False) -> Heartbeat | None:
        """What keeps `claimed` alive while its effect runs: a renewal every third of the lease, so two beats may
        fail before a retry could take the claim over. None where no renewal could run meanwhile: an effect inside
        a transaction on an engine with one write lock holds (or will take) that lock, which every renewal needs;
        and until that transaction ends no one else can take the claim over either."""
        if in_transaction and self.core.features.writers == 1:
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
            self.core.telemetry.lease_lost(claimed.operation)
        return held

    def release_after(self, claimed: Claimed, error: BaseException) -> Flow[None]:
        """Release `claimed` in a transaction of its own after `error`, even if cancelled meanwhile; a release that
        fails becomes a note on the error (the lease still ends on its own)."""
        try:
            yield from transaction(self.release(claimed), shielded=True)
        except BaseException as release_error:
            failed = effect_failure(error)
            (error if failed is None else failed.error).add_note(
                f"releasing the claim also failed (not retried): {type(release_error).__name__}")

    # --- the whole protocol in one call ------------------------------------------------------------------------

    def run(self, *, scope: str, operation: str, key: str, request: Any, status: int = 200,
            lease: timedelta | None = None, retry: RetryPolicy | None = None,
            on_effect: Callable[[Any], Any] | None = None, on_in_flight: OnInFlight = "wait") -> Flow[Result]:
        """Claim, run the effect (an `Effect` step) and store its response once; replay it to every retry.
        `on_effect` turns the effect's value into what is stored (an adapter's hook; its errors roll back like the
        effect's own). `on_in_flight`: see the stores' `run`. Validates eagerly: bad input raises here, before the
        flow runs."""
        req = self.core.request(scope, operation, key, request, lease)
        check_status(status)
        wait = check_on_in_flight(on_in_flight)
        if lease is None:
            def once() -> Flow[Result]:
                return self._atomic(req, status, on_effect, wait)
        else:
            def once() -> Flow[Result]:
                return self._leased(req, status, on_effect)
        return self.core.telemetry.run(req.operation, once, lambda attempt: self.core.retrying(attempt, retry))

    def _atomic(self, req: Request, status: int, on_effect: Callable[[Any], Any] | None,
                wait: bool = True) -> Flow[Result]:
        def body() -> Flow[Result]:
            outcome = yield from self.claim(req, wait=wait, fresh=True)
            if not isinstance(outcome, Claimed):
                return result_of(outcome, req)
            response, code = yield from self.effect(status, on_effect, req.operation, origin=_origin(req))
            yield from self.complete(outcome, response, code)
            return Result(response, code, replayed=False)

        return (yield from transaction(body(), Begin.CLAIM))

    def _leased(self, req: Request, status: int, on_effect: Callable[[Any], Any] | None) -> Flow[Result]:
        try:
            outcome = yield from transaction(self.claim(req, fresh=True), Begin.CLAIM)
        except BaseException as exc:
            if not isinstance(exc, Exception):
                # Cancelled (or interrupted) around the claim's COMMIT, which may have gone through: release what
                # may be ours (fenced by this run's token, so nothing else), or retries would wait out the lease.
                yield from self.release_after(req.claimed(), exc)
            raise
        if not isinstance(outcome, Claimed):
            return result_of(outcome, req)

        assert req.lease is not None
        beat = self.heartbeat(outcome, req.lease, in_transaction=True)

        def body() -> Flow[tuple[Any, int]]:
            response, code = yield from self.effect(status, on_effect, req.operation, beat, _origin(req))
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
               operation: str = "", heartbeat: Heartbeat | None = None,
               origin: Origin | None = None) -> Flow[tuple[Any, int]]:
        """Call the effect: (response, status) to store."""
        return reply((yield from call_effect(self.core, on_effect, operation, heartbeat, origin)), status)


def _origin(req: Request) -> Origin:
    return Origin(req.scope, req.operation, req.key)


def call_effect(core: Core, on_effect: Callable[[Any], Any] | None = None, operation: str = "",
                heartbeat: Heartbeat | None = None, origin: Origin | None = None) -> Flow[Any]:
    """Call the effect (or a consumer's handler) and return its value, timed for telemetry under `operation`;
    with `heartbeat`, a leased claim is renewed meanwhile. Its error is marked as the effect's (EffectFailed,
    unwrapped by `retrying`), so nothing the store's cleanup raises after it can take its place. `origin`: the
    record the effect runs for, current meanwhile (`commands.current`: the outbox numbers its commands from it).
    A flow runs in the context of the one thread or task that drives it, the effect's too, so it is set and reset
    in the same context."""
    started = time.perf_counter()
    token = None if origin is None else entering(origin)
    try:
        response = yield Effect(heartbeat)
        if on_effect is not None:
            response = on_effect(response)
    except GeneratorExit:
        raise
    except BaseException as exc:
        core.telemetry.effect(operation, time.perf_counter() - started, exc)
        raise EffectFailed(exc) from exc
    finally:
        if token is not None:
            leaving(token)
    core.telemetry.effect(operation, time.perf_counter() - started, None)
    return response
