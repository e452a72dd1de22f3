"""Where a scope's keys live: the default chooser (rendezvous hashing), a table of pinned scopes, and a move from one
placement to another (`Move`), which a sharded store routes through without running a key twice.

Any callable from a scope to a shard id is a chooser; these are the ones the store ships.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from ..errors import ConfigurationError

ShardChooser = Callable[[str], str]
"""The shard of a scope: a function from the (validated) scope to a shard id of the store's `shards`. It must be a
pure function of the scope (the same shard on every call, in every process), or keys would cross shards."""


def _weight(shard: str, scope: str) -> int:
    # A stable hash (never Python's salted `hash`): the same in every process and release.
    digest = hashlib.blake2b(f"{len(shard)}:{shard}:{scope}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class Rendezvous:
    """Rendezvous (highest random weight) hashing: each scope goes to the shard whose hash with the scope is highest.
    Adding a shard moves only the scopes the new one wins, about 1/(N+1) of them, all to the new shard; removing one
    moves only its own scopes. No ring and no state: a function of the scope and the shard ids, so every process
    that lists the same shards places every scope alike (the order of the list does not matter)."""

    def __init__(self, shards: Iterable[str]) -> None:
        self.shards = tuple(dict.fromkeys(shards))
        if not self.shards:
            raise ConfigurationError("Rendezvous needs at least one shard id")

    def __call__(self, scope: str) -> str:
        return max(self.shards, key=lambda shard: (_weight(shard, scope), shard))

    def __repr__(self) -> str:
        return f"Rendezvous({list(self.shards)!r})"


class Pinned:
    """An explicit placement table: the scopes in `pinned` on the shard it names (a tenant that needs a database of
    its own, or one kept where a migration put it), every other scope where `otherwise` places it."""

    def __init__(self, pinned: Mapping[str, str], otherwise: ShardChooser) -> None:
        self.pinned = dict(pinned)
        self.otherwise = otherwise

    def __call__(self, scope: str) -> str:
        found = self.pinned.get(scope)
        return self.otherwise(scope) if found is None else found

    def __repr__(self) -> str:
        return f"Pinned({len(self.pinned)} scopes, otherwise={self.otherwise!r})"


# How long a forwarding mark holds its key on the old shard against a claim by a release of this library that does
# not know marks (this one never takes a mark over): longer than a rollout of the new placement takes.
DEFAULT_HOLD = timedelta(hours=1)


@dataclass(frozen=True)
class Move:
    """A sharded store's chooser while its placement changes from `before` to `after` (each any chooser): a scope
    both place alike routes as before; a moving scope's new keys run on its new shard, and a key already recorded on
    its old shard is answered from there (replayed, or in flight while its claim is live), so no key runs twice.
    See docs: Scaling out, "Changing the placement". `hold`: how long a forwarding mark keeps an older release's
    claim off its key on the old shard."""

    before: ShardChooser
    after: ShardChooser
    hold: timedelta = field(default=DEFAULT_HOLD)

    def __call__(self, scope: str) -> str:
        return self.after(scope)

    def source(self, scope: str) -> str | None:
        """The old shard of a scope that moves (None: it stays where it was)."""
        was = self.before(scope)
        return None if was == self.after(scope) else was


def moved_share(before: ShardChooser, after: ShardChooser, scopes: Iterable[str]) -> float:
    """The share of `scopes` that `after` places elsewhere than `before` (what a change of placement moves)."""
    listed = list(scopes)
    return sum(before(s) != after(s) for s in listed) / len(listed) if listed else 0.0
