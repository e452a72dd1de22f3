"""`idem-dialects relay URL --route orders=amqp://guest:guest@localhost/`: publish the outbox's commands of the
database at URL, until stopped (SIGTERM, Ctrl-C), or once through with --once; --stats prints the outbox's backlog,
--requeue-dead gives dead-lettered commands a fresh start. Run as many relays as you like: they share the outbox
through each engine's skip-locked read (docs: outbox).

Exit status: 0 done (or stopped); 1 --once left dead-lettered commands behind; 2 --once met a destination that
refused the credentials in its --route URL (or a database that did not answer); 64 bad arguments.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import signal
import sys
import threading
from typing import Any

from ...relay import Relay
from ...store import IdempotencyStore
from ..database import reached
from ..output import add_quiet, redacted
from . import EXIT_FAILED, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="SQLAlchemy URL of the database holding the outbox")
    parser.add_argument("--route", action="append", default=[], metavar="DESTINATION=URL",
                        help="publish commands for DESTINATION ('*': any other) to URL: amqp://... (RabbitMQ;"
                             " ?exchange=&routing_key=), nats://... (JetStream; ?subject=&stream=), redis://..."
                             " (?stream=), http(s)://... ({destination} is replaced); repeatable")
    parser.add_argument("--table-prefix", default="idem_", help="table name prefix (default: idem_)")
    parser.add_argument("--batch", type=int, default=100, metavar="N", help="commands per round (default 100)")
    parser.add_argument("--lease", type=float, default=30.0, metavar="SECONDS",
                        help="how long a round's commands are this relay's before another may take them (default 30)")
    parser.add_argument("--max-attempts", type=int, default=10, metavar="N",
                        help="failed publishes before a command is dead-lettered (default 10)")
    parser.add_argument("--unordered", action="store_true",
                        help="publish without keeping each scope's order (larger rounds when scopes are few)")
    parser.add_argument("--once", action="store_true", help="publish until nothing is due, then exit")
    parser.add_argument("--stats", action="store_true", help="print the outbox's backlog as JSON and exit")
    parser.add_argument("--requeue-dead", action="store_true",
                        help="make dead-lettered commands pending again (after fixing the cause), then exit")
    add_quiet(parser, "no summary line (errors still go to stderr)")


def watched(publisher: Any, route: str, refused: list[str]) -> Any:
    """`publisher`, noting (in `refused`, and in a log line, once) that its destination refused its credentials:
    the relay gives such a command back untried, as for a destination that is down, which no pause fixes."""
    from ...publishers import CredentialsRefused

    def note() -> None:
        if route not in refused:
            refused.append(route)
            logging.getLogger("idem_dialects.relay").error("%s: authentication failed; fix its user and password",
                                                           route)

    class Watched:
        def close(self) -> None:
            close = getattr(publisher, "close", None)
            if close is not None:
                close()

    if inspect.iscoroutinefunction(publisher.publish):
        class AsyncWatched(Watched):
            async def publish(self, command: Any) -> None:
                try:
                    await publisher.publish(command)
                except CredentialsRefused:
                    note()
                    raise

            async def close(self) -> None:  # type: ignore[override]
                close = getattr(publisher, "close", None)
                if close is not None:
                    await close()

        return AsyncWatched()

    class SyncWatched(Watched):
        def publish(self, command: Any) -> None:
            try:
                publisher.publish(command)
            except CredentialsRefused:
                note()
                raise

    return SyncWatched()


def run(args: argparse.Namespace) -> int:
    prog = "idem-dialects relay"
    routes: dict[str, Any] = {}
    refused: list[str] = []  # routes whose destination refused their credentials
    if not (args.stats or args.requeue_dead):
        from ...publishers import from_url

        for item in args.route:
            name, sep, url = item.partition("=")
            if not sep or not name or not url or "://" in name:  # a bare URL's query has a "=" too
                print(f"{prog}: --route takes DESTINATION=URL, got {redacted(item)!r}", file=sys.stderr)
                print(f"  fix: name the destination the commands are for, e.g. --route 'orders={redacted(item)}'"
                      " ('*' for any other)", file=sys.stderr)
                return EXIT_USAGE
            try:
                routes[name] = watched(from_url(url), f"--route {name}={redacted(url)}", refused)
            except ValueError as exc:
                print(f"{prog}: --route {name}: {redacted(str(exc))}", file=sys.stderr)
                return EXIT_USAGE
        if not routes:
            print(f"{prog}: give at least one --route DESTINATION=URL", file=sys.stderr)
            return EXIT_USAGE
    # Once through (--once, --stats, --requeue-dead), a database that does not answer is told at once; running until
    # stopped, the relay waits out a failover within the store's retry budget.
    once = args.once or args.stats or args.requeue_dead
    with (reached if once else IdempotencyStore.from_url)(args.url, table_prefix=args.table_prefix) as store:
        if args.stats:
            print(json.dumps(store.drive(store.outbox.stats()).as_dict()))
            return EXIT_OK
        if args.requeue_dead:
            count = store.drive(store.outbox.requeue())
            if not args.quiet:
                print(f"requeued {count} dead-lettered commands")
            return EXIT_OK
        logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
        relay = Relay(store, routes, batch=args.batch, lease=args.lease, max_attempts=args.max_attempts,
                      ordered=not args.unordered)
        if args.once:
            try:
                while relay.run_once():
                    pass
            finally:
                relay.close()
            if refused:
                print(f"{prog}: {refused[0]}: authentication failed, nothing was published there", file=sys.stderr)
                print("  fix: check the user and password in that --route URL", file=sys.stderr)
                return EXIT_UNAVAILABLE
        else:
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
            try:
                relay.run(stop)
            except KeyboardInterrupt:
                pass
        stats = store.drive(store.outbox.stats())
        if not args.quiet:
            print(json.dumps({"relay": relay.metrics.as_dict(), "outbox": stats.as_dict()}))
        return EXIT_FAILED if args.once and stats.dead else EXIT_OK
