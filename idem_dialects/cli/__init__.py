"""The idem-dialects command. Each subcommand lives in idem_dialects.cli.commands.<name>, imported only when it runs
(`idem-dialects demo` never loads pytest or the engine catalogue); `bench` comes from another distribution, the
benchmark harness, through an entry point (idem_dialects.cli.plugins).

Every expected error ends in at most two lines on stderr (what failed; how to fix it) and a documented exit status
(idem_dialects.cli.commands), never a traceback: `main` handles the library's errors, driver and connection errors.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn, Protocol

from .. import __version__
from .commands import EXIT_CONFIG, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE
from .output import redacted
from .plugins import COMMAND_GROUP, PROVIDERS, NotInstalled, installed, plugin


class Subcommand(Protocol):
    """What a module of idem_dialects.cli.commands provides."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def load_command(name: str) -> Subcommand:
    """The module of subcommand `name`, imported only now. Explicit imports (no import by name), so mypy checks
    that each module really provides add_arguments and run; a plugin's (PROVIDERS) through its entry point, or
    NotInstalled."""
    module: Subcommand
    if name in PROVIDERS:
        module = plugin(COMMAND_GROUP, name)
    elif name == "demo":
        from .commands import demo as module
    elif name == "engines":
        from .commands import engines as module
    elif name == "matrix":
        from .commands import matrix as module
    elif name == "check":
        from .commands import check as module
    elif name == "report":
        from .commands import report as module
    elif name == "init":
        from .commands import init as module
    elif name == "ddl":
        from .commands import ddl as module
    elif name == "purge":
        from .commands import purge as module
    elif name == "stats":
        from .commands import stats as module
    elif name == "consumers":
        from .commands import consumers as module
    elif name == "relay":
        from .commands import relay as module
    elif name == "outbox-proof":
        from .commands import outbox_proof as module
    else:
        raise KeyError(f"unknown subcommand {name!r}")
    return module


# The registry of subcommands and their one-line help (enough for `idem-dialects --help`); `load` imports one.
COMMANDS: dict[str, str] = {
    "demo": "run the reference example (debits with one idempotency key) on an embedded SQLite database, step by step",
    "engines": "list every engine: available here or not, how, and what would enable it",
    "matrix": "run the conformance suite across engines and compare their behaviour",
    "check": "run the conformance suite against one database URL",
    "bench": "measure what idempotency costs on one or several databases, beside the bare effect (the benchmark"
             " harness: tools/bench)",
    "report": "render saved JSON reports of matrix and bench: table, markdown or one self-contained HTML file",
    "init": "create the idempotency tables in the database at URL (idempotent)",
    "ddl": "print the CREATE statements for a database URL or backend, without connecting",
    "purge": "delete records completed longer ago than --older-than, in batches, with progress",
    "stats": "records by state, stuck claims, the purge backlog and table sizes; a monitoring check with --fail-on-*",
    "consumers": "prove the broker consumers under faults: messages with duplicates, consumer kills, every message"
                 " applied once (a table)",
    "relay": "publish the outbox's commands to RabbitMQ, NATS JetStream, Redis Streams or HTTP, under their stable"
             " ids; --stats, --requeue-dead",
    "outbox-proof": "prove the outbox end to end under faults: HTTP requests with duplicates, relay and consumer kills,"
                    " database restarts, every command's effect applied once (a table)",
}


