"""The IdemError hierarchy. Every error carries its data as attributes, not only in its message."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class IdemError(Exception):
    """Base class of every error this library raises on purpose."""


class InvalidKey(IdemError, ValueError):
    """A scope, operation, key (or subscriber / message id) breaks a rule; raised before any SQL (HTTP 400)."""

    def __init__(self, field: str, rule: str, value: object) -> None:
        self.field = field
        self.rule = rule
        self.value = value
        shown = repr(value)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        super().__init__(f"{field} {rule} (got {shown})")


class InvalidPayload(IdemError, TypeError):
    """A request, payload, response or status that cannot be stored and replayed exactly; raised before any SQL."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


class RequestMismatch(IdemError):
    """The key was first used with a different request (HTTP 422); the effect did not run."""

    http_status = 422

    def __init__(self, scope: str, operation: str, key: str, stored: str | None, given: str | None) -> None:
        self.scope = scope
        self.operation = operation
        self.key = key
        self.stored_fingerprint = stored
        self.given_fingerprint = given
        super().__init__(
            f"key {key!r} in {scope!r}/{operation!r} was first used with a different request"
            f" (stored fingerprint {stored}, this request {given})"
        )


class RequestInFlight(IdemError):
    """Another attempt holds a live lease on the key (HTTP 409 with Retry-After)."""

    http_status = 409

    def __init__(self, scope: str, operation: str, key: str, retry_after: float) -> None:
        self.scope = scope
        self.operation = operation
        self.key = key
        self.retry_after = retry_after
        super().__init__(f"key {key!r} in {scope!r}/{operation!r} is in flight; retry after {retry_after:.3f}s")


class LeaseLost(IdemError):
    """The claim was taken over (its lease expired) or completed by someone else; roll the transaction back."""

    def __init__(self, scope: str, operation: str, key: str, token: str) -> None:
        self.scope = scope
        self.operation = operation
        self.key = key
        self.token = token
        super().__init__(f"claim {token} on key {key!r} in {scope!r}/{operation!r} is no longer held")


class UnsupportedEngine(IdemError):
    """No backend is registered for the URL's dialect name."""

    def __init__(self, name: str, known: Sequence[str]) -> None:
        self.name = name
        self.known = tuple(known)
        super().__init__(f"no idem-dialects backend for {name!r}; known backends: {', '.join(self.known)}")


class RetriesExhausted(IdemError):
    """`run` kept hitting retryable errors until its time budget ran out; the last error is the __cause__."""

    def __init__(self, attempts: int, elapsed: float, causes: Mapping[str, int], last: BaseException) -> None:
        self.attempts = attempts
        self.elapsed = elapsed
        self.causes = dict(causes)
        self.last_error = last
        tally = ", ".join(f"{cause} x{count}" for cause, count in sorted(self.causes.items()))
        super().__init__(
            f"gave up after {attempts} attempts in {elapsed:.2f}s; retried: {tally};"
            f" last error: {type(last).__name__}: {last}"
        )
