"""What every report-printing subcommand shares: ``-o/--output FILE`` and ``-q/--quiet``, spelled and written one way.

The report goes to stdout or to the file; progress goes to stderr unless ``-q``. A reader that closes the pipe
early (``idem-dialects ddl sqlite | head -1``) is not an error: `idem_dialects.cli.main` ends quietly with 0.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

Log = Callable[[str], None]

# USER:PASSWORD@ in a URL's text, wherever a command repeats an argument (argparse's refusals, a malformed --route):
# up to the last "@", as a password may hold one unencoded.
_URL_PASSWORD = re.compile(r"(://[^:/@\s'\"]*:)[^\s'\"]*@")


def redacted(text: str) -> str:
    """`text` with the password of any URL in it replaced by ***."""
    return _URL_PASSWORD.sub(r"\1***@", text)


def add_output(parser: argparse.ArgumentParser, what: str = "the report") -> None:
    parser.add_argument("-o", "--output", metavar="FILE", help=f"write {what} to FILE instead of stdout")


def add_quiet(parser: argparse.ArgumentParser, what: str = "no progress lines on stderr") -> None:
    parser.add_argument("-q", "--quiet", action="store_true", help=what)


def write(text: str, output: str | None) -> None:
    """`text` to the file `output` (checked writable before any work, by `main`), or to stdout."""
    if output:
        Path(output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
        sys.stdout.flush()


def progress(command: str, quiet: bool) -> Log:
    """The progress lines of `command` on stderr, each as it happens (none with ``-q``)."""
    def log(line: str) -> None:
        if not quiet:
            print(f"{command}: {line}", file=sys.stderr, flush=True)

    return log


def prefixed(log: Log, prefix: str) -> Log:
    """`log` with `prefix` before each progress line (the engine or broker it is about)."""
    return lambda line: log(prefix + line)