def chosen_command(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line: the first argument that is not an option (the top-level parser
    has only --help and --version, which take no value)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error exits with EXIT_USAGE (argparse's 2 is "engine unavailable" here), never
    repeats a URL's password (argparse quotes the argument it refuses), and an argument no parser knows is refused
    with the usage of the subcommand it was given to (argparse's own says the top level's)."""

    commands: dict[str, argparse.ArgumentParser]

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {redacted(message)}\n")

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: None = None) -> argparse.Namespace:
        parsed, unknown = self.parse_known_args(args)
        if unknown:
            self.commands.get(parsed.command, self).error(f"unrecognized arguments: {' '.join(unknown)}")
        return parsed


def build_parser(command: str | None = None, *, every: bool = False) -> argparse.ArgumentParser:
    """The parser; only `command`'s module is imported (to add its arguments), the others are listed by name.
    `every`: every subcommand with all its arguments (the docs' command reference is generated from this)."""
    parser = Parser(
        prog="idem-dialects",
        description="Idempotency keys in SQL: one protocol, a backend per engine, one conformance suite.",
        epilog=f"exit status: 0 success; 1 a conformance check failed; {EXIT_UNAVAILABLE} a database did not answer"
               " or refused the connection (wrong password, unknown user, database or host), or a required engine is"
               f" unavailable; {EXIT_USAGE} a wrong command line or argument value; {EXIT_CONFIG} a configuration"
               " error (driver or system library, the [conformance] extra, tables, privileges, autocommit). The"
               " message says how to fix it; the docs page Configuration mistakes lists each one.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    parser.commands = {}
    for name, help_text in COMMANDS.items():
        sub_parser = parser.commands[name] = sub.add_parser(name, help=help_text, description=help_text)
        if name == command or (every and (name not in PROVIDERS or installed(COMMAND_GROUP, name))):
            load_command(name).add_arguments(sub_parser)
    return parser


def reference_parser() -> argparse.ArgumentParser:
    """Every subcommand with every option, for the command reference (sphinx-argparse calls this)."""
    return build_parser(every=True)


def unwritable(path: str) -> str | None:
    """Why a report could not be written to `path` (checked before any work), or None."""
    target = Path(path)
    if target.is_dir():
        return "it is a directory"
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        return f"directory {parent} does not exist"
    if (target.exists() and not os.access(target, os.W_OK)) or (not target.exists() and not os.access(parent, os.W_OK)):
        return "permission denied"
    return None


def explain(exc: BaseException) -> tuple[str, str | None, int] | None:
    """(what failed, how to fix it, exit status) for an expected error; None for a bug, which keeps its traceback."""
    from sqlalchemy.exc import ArgumentError, DBAPIError

    from ..errors import (
        CannotConnect,
        ConfigurationError,
        ConnectionConfigError,
        IdemError,
        InvalidURL,
        MissingDriver,
        RetriesExhausted,
    )

    unreachable = "check that the server runs and listens at the URL's host and port"
    if isinstance(exc, RetriesExhausted) and isinstance(exc.last_error, CannotConnect):
        exc = exc.last_error  # a database that never answered within the retry budget
    # The one classification of connection problems (each backend's `connect_error`, the driver's own loading)
    # reaches every command through here: what failed on the first line, the fix on the second.
    if isinstance(exc, ConnectionConfigError):  # wrong password, unknown user, database or host, missing directory
        return f"cannot connect to the {exc.backend} database: {exc.problem}", exc.fix, EXIT_UNAVAILABLE
    if isinstance(exc, MissingDriver):  # the driver's package, or a system library it loads
        return exc.problem, exc.fix, EXIT_CONFIG
    if isinstance(exc, CannotConnect):
        return str(exc).strip().splitlines()[0], unreachable, EXIT_UNAVAILABLE
    if isinstance(exc, InvalidURL):  # a wrong command line
        return exc.problem, exc.expected, EXIT_USAGE
    if isinstance(exc, ConfigurationError):  # the library's messages say how to fix it themselves
        return str(exc).strip().splitlines()[0], None, EXIT_CONFIG
    if isinstance(exc, RetriesExhausted):
        return str(exc).strip().splitlines()[0], None, EXIT_UNAVAILABLE
    if isinstance(exc, IdemError):  # e.g. an argument value out of bounds (InvalidPayload)
        return str(exc).strip().splitlines()[0], None, EXIT_USAGE
    if isinstance(exc, DBAPIError):
        orig = exc.orig if exc.orig is not None else exc
        first = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
        if exc.statement is None:  # no statement: opening the connection failed
            return f"cannot connect ({type(orig).__name__}): {first}", unreachable, EXIT_UNAVAILABLE
        return f"database error ({type(orig).__name__}): {first}", None, EXIT_UNAVAILABLE
    if isinstance(exc, ArgumentError):
        return str(exc).strip().splitlines()[0], "check the URL and the options given", EXIT_CONFIG
    if isinstance(exc, OSError):
        return str(exc), None, EXIT_UNAVAILABLE
    return None


def stdout_closed() -> bool:
    """Whether the reader of stdout went away (`... | head -1`): the write end of a pipe without a reader polls as
    an error. If so, stdout now points at /dev/null, so the interpreter's final flush does not fail again."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # replaced by something that is not a file (a test's capture)
        return False
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        if not any(events & select.POLLERR for _, events in poller.poll(0)):
            return False
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()  # here, not at interpreter exit: a reader that left is then handled below
    except BrokenPipeError:
        if not stdout_closed():
            raise
        return EXIT_OK  # the reader of stdout left (`| head -1`): not an error


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = chosen_command(argv)
    try:
        parser = build_parser(command if command in COMMANDS else None)
    except NotInstalled as exc:  # a plugin's subcommand (bench) without its distribution: what to install
        print(f"idem-dialects {exc.name}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    args = parser.parse_args(argv)
    prog = f"idem-dialects {args.command}"
    if not logging.getLogger().handlers:
        # The command reports each failure itself, in two lines; the library's retry log lines would repeat it
        # through Python's last-resort stderr handler.
        logging.getLogger("idem_dialects").addHandler(logging.NullHandler())
    output = getattr(args, "output", None)
    if output and (why := unwritable(output)):
        print(f"{prog}: cannot write the report to {output}: {why}", file=sys.stderr)
        print("  fix: give --output a file in an existing, writable directory", file=sys.stderr)
        return EXIT_USAGE
    try:
        return load_command(args.command).run(args)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if isinstance(exc, BrokenPipeError) and stdout_closed():
            return EXIT_OK  # the reader of stdout left (`| head -1`): not an error
        explained = explain(exc)
        if explained is None:
            raise
        what, fix, status = explained
        print(f"{prog}: {what}", file=sys.stderr)
        if fix:
            print(f"  fix: {fix}", file=sys.stderr)
        return status


if __name__ == "__main__":
    sys.exit(main())
