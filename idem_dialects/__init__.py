"""idem-dialects: idempotency keys in SQL, one protocol with a dialect backend per engine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .encoding import default_encoder
from .errors import (
    AsyncMisuse,
    CannotConnect,
    ClaimRaced,
    ConfigurationError,
    ConnectionConfigError,
    IdemError,
    IdemWarning,
    InvalidKey,
    InvalidPayload,
    KeyedError,
    LeaseLost,
    RequestInFlight,
    RequestMismatch,
    RetriesExhausted,
    RetryCause,
    TransientError,
    UnsupportedEngine,
    UnsupportedIsolation,
    WinnerNotVisible,
)
from .features import Features
from .outcomes import Claimed, Delivery, Disposition, InFlight, Mismatch, Outcome, Replayed, Result
from .protocol import Reply
from .retry import RetryPolicy
from .store import IdempotencyStore
from .version import __version__

if TYPE_CHECKING:
    from .aio import AsyncIdempotencyStore


def __getattr__(name: str) -> Any:
    # The async store loads SQLAlchemy's asyncio layer, which needs greenlet (the [async] extra): only when used.
    if name == "AsyncIdempotencyStore":
        from .aio import AsyncIdempotencyStore

        return AsyncIdempotencyStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")



__all__ = [
    "AsyncIdempotencyStore",
    "AsyncMisuse",
    "CannotConnect",
    "ClaimRaced",
    "Claimed",
    "ConfigurationError",
    "ConnectionConfigError",
    "Delivery",
    "Disposition",
    "Features",
    "IdemError",
    "IdemWarning",
    "IdempotencyStore",
    "InFlight",
    "InvalidKey",
    "InvalidPayload",
    "KeyedError",
    "LeaseLost",
    "Mismatch",
    "Outcome",
    "Replayed",
    "Reply",
    "RequestInFlight",
    "RequestMismatch",
    "Result",
    "RetriesExhausted",
    "RetryCause",
    "RetryPolicy",
    "TransientError",
    "UnsupportedEngine",
    "UnsupportedIsolation",
    "WinnerNotVisible",
    "__version__",
    "default_encoder",
]
