"""How `run` retries: jittered exponential backoff, bounded in total time, on the errors a backend names."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import tenacity

from .errors import RetriesExhausted

T = TypeVar("T")


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
    (with the tally of causes) when the budget runs out. `on_retry(cause)` hears of every retry."""
    causes: Counter[str] = Counter()

    def tally(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        if exc is not None:
            cause = classify(exc) or "unknown"
            causes[cause] += 1
            on_retry(cause)

    stop: tenacity.stop.stop_base = tenacity.stop_after_delay(policy.total)
    if policy.max_attempts is not None:
        stop = stop | tenacity.stop_after_attempt(policy.max_attempts)
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(lambda exc: classify(exc) is not None),
        wait=tenacity.wait_random_exponential(multiplier=policy.initial, max=policy.max_wait),
        stop=stop,
        before_sleep=tally,
        reraise=False,
    )
    try:
        return retrying(fn)
    except tenacity.RetryError as err:
        last = err.last_attempt.exception()
        assert last is not None
        causes[classify(last) or "unknown"] += 1  # the final attempt is not followed by a sleep, so count it here
        raise RetriesExhausted(
            attempts=err.last_attempt.attempt_number,
            elapsed=retrying.statistics.get("delay_since_first_attempt", 0.0),
            causes=causes,
            last=last,
        ) from last
