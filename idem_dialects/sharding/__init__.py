"""Scale out by scope: one store over several databases, each scope's keys on the shard its business data lives on
(SQLAlchemy's horizontal-sharding vocabulary: `shards` and a `shard_chooser`; Django's database routers choose the
shard in the Django integration). See docs: Scaling out."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .moving import MoveReport
from .onshard import OnShard
from .placement import Move, Pinned, Rendezvous, ShardChooser, moved_share
from .routing import CrossShard, ShardedClaims, UnknownShard
from .sync import ShardedStore

if TYPE_CHECKING:
    from .aio import AsyncShardedStore


def __getattr__(name: str) -> Any:
    if name == "AsyncShardedStore":  # SQLAlchemy's asyncio layer (greenlet) only when used, as the async store
        from .aio import AsyncShardedStore

        return AsyncShardedStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AsyncShardedStore", "CrossShard", "Move", "MoveReport", "OnShard", "Pinned", "Rendezvous", "ShardChooser",
           "ShardedClaims", "ShardedStore", "UnknownShard", "moved_share"]
