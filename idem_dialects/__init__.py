"""idem-dialects: idempotency keys in SQL, one protocol with a dialect backend per engine."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from .errors import (
    IdemError,
    InvalidKey,
    InvalidPayload,
    LeaseLost,
    RequestInFlight,
    RequestMismatch,
    RetriesExhausted,
    UnsupportedEngine,
)
from .outcomes import Claimed, InFlight, Mismatch, Outcome, Replayed, Result
from .retry import RetryPolicy
from .store import IdempotencyStore, Reply

try:
    __version__ = version("idem-dialects")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "Claimed",
    "IdemError",
    "IdempotencyStore",
    "InFlight",
    "InvalidKey",
    "InvalidPayload",
    "LeaseLost",
    "Mismatch",
    "Outcome",
    "Replayed",
    "Reply",
    "RequestInFlight",
    "RequestMismatch",
    "Result",
    "RetriesExhausted",
    "RetryPolicy",
    "UnsupportedEngine",
    "__version__",
]
