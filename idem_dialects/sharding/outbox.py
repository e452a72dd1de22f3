"""The outbox over every shard of a sharded store, for its relays."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ..api import OutboxFlows
from ..outbox import Command, Failure, OutboxStats
from ..steps import Flow
from .onshard import on_shard

if TYPE_CHECKING:
    from ..telemetry import Telemetry


class ShardedOutbox:
    """The outbox flows over every shard, for a relay of a sharded store: a claim takes each shard's due commands in
    turn (the first place rotates, so no shard waits behind another's backlog), and the settle marks each command on
    the shard it was claimed from."""

    def __init__(self, outboxes: Mapping[str, OutboxFlows]) -> None:
        self.shards = dict(outboxes)
        self._first = next(iter(self.shards.values()))
        self._placed: dict[str, str] = {}  # a claimed command's id -> its shard, until it is settled
        self._turn = 0

    @property
    def telemetry(self) -> Telemetry:
        return self._first.telemetry

    @property
    def table(self) -> str:
        return self._first.table

    def claim(self, token: str, limit: int, lease: float, ordered: bool = True) -> Flow[list[Command]]:
        names = list(self.shards)
        self._turn = (self._turn + 1) % len(names)
        taken: list[Command] = []
        for shard in names[self._turn:] + names[:self._turn]:
            if len(taken) >= limit:
                break
            found = yield from on_shard(shard, self.shards[shard].claim(token, limit - len(taken), lease, ordered))
            self._placed.update((command.id, shard) for command in found)
            taken.extend(found)
        return taken

    def settle(self, token: str, published: Sequence[str], failed: Sequence[Failure] = (),
               released: Sequence[str] = ()) -> Flow[int]:
        done = 0
        for shard, outbox in self.shards.items():
            mine = [i for i in published if self._placed.get(i) == shard]
            lost = [f for f in failed if self._placed.get(f.id) == shard]
            back = [i for i in released if self._placed.get(i) == shard]
            if mine or lost or back:
                done += yield from on_shard(shard, outbox.settle(token, mine, lost, back))
        for ident in (*published, *(f.id for f in failed), *released):
            self._placed.pop(ident, None)
        return done

    def stats(self) -> Flow[OutboxStats]:
        parts = []
        for shard, outbox in self.shards.items():
            parts.append((yield from on_shard(shard, outbox.stats())))
        return OutboxStats.combined(parts)

    def requeue(self) -> Flow[int]:
        count = 0
        for shard, outbox in self.shards.items():
            count += yield from on_shard(shard, outbox.requeue())
        return count
