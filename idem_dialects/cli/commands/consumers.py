"""Prove the broker consumers under faults: on each broker and engine, publish messages with duplicates, consume them
with worker processes running the broker's adapter, kill workers (SIGKILL) at random points, and count what was
published, applied, acknowledged and dead-lettered. Every distinct message id must be applied exactly once, and
nothing may be left on the broker (idem_dialects.conformance.consumer_proof does the work).

Exit status: 0 every run held; 1 a run lost a message, applied one twice or left one on the broker; 2 a broker or an
engine is unavailable; 64 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..output import add_output, add_quiet, prefixed, progress, write
from . import EXIT_FAILED, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE

LIVE_ENGINES = ["sqlite", "postgresql-18", "postgresql", "mariadb"]
BROKERS = ["rabbitmq", "nats", "redis"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--broker", action="append", choices=BROKERS, default=[],
                        help="broker to prove (repeatable; default: rabbitmq, nats and redis)")
    parser.add_argument("--engine", action="append", metavar="NAME", default=[],
                        help="engine from `idem-dialects engines` (repeatable; default: sqlite, postgresql-18,"
                             " postgresql, mariadb; 'all' = every engine available here)")
    parser.add_argument("--messages", type=int, default=10_000, metavar="N",
                        help="messages published per run, duplicates included (default 10000)")
    parser.add_argument("--duplicates", type=float, default=0.2, metavar="RATIO",
                        help="share of the messages that are a second publish of an earlier one (default 0.2)")
    parser.add_argument("--kills", type=int, default=5, metavar="K",
                        help="consumer processes killed (SIGKILL) at random points per run (default 5)")
    parser.add_argument("--workers", type=int, default=2, metavar="W",
                        help="consumer processes running at once (default 2)")
    parser.add_argument("--seed", type=int, help="random seed for the messages and the kills (default: random)")
    parser.add_argument("--format", choices=("markdown", "json"), default="markdown",
                        help="markdown (the table) or json (every count)")
    add_output(parser)
    add_quiet(parser)


def run(args: argparse.Namespace) -> int:
    from ...conformance.consumer_proof import BROKER_ORDER, Proof, describe, table
    from ...engines import expand, provision
    from ...engines.brokers import BROKERS as SPECS
    from ...engines.brokers import first_unavailable

    prog = "idem-dialects consumers"
    if args.messages < 10 or not 0 <= args.duplicates < 1 or args.kills < 0 or args.workers < 1:
        print(f"{prog}: --messages must be at least 10, --duplicates in [0, 1), --kills >= 0, --workers >= 1",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        names = expand(args.engine or LIVE_ENGINES)
    except KeyError as exc:
        print(f"{prog}: {exc.args[0]}", file=sys.stderr)
        return EXIT_USAGE
    brokers = [b for b in BROKER_ORDER if b in (args.broker or BROKERS)]
    why = first_unavailable(brokers)
    if why:
        print(f"{prog}: {why}", file=sys.stderr)
        return EXIT_UNAVAILABLE

    log = progress("consumers", args.quiet)
    results = []
    for name in names:
        status = provision(name, {})
        if status.server is None:
            if "all" in args.engine:
                log(f"{name}: unavailable, skipped ({status.reason})")
                continue
            print(f"{prog}: {name} is unavailable: {status.reason}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        try:
            for broker in brokers:
                log(f"{broker} x {name}: {args.messages} messages, {args.kills} kills")
                proof = Proof(broker, SPECS[broker].url(), name, status.server.url, total=args.messages,
                              duplicate_share=args.duplicates, kills=args.kills, workers=args.workers,
                              seed=args.seed, log=prefixed(log, f"{broker} x {name}: "))
                results.append(proof.run())
        finally:
            status.server.stop()
    text = (json.dumps([describe(r) for r in results], indent=2) + "\n" if args.format == "json"
            else table(results) + "\n")
    write(text, args.output)
    return EXIT_OK if all(r.ok for r in results) else EXIT_FAILED
