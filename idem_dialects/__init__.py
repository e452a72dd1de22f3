"""idem-dialects: idempotency keys in SQL, one protocol with a dialect backend per engine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .api import AsyncExecutor, AsyncStoreAPI, Executor, StoreAPI
from .claims import Reply
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
    PoolExhausted,
    RequestInFlight,
    RequestMismatch,
    ResponseTooLarge,
    RetriesExhausted,
    RetryCause,
    TransientError,
    UnsupportedEngine,
    UnsupportedIsolation,
    WinnerNotVisible,
)
from .features import Features
from .outcomes import Claimed, Delivery, Disposition, InFlight, Mismatch, Outcome, Replayed, Result
from .retry import RetryPolicy
from .sharding import CrossShard, ShardedStore, UnknownShard
from .store import IdempotencyStore
from .version import __version__

if TYPE_CHECKING:
    from .aio import AsyncIdempotencyStore
    from .sharding.aio import AsyncShardedStore


def __getattr__(name: str) -> Any:
    # The async store loads SQLAlchemy's asyncio layer, which needs greenlet (the [async] extra): only when used.
    if name == "AsyncIdempotencyStore":
        from .aio import AsyncIdempotencyStore

        return AsyncIdempotencyStore
    if name == "AsyncShardedStore":
        from .sharding.aio import AsyncShardedStore

        return AsyncShardedStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AsyncExecutor",
    "AsyncIdempotencyStore",
    "AsyncMisuse",
    "AsyncShardedStore",
    "AsyncStoreAPI",
    "CannotConnect",
    "ClaimRaced",
    "Claimed",
    "ConfigurationError",
    "ConnectionConfigError",
    "CrossShard",
    "Delivery",
    "Disposition",
    "Executor",
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
    "PoolExhausted",
    "Replayed",
    "Reply",
    "RequestInFlight",
    "RequestMismatch",
    "ResponseTooLarge",
    "Result",
    "RetriesExhausted",
    "RetryCause",
    "RetryPolicy",
    "ShardedStore",
    "StoreAPI",
    "TransientError",
    "UnknownShard",
    "UnsupportedEngine",
    "UnsupportedIsolation",
    "WinnerNotVisible",
    "__version__",
    "default_encoder",
]
