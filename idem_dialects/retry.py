"""How `run` retries: jittered exponential backoff, bounded in total time, on the errors a backend names."""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import tenacity

from .errors import RetriesExhausted, RetryCause, _first_line
from .steps import Flow, Sleep

T = TypeVar("T")
log = logging.getLogger("idem_dialects")
# Causes that say nothing about the effect's own transaction: an effect whose statement was cancelled (statement
# timeout) is the caller's problem, not contention, and must not run again.
_NOT_RETRIED_FOR_EFFECTS = frozenset({RetryCause.CANCELLED, RetryCause.CONNECT})


class EffectFailed(Exception):
    """Internal: the user's effect raised `error`. The store raises this wrapper in its place while it travels
    through the store's own cleanup (rollback, release), so that nothing raised there can replace it or be
    classified instead; `retrying` unwraps it before anything reaches the caller."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(type(error).__name__)
        self.error = error


def effect_failure(exc: BaseException | None) -> EffectFailed | None:
    """The EffectFailed `exc` is, or that was being handled when `exc` was raised (a failing rollback's
    __context__), if any."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, EffectFailed):
            return exc
        seen.add(id(exc))
        exc = exc.__context__
    return None


def _classifier(classify: Callable[[BaseException], str | None]) -> Callable[[BaseException], str | None]:
    """`classify`, shown only the effect's own error when the effect raised (never a cleanup error after it),
    and never retrying an effect on a cause that is not about its transaction."""

    def cause(exc: BaseException) -> str | None:
        failed = effect_failure(exc)
        if failed is None:
            return classify(exc)
        found = classify(failed.error)
        return None if found in _NOT_RETRIED_FOR_EFFECTS else found

    return cause


def _unwrapped(exc: BaseException) -> BaseException:
    """What the caller sees for `exc`: the effect's own error if the effect raised (a cleanup error after it
    becomes a note on it), else `exc`."""
    failed = effect_failure(exc)
    if failed is None:
        return exc
    if exc is not failed:
        failed.error.add_note(f"cleaning up after it also failed (not retried): {type(exc).__name__}:"
                              f" {_first_line(exc)}")
    return failed.error


# Seconds: a default Patroni failover's worst case (the leader key's ttl of 30 s, then the promotion) with room.
DEFAULT_TOTAL = 45.0


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """`total` bounds the time spent retrying (seconds); waits grow from `initial` up to `max_wait`, jittered.

    The default total covers a failover of Patroni left at its defaults (ttl 30 s, loop_wait 10 s): measured 23.7 to
    24.7 s from the leader's kill to the first acknowledgement, and the leader key can outlive a kill by the whole
    ttl, plus the promotion. A stack that fails over more slowly (pg_auto_failover's defaults: 50-51 s here) declares
    its window in the URL (`failover_window=`), and a store whose budget is shorter warns (docs: Clusters)."""

    total: float = DEFAULT_TOTAL
    initial: float = 0.005
    max_wait: float = 0.5
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        if self.total < 0 or self.initial <= 0 or self.max_wait < self.initial:
            raise ValueError(f"invalid RetryPolicy {self}")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")


class _Budget:
    """One `run`'s retry state, shared by every retrying flow: what tenacity is told (which errors,
    how long to wait, when to stop) and how giving up is reported."""

    def __init__(self, policy: RetryPolicy, classify: Callable[[BaseException], str | None],
                 on_retry: Callable[[str], None], started: float) -> None:
        self.policy, self.classify, self.on_retry, self.started = policy, classify, on_retry, started
        self.causes: Counter[str] = Counter()

    def cause_of(self, state: tenacity.RetryCallState) -> str:
        exc = state.outcome.exception() if state.outcome else None
        return (self.classify(exc) if exc is not None else None) or "unknown"

    def out_of_budget(self, state: tenacity.RetryCallState) -> bool:
        over = time.monotonic() - self.started + state.upcoming_sleep > self.policy.total
        return over or (self.policy.max_attempts is not None and state.attempt_number >= self.policy.max_attempts)

    def before_sleep(self, state: tenacity.RetryCallState) -> None:
        cause = self.cause_of(state)
        self.causes[cause] += 1
        self.on_retry(cause)
        log.info("retrying after %s (attempt %d failed; next in %.3fs)", cause, state.attempt_number,
                 state.upcoming_sleep)

    def options(self) -> dict[str, Any]:
        return {
            "retry": tenacity.retry_if_exception(lambda exc: self.classify(exc) is not None),
            "wait": tenacity.wait_random_exponential(multiplier=self.policy.initial, max=self.policy.max_wait),
            "stop": self.out_of_budget,
            "before_sleep": self.before_sleep,
            "reraise": False,
        }

    def exhausted(self, err: tenacity.RetryError) -> RetriesExhausted:
        failed = err.last_attempt.exception()
        assert failed is not None
        retried = Counter(self.causes)
        self.causes[self.classify(failed) or "unknown"] += 1  # the final attempt is not followed by a sleep
        attempts, elapsed = err.last_attempt.attempt_number, time.monotonic() - self.started
        log.warning("giving up after %d attempts in %.2fs (%s)", attempts, elapsed,
                    ", ".join(f"{c} x{n}" for c, n in sorted(self.causes.items())))
        return RetriesExhausted(attempts=attempts, elapsed=elapsed, causes=self.causes, last=_unwrapped(failed),
                                retried=retried)


