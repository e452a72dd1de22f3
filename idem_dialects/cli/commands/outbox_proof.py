"""`idem-dialects outbox-proof`: prove the outbox end to end under faults. On each broker and engine: HTTP requests
with duplicates (the WSGI middleware, atomic mode) write an order, its record and an outbox command together; relay
processes publish the commands; consumer processes apply them through their inbox; relays and consumers are killed
(SIGKILL) at random moments and the database server is restarted. Every command's effect must be applied exactly
once (idem_dialects.conformance.outbox_proof does the work). With --restarts, the database is a private server of
the engine's backend this command starts (never the machine's own).

Exit status: 0 every run held; 1 a run lost or doubled an effect; 2 a broker or an engine is unavailable; 64 bad
arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from ..output import add_output, add_quiet, prefixed, progress, write
from . import EXIT_FAILED, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE

BROKERS = ["rabbitmq", "nats", "redis"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--broker", action="append", choices=BROKERS, default=[],
                        help="broker (repeatable; default: rabbitmq and nats)")
    parser.add_argument("--engine", action="append", metavar="NAME", default=[],
                        help="engine from `idem-dialects engines` (repeatable; default: postgresql, mariadb)")
    parser.add_argument("--requests", type=int, default=10_000, metavar="N",
                        help="HTTP requests per run, duplicates included (default 10000)")
    parser.add_argument("--duplicates", type=float, default=0.2, metavar="RATIO",
                        help="share of the requests that repeat an earlier one's key (default 0.2)")
    parser.add_argument("--kills", type=int, default=20, metavar="K",
                        help="relay and consumer processes killed, alternately, per run (default 20)")
    parser.add_argument("--restarts", type=int, default=2, metavar="R",
                        help="database restarts per run (default 2; on a private server of the engine's backend)")
    parser.add_argument("--seed", type=int, help="random seed (default: random)")
    parser.add_argument("--format", choices=("markdown", "json"), default="markdown")
    add_output(parser)
    add_quiet(parser)


def run(args: argparse.Namespace) -> int:
    from ...conformance.outbox_proof import OutboxProof, table
    from ...engines import Unavailable, get, provisioning
    from ...engines.brokers import BROKERS as SPECS
    from ...engines.brokers import first_unavailable

    prog = "idem-dialects outbox-proof"
    if args.requests < 10 or not 0 <= args.duplicates < 1 or args.kills < 0 or args.restarts < 0:
        print(f"{prog}: --requests >= 10, --duplicates in [0, 1), --kills >= 0, --restarts >= 0", file=sys.stderr)
        return EXIT_USAGE
    brokers = args.broker or ["rabbitmq", "nats"]
    why = first_unavailable(brokers)
    if why:
        print(f"{prog}: {why}", file=sys.stderr)
        return EXIT_UNAVAILABLE

    log = progress("outbox-proof", args.quiet)
    results = []
    for name in args.engine or ["postgresql", "mariadb"]:
        try:
            spec = get(name)
            server = (provisioning(spec.backend).private_server(spec.backend) if args.restarts
                      else spec.provide())
        except (KeyError, Unavailable) as exc:
            print(f"{prog}: {name} is unavailable: {exc}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        try:
            for broker in brokers:
                log(f"{broker} x {name}: {args.requests} requests, {args.kills} kills, {args.restarts} restarts")
                proof = OutboxProof(broker, SPECS[broker].url(), name, server, requests=args.requests,
                                    duplicate_share=args.duplicates, kills=args.kills, restarts=args.restarts,
                                    seed=args.seed, log=prefixed(log, f"{broker} x {name}: "))
                results.append(proof.run())
        finally:
            server.stop()
    text = (json.dumps([{**asdict(r), "counts": dict(r.counts), "ok": r.ok} for r in results], indent=2) + "\n"
            if args.format == "json" else table(results) + "\n")
    write(text, args.output)
    return EXIT_OK if all(r.ok for r in results) else EXIT_FAILED
