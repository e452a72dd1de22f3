"""The idem-dialects command. Each subcommand lives in idem_dialects.commands.<name>, imported only when used.

Every expected error ends in at most two lines on stderr (what failed; how to fix it) and a documented exit status,
never a traceback: 0 success, 1 a conformance check failed, 2 the command could not do its work as asked
(configuration, driver, connection, bad argument, unwritable --output; a required engine unavailable).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib import import_module
from pathlib import Path

from . import __version__

EXIT_OK, EXIT_FAILED, EXIT_ERROR = 0, 1, 2

# name -> one-line help; the module idem_dialects.commands.<name> provides add_arguments(parser) and run(args).
COMMANDS = {
    "demo": "run seed 000's reference example on an embedded SQLite database, step by step",
    "engines": "list every engine: available here or not, how, and what would enable it",
    "matrix": "run the conformance suite across engines and compare their behaviour",
    "check": "run the conformance suite against one database URL",
    "bench": "measure what idempotency costs on one database, beside the bare effect",
    "init": "create the idempotency tables in the database at URL (idempotent)",
    "ddl": "print the CREATE statements for the database at URL (no connection: give them to a DBA)",
    "purge": "delete records completed longer ago than --older-than, in batches, with progress",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="idem-dialects",
        description="Idempotency keys in SQL: one protocol, a backend per engine, one conformance suite.",
        epilog="exit status: 0 success; 1 a conformance check failed; 2 configuration, driver, connection or"
               " argument error (the message says how to fix it), or a required engine unavailable",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help_text in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        import_module(f"idem_dialects.commands.{name}").add_arguments(command)
    return parser


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


def explain(exc: BaseException) -> tuple[str, str | None] | None:
    """(what failed, how to fix it) for an expected error; None for a bug, which keeps its traceback."""
    from sqlalchemy.exc import ArgumentError, DBAPIError

    from . import dialects
    from .errors import IdemError

    if isinstance(exc, IdemError):
        return str(exc).strip().splitlines()[0], None  # the library's messages say how to fix it themselves
    if isinstance(exc, DBAPIError):
        orig = exc.orig if exc.orig is not None else exc
        first = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
        what = "cannot connect" if exc.statement is None else "database error"  # no statement: the connect failed
        return f"{what} ({type(orig).__name__}): {first}", dialects.connect_hint(exc)
    if isinstance(exc, ArgumentError):
        return str(exc).strip().splitlines()[0], "check the URL and the options given"
    if isinstance(exc, OSError):
        return str(exc), None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    prog = f"idem-dialects {args.command}"
    output = getattr(args, "output", None)
    if output and (why := unwritable(output)):
        print(f"{prog}: cannot write the report to {output}: {why}", file=sys.stderr)
        print("  fix: give --output a file in an existing, writable directory", file=sys.stderr)
        return EXIT_ERROR
    try:
        code: int = import_module(f"idem_dialects.commands.{args.command}").run(args)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        explained = explain(exc)
        if explained is None:
            raise
        what, fix = explained
        print(f"{prog}: {what}", file=sys.stderr)
        if fix:
            print(f"  fix: {fix}", file=sys.stderr)
        return EXIT_ERROR
    return code


if __name__ == "__main__":
    sys.exit(main())
