"""The benchmark harness is a distribution of its own (tools/bench, idem-dialects-bench), not the library: the runtime
tree holds none of it, importing the library or its command loads none of it, `idem-dialects bench` reaches it
through an entry point, and without it says in one line what to install. (tests/test_wheel.py proves the same on the
built wheel: no harness inside, and `idem-dialects bench` in a fresh install without it.)"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ("idem_dialects_bench", "idem_dialects.cli.bench", "idem_dialects.cli.reporting.bench", "uvicorn",
           "starlette")

LOADED = """
import sys
{code}
print(sorted(m for m in sys.modules if m.startswith({harness!r})))
"""
# `idem-dialects bench` and `report bench.json` as where the harness is not installed: no distribution registers it.
WITHOUT = """
import sys
import idem_dialects.cli.plugins as plugins
plugins.entry_points = lambda **selection: []
from idem_dialects.cli import main
sys.exit(main(sys.argv[1:]))
"""


def python(code: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_the_runtime_tree_holds_no_harness() -> None:
    found = [str(p.relative_to(ROOT)) for p in (ROOT / "idem_dialects").rglob("*") if "bench" in p.name]
    assert found == []
    assert (ROOT / "tools" / "bench" / "pyproject.toml").is_file()


def test_importing_the_library_or_its_command_loads_no_harness() -> None:
    for code in ("import idem_dialects", "import idem_dialects.cli",
                 "import idem_dialects.cli.reporting\nfrom idem_dialects.cli import main\ntry:\n    main(['--help'])\n"
                 "except SystemExit:\n    pass"):
        done = python(LOADED.format(code=code, harness=HARNESS))
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().splitlines()[-1] == "[]", code


def test_bench_comes_through_its_entry_point() -> None:
    done = subprocess.run([Path(sys.executable).with_name("idem-dialects"), "bench", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: idem-dialects bench") and "--api" in done.stdout


def test_without_the_harness_bench_says_what_to_install_in_one_line(tmp_path: Path) -> None:
    for argv in (["bench", "sqlite"], ["bench", "--help"]):
        done = python(WITHOUT, *argv)
        assert done.returncode == 78, done  # a configuration error, as a missing extra is
        assert done.stdout == "" and "Traceback" not in done.stderr
        assert done.stderr.splitlines() == [
            "idem-dialects bench: bench is not installed here: it comes with the idem-dialects-bench distribution"
            " (pip install -e tools/bench in a checkout of idem-dialects)"]
    saved = tmp_path / "bench.json"
    saved.write_text('{"schema": "idem-dialects-bench/1", "engine": {}, "modes": {}}')
    done = python(WITHOUT, "report", str(saved))
    assert done.returncode == 78 and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        "idem-dialects report: bench is not installed here: it comes with the idem-dialects-bench distribution"
        " (pip install -e tools/bench in a checkout of idem-dialects)"]


def test_the_account_table_imports_sqlalchemy_alone() -> None:
    """tools/ab_instructions.py runs the bench's debit in another checkout's interpreter by loading accounts.py from
    its file: the module may import the standard library and SQLAlchemy, nothing of the library or the harness."""
    source = (ROOT / "tools" / "bench" / "idem_dialects_bench" / "accounts.py").read_text(encoding="utf-8")
    imported = {node.module if isinstance(node, ast.ImportFrom) else alias.name
                for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Import | ast.ImportFrom)
                for alias in node.names}
    assert {str(name).partition(".")[0] for name in imported} <= {"__future__", "collections", "typing", "sqlalchemy"}
