"""The idem-dialects command. Each subcommand lives in idem_dialects.commands.<name>, imported only when it runs
(`idem-dialects demo` never loads pytest, the engine catalogue or the benchmark)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn, Protocol

from . import __version__
from .commands import EXIT_USAGE


class Command(Protocol):
    """What a module of idem_dialects.commands provides."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def _demo() -> Command:
    from .commands import demo

    return demo


def _engines() -> Command:
    from .commands import engines

    return engines


def _matrix() -> Command:
    from .commands import matrix

    return matrix


def _check() -> Command:
    from .commands import check

    return check


def _bench() -> Command:
    from .commands import bench

    return bench


def _report() -> Command:
    from .commands import report

    return report


@dataclass(frozen=True)
class Subcommand:
    help: str
    load: Callable[[], Command]


# The registry of subcommands: a one-line help (enough for `idem-dialects --help`) and how to load the module.
COMMANDS: dict[str, Subcommand] = {
    "demo": Subcommand("run seed 000's reference example on an embedded SQLite database, step by step", _demo),
    "engines": Subcommand("list every engine: available here or not, how, and what would enable it", _engines),
    "matrix": Subcommand("run the conformance suite across engines and compare their behaviour", _matrix),
    "check": Subcommand("run the conformance suite against one database URL", _check),
    "bench": Subcommand("measure what idempotency costs on one or several databases, beside the bare effect",
                        _bench),
    "report": Subcommand("render saved JSON reports of matrix and bench: table, markdown or one self-contained HTML"
                         " file", _report),
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
    for name, spec in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=spec.help, description=spec.help)
        if name == command:
            spec.load().add_arguments(sub_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = chosen_command(argv)
    args = build_parser(command if command in COMMANDS else None).parse_args(argv)
    return COMMANDS[args.command].load().run(args)


if __name__ == "__main__":
    sys.exit(main())
