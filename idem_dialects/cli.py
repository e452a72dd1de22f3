"""The idem-dialects command. Each subcommand lives in idem_dialects.commands.<name>, imported only when it runs
(`idem-dialects demo` never loads pytest, the engine catalogue or the benchmark)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn, Protocol

from . import __version__
from .commands import EXIT_USAGE


class Command(Protocol):
    """What a module of idem_dialects.commands provides."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def load(name: str) -> Command:
    """The module of subcommand `name`, imported only now. Explicit imports (not import_module), so mypy checks
    that each module really provides add_arguments and run."""
    module: Command
    if name == "demo":
        from .commands import demo as module
    elif name == "engines":
        from .commands import engines as module
    elif name == "matrix":
        from .commands import matrix as module
    elif name == "check":
        from .commands import check as module
    elif name == "bench":
        from .commands import bench as module
    elif name == "report":
        from .commands import report as module
    else:
        raise KeyError(f"unknown subcommand {name!r}")
    return module


# The registry of subcommands and their one-line help (enough for `idem-dialects --help`); `load` imports one.
COMMANDS: dict[str, str] = {
    "demo": "run seed 000's reference example on an embedded SQLite database, step by step",
    "engines": "list every engine: available here or not, how, and what would enable it",
    "matrix": "run the conformance suite across engines and compare their behaviour",
    "check": "run the conformance suite against one database URL",
    "bench": "measure what idempotency costs on one or several databases, beside the bare effect",
    "report": "render saved JSON reports of matrix and bench: table, markdown or one self-contained HTML file",
}


def chosen_command(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line: the first argument that is not an option (the top-level parser
    has only --help and --version, which take no value)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error exits with EXIT_USAGE (argparse's 2 is "engine unavailable" here)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only `command`'s module is imported (to add its arguments), the others are listed by name."""
    parser = Parser(
        prog="idem-dialects",
        description="Idempotency keys in SQL: one protocol, a backend per engine, one conformance suite.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help_text in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            load(name).add_arguments(sub_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = chosen_command(argv)
    args = build_parser(command if command in COMMANDS else None).parse_args(argv)
    return load(args.command).run(args)


if __name__ == "__main__":
    sys.exit(main())