def retrying(
    policy: RetryPolicy | Callable[[], RetryPolicy],
    classify: Callable[[BaseException], str | None],
    attempt: Callable[[], Flow[T]],
    on_retry: Callable[[str], None] = lambda cause: None,
) -> Flow[T]:
    """A flow that runs `attempt()` until it succeeds or raises something `classify` calls non-retryable, sleeping
    (a `Sleep` step) between attempts; RetriesExhausted (with the tally of failed attempts by cause) when the budget
    runs out. `on_retry(cause)` hears of every retry. `policy` may be a function, asked at the first retryable
    failure (a sharded store's budget is its shard's, known once the attempt has reached it).

    An error the effect raised reaches `classify` unwrapped (see EffectFailed) and, when it is not retried, the
    caller unchanged; an error raised while cleaning up after it never replaces it."""
    failure: BaseException | None = None
    try:
        try:
            return (yield from _retrying(policy, _classifier(classify), attempt, on_retry))
        except RetriesExhausted:
            raise  # its last error is already unwrapped
        except BaseException as exc:
            failure = _unwrapped(exc)
            if failure is exc:
                raise
        # Raised outside the except block, so the effect's error keeps its own __context__.
        raise failure
    finally:
        # This frame is in the error's traceback: holding the error would make a reference cycle per failed request
        # (a mismatch, the handler's own error), freed only by a garbage collection.
        del failure


def _retrying(
    policy: RetryPolicy | Callable[[], RetryPolicy],
    classify: Callable[[BaseException], str | None],
    attempt: Callable[[], Flow[T]],
    on_retry: Callable[[str], None],
) -> Flow[T]:
    started = time.monotonic()
    try:
        return (yield from attempt())
    except Exception as exc:
        if classify(exc) is None:
            raise
        first = sys.exc_info()
    # Tenacity decides everything after a retryable failure: its decision step (`iter`) is free of I/O, so this flow
    # drives it the way tenacity's own loop does. It is built only then: per uncontended call, building it cost
    # 31-48 us, a tenth of a replay.
    budget = _Budget(policy() if callable(policy) else policy, classify, on_retry, started)
    controller = tenacity.Retrying(**budget.options())
    controller.begin()
    state = tenacity.RetryCallState(controller, fn=None, args=(), kwargs={})
    state.set_exception(first)  # type: ignore[arg-type]
    del first  # the failures' tracebacks hold this frame: it holds none of them (`state` neither, once done below)
    try:
        while True:
            do = controller.iter(state)
            if isinstance(do, tenacity.DoAttempt):
                try:
                    result = yield from attempt()
                except GeneratorExit:
                    raise
                except BaseException:
                    state.set_exception(sys.exc_info())  # type: ignore[arg-type]
                else:
                    state.set_result(result)
            elif isinstance(do, tenacity.DoSleep):
                state.prepare_for_next_attempt()
                yield Sleep(float(do))
            else:
                return do  # type: ignore[no-any-return]
    except tenacity.RetryError as err:
        exhausted = budget.exhausted(err)
        try:
            raise exhausted from exhausted.last_error
        finally:
            del exhausted
    finally:
        # What holds the failures goes with the flow: a retried request would be a reference cycle otherwise.
        del state, controller
