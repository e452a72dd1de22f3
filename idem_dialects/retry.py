"""How `run` retries: jittered exponential backoff, bounded in total time, on the errors a backend names."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import tenacity

from .errors import RetriesExhausted

T = TypeVar("T")
log = logging.getLogger("idem_dialects")


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
    common case (no contention) costs nothing here."""
    started = time.monotonic()
    try:
        return fn()
    except Exception as exc:
        cause = classify(exc)
        if cause is None:
            raise
        first: tuple[BaseException, str] = (exc, cause)
    return _retry(policy, classify, fn, on_retry, started, first)


def _retry(
    policy: RetryPolicy,
    classify: Callable[[BaseException], str | None],
    fn: Callable[[], T],
    on_retry: Callable[[str], None],
    started: float,
    first: tuple[BaseException, str],
) -> T:
    causes: Counter[str] = Counter()
    pending: list[BaseException] = [first[0]]

    def attempt() -> T:
        if pending:  # the first attempt already ran (and failed) outside tenacity: replay its outcome
            raise pending.pop()
        return fn()

    def cause_of(state: tenacity.RetryCallState) -> str:
        exc = state.outcome.exception() if state.outcome else None
        return (classify(exc) if exc is not None else None) or "unknown"

    def out_of_budget(state: tenacity.RetryCallState) -> bool:
        over = time.monotonic() - started + state.upcoming_sleep > policy.total
        return over or (policy.max_attempts is not None and state.attempt_number >= policy.max_attempts)

    def before_sleep(state: tenacity.RetryCallState) -> None:
        cause = cause_of(state)
        causes[cause] += 1
        on_retry(cause)
        log.info("retrying after %s (attempt %d failed; next in %.3fs)", cause, state.attempt_number,
                 state.upcoming_sleep)

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(lambda exc: classify(exc) is not None),
        wait=tenacity.wait_random_exponential(multiplier=policy.initial, max=policy.max_wait),
        stop=out_of_budget,
        before_sleep=before_sleep,
        sleep=time.sleep,
        reraise=False,
    )
    try:
        return retrying(attempt)
    except tenacity.RetryError as err:
        last = err.last_attempt.exception()
        assert last is not None
        causes[classify(last) or "unknown"] += 1  # the final attempt is not followed by a sleep: count it here
        attempts, elapsed = err.last_attempt.attempt_number, time.monotonic() - started
        log.warning("giving up after %d attempts in %.2fs (%s)", attempts, elapsed,
                    ", ".join(f"{c} x{n}" for c, n in sorted(causes.items())))
        raise RetriesExhausted(attempts=attempts, elapsed=elapsed, causes=causes, last=last) from last
