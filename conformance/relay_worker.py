"""A relay process of the outbox proof: ``python -m idem_dialects.conformance.relay_worker '<json>'`` runs the
library's `Relay` on the proof's outbox, publishing to the proof's broker, until SIGTERM (or a SIGKILL from the
proof). Fields: db_url, prefix, broker, broker_url, name, ready, lease."""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from idem_dialects import IdempotencyStore, RetryPolicy
from idem_dialects.relay import Relay


def publisher(broker: str, url: str, name: str) -> Any:
    if broker == "rabbitmq":
        from idem_dialects.publishers.rabbitmq import RabbitMQPublisher

        return RabbitMQPublisher(url, routing_key=name)
    if broker == "nats":
        from idem_dialects.publishers.nats import NatsPublisher

        return NatsPublisher(url, subject=f"{name}.in")
    from idem_dialects.publishers.redis import RedisStreamPublisher

    return RedisStreamPublisher(url, stream=name)


def main(argv: list[str]) -> None:
    spec = json.loads(argv[0])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    store = IdempotencyStore.from_url(spec["db_url"], table_prefix=spec["prefix"], retry=RetryPolicy(total=30))
    relay = Relay(store, {"*": publisher(spec["broker"], spec["broker_url"], spec["name"])}, batch=50,
                  lease=float(spec["lease"]), idle=0.1, stats_every=0)
    Path(spec["ready"]).touch()
    relay.run(stop)
    store.close()


if __name__ == "__main__":
    main(sys.argv[1:])
