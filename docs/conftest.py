"""Every example in the docs runs in the test command (Sybil).

- ```python blocks run in one namespace per page, in a fresh temporary directory of that page (so
  `sqlite:///app.db` is a throw-away file): SQLite by default; a page whose example names a server engine skips
  it, with the reason, where that engine does not answer here
  (``% skip: next if(not live("postgresql"), reason="...")``).
- ```console blocks run each `$ command` line with bash in that directory (the project's venv first on PATH); the
  lines after a command are the output it shows and are not compared. Each must exit 0.
- A block that cannot run here says why: ``% skip: next "reason"``.

The run prints how many documentation examples it executed.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sybil import Example, Sybil
from sybil.evaluators.python import PythonEvaluator
from sybil.parsers.myst import CodeBlockParser, SkipParser

_LIVE_PORTS = {"postgresql": 5432, "mariadb": 3306, "rabbitmq": 5672, "nats": 4222, "redis": 6379}


def live(engine: str) -> bool:
    """Whether the machine's server for `engine` (or broker) answers on its loopback port."""
    try:
        with socket.create_connection(("127.0.0.1", _LIVE_PORTS[engine]), timeout=1):
            return True
    except OSError:
        return False


def _run_console(example: Example) -> None:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("PYTEST_ADDOPTS", None)  # the reader's shell has none; CI's own options name this project's test flags
    for line in str(example.parsed).splitlines():
        if not line.startswith("$ "):
            continue  # output shown by the page
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", line[2:]], capture_output=True, text=True,
                              env=env, timeout=300)
        assert done.returncode == 0, f"{line!r} exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"


@pytest.fixture(scope="module")  # one directory per page: its blocks build on each other
def docs_workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with pytest.MonkeyPatch.context() as patch:
        path = tmp_path_factory.mktemp("page")
        patch.chdir(path)
        yield path


def _setup(namespace: dict[str, Any]) -> None:
    namespace["live"] = live


_executed: list[str] = []  # examples that ran (skip directives and skipped blocks are not examples that ran)


def _counted(evaluator: Callable[[Example], str | None]) -> Callable[[Example], str | None]:
    def evaluate(example: Example) -> str | None:
        _executed.append(f"{example.path}:{example.line}")
        return evaluator(example)

    return evaluate


pytest_collect_file = Sybil(
    parsers=[CodeBlockParser(language="python", evaluator=_counted(PythonEvaluator())),
             CodeBlockParser(language="console", evaluator=_counted(_run_console)),
             SkipParser()],
    patterns=["*.md", "**/*.md"],
    fixtures=["docs_workdir"],
    setup=_setup,
).pytest()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _executed:
        skipped = len({r.nodeid for r in terminalreporter.stats.get("skipped", []) if ".md::line:" in r.nodeid})
        terminalreporter.write_line(f"documentation examples executed: {len(set(_executed))} (and {skipped} skipped,"
                                    " each with its reason)")
