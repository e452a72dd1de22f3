"""The step that runs a flow on one shard, which only the sharded stores' loops execute."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, TypeVar

from ..errors import RetriesExhausted
from ..steps import Flow, Stepper, Transaction

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class OnShard:
    """Run `body` (a flow of one shard's `Claims`) on shard `shard`: in the transaction open around this step (which
    it opens on that shard if it is the transaction's first routed step), or on the shard store's own loop. `alone`:
    always on the shard store's own loop, outside any transaction of the caller's (a look at a moving scope's old
    shard before the claim on its new one)."""

    shard: str
    body: Flow[Any]
    alone: bool = False


def on_shard(shard: str, body: Flow[T], *, alone: bool = False) -> Flow[T]:
    """`body` run on `shard`; a RetriesExhausted of its own retries names the shard."""
    try:
        return (yield OnShard(shard, body, alone))  # type: ignore[misc, no-any-return]  # only sharded loops run it
    except RetriesExhausted as exc:
        raise exc.on_shard(shard) from exc.__cause__


def noting(flow: Flow[T], seen: list[str]) -> Flow[T]:
    """`flow`, passed through step by step, noting in `seen` the first shard a step of it is routed to (inside its
    transactions too)."""
    stepper = Stepper(flow)
    while (step := stepper.next()) is not None:
        if isinstance(step, OnShard) and not step.alone and not seen:
            seen.append(step.shard)
        elif isinstance(step, Transaction):
            step = replace(step, body=noting(step.body, seen))
        try:
            stepper.send((yield step))
        except GeneratorExit:
            flow.close()
            raise
        except BaseException as exc:
            stepper.throw(exc)
    return stepper.value
