"""How `run` retries: jittered exponential backoff, bounded in total time, on the errors a backend names."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import tenacity

from .errors import RetriesExhausted, RetryCause, _first_line

T = TypeVar("T")
log = logging.getLogger("idem_dialects")
# Causes that say nothing about the effect's own transaction: an effect whose statement was cancelled (statement
# timeout) is the caller's problem, not contention, and must not run again.
_NOT_RETRIED_FOR_EFFECTS = frozenset({RetryCause.CANCELLED, RetryCause.CONNECT})


class EffectFailed(Exception):
    """Internal: the user's effect raised `error`. The store raises this wrapper in its place while it travels
    through the store's own cleanup (rollback, release), so that nothing raised there can replace it or be
    classified instead; `call_with_retry` unwraps it before anything reaches the caller."""

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


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """`total` bounds the time spent retrying (seconds); waits grow from `initial` up to `max_wait`, jittered."""

    total: float = 30.0
    initial: float = 0.005
    max_wait: float = 0.5
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        if self.total < 0 or self.initial <= 0 or self.max_wait < self.initial:
            raise ValueError(f"invalid RetryPolicy {self}")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")


def call_with_retry(
    policy: RetryPolicy,
    classify: Callable[[BaseException], str | None],
    fn: Callable[[], T],
    on_retry: Callable[[str], None] = lambda cause: None,
) -> T:
    """Call `fn` until it succeeds or raises something `classify` calls non-retryable; raise RetriesExhausted
    (with the tally of failed attempts by cause) when the budget runs out. `on_retry(cause)` hears of every retry.

    The first attempt is a plain call: retry machinery is built only once something failed retryably, so the
    common case (no contention) costs nothing here.

    An error the effect raised reaches `classify` unwrapped (see EffectFailed) and, when it is not retried,
    the caller unchanged; an error raised while cleaning up after it never replaces it."""
    failure: BaseException | None = None
    try:
        return _call_with_retry(policy, _classifier(classify), fn, on_retry)
    except RetriesExhausted:
        raise  # its last error is already unwrapped
    except BaseException as exc:
        failure = _unwrapped(exc)
        if failure is exc:
            raise
    # Raised outside the except block, so the effect's error keeps its own __context__.
    raise failure


def _call_with_retry(
    policy: RetryPolicy,
    classify: Callable[[BaseException], str | None],
    fn: Callable[[], T],
    on_retry: Callable[[str], None],
) -> T:
    started = time.monotonic()
    try:
        return fn()
    except Exception as exc:
        cause = classify(exc)
        if cause is None:
            raise
        first: tuple[BaseException, str] = (exc, cause)
    return _retry(policy, classify, fn, on_retry, started, first)


class _Budget:
    """One `run`'s retry state, shared by the sync and async retry loops: what tenacity is told (which errors,
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


def _retry(
    policy: RetryPolicy,
    classify: Callable[[BaseException], str | None],
    fn: Callable[[], T],
    on_retry: Callable[[str], None],
    started: float,
    first: tuple[BaseException, str],
) -> T:
    budget = _Budget(policy, classify, on_retry, started)
    pending: list[BaseException] = [first[0]]

    def attempt() -> T:
        if pending:  # the first attempt already ran (and failed) outside tenacity: replay its outcome
            raise pending.pop()
        return fn()

    try:
        return tenacity.Retrying(sleep=time.sleep, **budget.options())(attempt)
    except tenacity.RetryError as err:
        exhausted = budget.exhausted(err)
        raise exhausted from exhausted.last_error


async def acall_with_retry(
    policy: RetryPolicy,
    classify: Callable[[BaseException], str | None],
    fn: Callable[[], Awaitable[T]],
    on_retry: Callable[[str], None] = lambda cause: None,
) -> T:
    """`call_with_retry` for coroutines: the same policy, classification, unwrapping of the effect's errors and
    report, sleeping with `asyncio.sleep` so the event loop keeps running. Cancellation is never retried (it is
    not an Exception) and propagates unchanged."""
    failure: BaseException | None = None
    try:
        return await _acall_with_retry(policy, _classifier(classify), fn, on_retry)
    except RetriesExhausted:
        raise
    except Exception as exc:
        failure = _unwrapped(exc)
        if failure is exc:
            raise
    raise failure


async def _acall_with_retry(
    policy: RetryPolicy,
    classify: Callable[[BaseException], str | None],
    fn: Callable[[], Awaitable[T]],
    on_retry: Callable[[str], None],
) -> T:
    started = time.monotonic()
    try:
        return await fn()
    except Exception as exc:
        if classify(exc) is None:
            raise
        pending: list[BaseException] = [exc]
    budget = _Budget(policy, classify, on_retry, started)

    async def attempt() -> T:
        if pending:
            raise pending.pop()
        return await fn()

    try:
        return await tenacity.AsyncRetrying(sleep=asyncio.sleep, **budget.options())(attempt)
    except tenacity.RetryError as err:
        exhausted = budget.exhausted(err)
        raise exhausted from exhausted.last_error
