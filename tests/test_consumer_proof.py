"""The consumer proof, smaller than the documented run (`idem-dialects consumers`: 10,000 messages per broker and
engine) but with the same faults: for each broker and each live engine, messages with 20 % duplicates consumed by two
worker processes running the broker's adapter, five of them killed (SIGKILL) mid-handler, after the commit before
the ack, and at a random moment; every distinct message applied exactly once, nothing left on the broker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from idem_dialects.conformance.consumer_proof import KILL_POINTS, Proof, table

MESSAGES = 300


@pytest.mark.parametrize("name", ["rabbitmq", "nats", "redis"])
def test_kills_and_duplicates_apply_every_message_exactly_once(live_engine: Any, broker: Callable[..., str],
                                                               name: str) -> None:
    url = broker(name)
    result = Proof(name, url, live_engine.engine, live_engine.url, total=MESSAGES, kills=5, workers=2,
                   timeout=300, log=print).run()
    print(table([result]))
    assert len(result.kills) == 5 and set(result.kills) == set(KILL_POINTS)
    assert result.published == MESSAGES and result.distinct == MESSAGES - MESSAGES // 5
    assert result.lost == 0 and result.twice == 0 and result.left == 0 and result.dead_lettered == 0
    assert result.effects == result.applied == result.distinct
    assert result.ok
