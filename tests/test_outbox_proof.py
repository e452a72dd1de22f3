"""The outbox proof, smaller than the documented run (`idem-dialects outbox-proof`: 10,000 requests, 20 kills, 2
database restarts per broker and engine) but with the same faults: for each broker and live engine, HTTP requests with
20 % duplicates write orders, records and outbox commands; two relay processes publish them, two consumer processes
apply them; relays and consumers are killed at random moments, and the database restarted where this suite started
it. Every command's effect is applied exactly once, every order written once, nothing left on the broker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from idem_dialects.conformance.outbox_proof import OutboxProof, table

REQUESTS = 300


@pytest.mark.parametrize("name", ["rabbitmq", "nats", "redis"])
def test_requests_relays_and_consumers_apply_every_command_once(live_engine: Any, broker: Callable[..., str],
                                                                name: str) -> None:
    url = broker(name)
    restarts = 1 if live_engine.restart is not None else 0
    result = OutboxProof(name, url, live_engine.engine, live_engine, requests=REQUESTS, kills=4, restarts=restarts,
                         timeout=300, log=print).run()
    print(table([result]))
    assert (result.relay_kills, result.consumer_kills, result.restarts) == (2, 2, restarts)
    assert result.answered == REQUESTS and result.distinct == REQUESTS - REQUESTS // 5
    assert result.commands == result.published == result.distinct and result.pending == result.dead == 0
    assert result.lost == 0 and result.twice == 0 and result.orders_doubled == 0 and result.left == 0
    assert result.effects == result.applied == result.distinct
    assert result.ok
