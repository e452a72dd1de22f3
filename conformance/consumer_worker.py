"""A consumer process of the consumer proof: ``python -m idem_dialects.conformance.consumer_worker '<json>'`` runs
one broker's adapter (see `brokers.Worker` for the fields) until SIGTERM, or until it kills itself as planned."""

from __future__ import annotations

import json
import signal
import sys
import threading

from .brokers import Kill, Worker, run_worker


def main(argv: list[str]) -> None:
    spec = json.loads(argv[0])
    kill = spec.pop("kill", None)
    worker = Worker(**spec, kill=Kill(**kill) if kill else None)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    run_worker(worker, stop)


if __name__ == "__main__":
    main(sys.argv[1:])
