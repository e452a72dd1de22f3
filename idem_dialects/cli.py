"""The idem-dialects command. Each subcommand lives in idem_dialects.commands.<name>, imported only when used."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import import_module

from . import __version__

# name -> one-line help; the module idem_dialects.commands.<name> provides add_arguments(parser) and run(args).
COMMANDS = {
    "demo": "run seed 000's reference example on an embedded SQLite database, step by step",
    "engines": "list every engine: available here or not, how, and what would enable it",
    "matrix": "run the conformance suite across engines and compare their behaviour",
    "check": "run the conformance suite against one database URL",
    "bench": "measure what idempotency costs on one or several databases, beside the bare effect",
    "report": "render saved JSON reports of matrix and bench: table, markdown or one self-contained HTML file",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="idem-dialects",
        description="Idempotency keys in SQL: one protocol, a backend per engine, one conformance suite.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help_text in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        import_module(f"idem_dialects.commands.{name}").add_arguments(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = import_module(f"idem_dialects.commands.{args.command}").run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
