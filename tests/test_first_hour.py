"""A user's first hour, as a newcomer meets it: the command line against a server that is not there, a password
with the characters a URL reserves, an option mistyped after a subcommand, the build of the distributions, and the
words of the pages they read. Each test runs the `idem-dialects` command (or `python -m build`) in a subprocess."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from sqlalchemy import create_engine, inspect, text

from idem_dialects.cli import COMMANDS
from idem_dialects.cli.commands import EXIT_UNAVAILABLE, EXIT_USAGE

ROOT = Path(__file__).resolve().parents[1]
MARIADB = "mariadb+pymysql://root@127.0.0.1:3306/test"
REFUSED = {"postgresql": "postgresql+psycopg://postgres@127.0.0.1:1/test",
           "mariadb": "mariadb+pymysql://root@127.0.0.1:1/test"}
# The CLI with logging at INFO on stderr: a retried connection would log each retry ("retrying after connect").
LOGGED_CLI = ("import logging, sys; logging.basicConfig(level=logging.INFO, format='LOG %(name)s: %(message)s');"
              " from idem_dialects.cli import main; sys.argv[0] = 'idem-dialects'; sys.exit(main())")


def cli(*args: str, cwd: Path | None = None, logged: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    prefix = ["-c", LOGGED_CLI] if logged else ["-m", "idem_dialects.cli"]
    return subprocess.run([sys.executable, *prefix, *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env=env)


# --- a server that is not there ----------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", list(REFUSED))
@pytest.mark.parametrize("command", [["init"], ["stats"], ["purge", "--older-than", "1d"], ["check", "--quiet"],
                                     ["relay", "--once", "--route", "*=redis://127.0.0.1:6379"],
                                     ["relay", "--stats"], ["relay", "--requeue-dead"]],
                         ids=["init", "stats", "purge", "check", "relay-once", "relay-stats", "relay-requeue"])
def test_a_refused_port_fails_at_once_naming_the_fix(command: list[str], backend: str, tmp_path: Path) -> None:
    """One attempt, never retried (the retry log stays empty), two lines in the backend's words, no driver text."""
    done = cli(command[0], REFUSED[backend], *command[1:], cwd=tmp_path, logged=True)
    assert done.returncode == EXIT_UNAVAILABLE, done.stderr
    assert "retrying after" not in done.stderr and "giving up" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if not line.startswith("LOG ")]
    assert lines == [f"idem-dialects {command[0]}: cannot connect to the {backend} database: Connection refused",
                     "  fix: check that the server runs and listens at the URL's host and port"], done.stderr
    assert not re.search(r"\(\w+(\.\w+)+\)|Errno|OperationalError", done.stderr), done.stderr


# --- passwords with the characters a URL reserves ---------------------------------------------------------------


@pytest.fixture
def mariadb_user(request: pytest.FixtureRequest) -> Iterator[tuple[str, str, str]]:
    """A MariaDB user of its own, its password (the test's parameter, else PASSWORD), and a table prefix of its own
    on the test database (dropped after, with the user)."""
    password = getattr(request, "param", PASSWORD)
    pytest.importorskip("pymysql")
    admin = create_engine(MARIADB)
    try:
        admin.connect().close()
    except Exception as exc:
        pytest.skip(f"MariaDB does not answer on 127.0.0.1:3306 here: {type(exc).__name__}")
    user, prefix = f"idem_pw_{uuid.uuid4().hex[:6]}", f"idem_pw{uuid.uuid4().hex[:6]}_"
    try:
        with admin.begin() as conn:
            conn.exec_driver_sql("CREATE USER %s@'%%' IDENTIFIED BY %s", (user, password))
            conn.exec_driver_sql(f"GRANT ALL ON test.* TO {user}@'%%'")
        yield user, password, prefix
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f"DROP USER IF EXISTS {user}@'%%'")
            for table in inspect(conn).get_table_names():
                if table.startswith(prefix):
                    conn.execute(text(f"DROP TABLE {table}"))
        admin.dispose()


PASSWORD = "Pw@:/#%?%41x"  # every reserved character, and a "%" that reads as an encoded one ("%41" is "A")


def test_a_password_holding_reserved_characters_is_told_to_be_percent_encoded(
        mariadb_user: tuple[str, str, str]) -> None:
    user, _, prefix = mariadb_user
    printed = ""
    # As written: the "@" would make the rest of the password the host. Refused before connecting, the URL's form
    # and the rule shown, the password never (neither as written nor encoded).
    done = cli("init", f"mariadb+pymysql://{user}:{PASSWORD}@127.0.0.1:3306/test", "--table-prefix", prefix)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert done.stderr.splitlines() == [
        "idem-dialects init: the URL's password holds an '@' that is not percent-encoded, so what follows it was"
        " read as the host",
        f"  fix: percent-encode the password: mariadb+pymysql://{user}:<password, percent-encoded>@127.0.0.1:3306/test"
        " (write @ as %40, : as %3A, / as %2F, # as %23, % as %25, ? as %3F; this prints a password encoded:"
        """ python3 -c 'import getpass, urllib.parse; print(urllib.parse.quote(getpass.getpass(), safe=""))')"""]
    # The command the message gives encodes a password read from its prompt (here, from stdin).
    command = re.search(r"this prints a password encoded: (.*)\)$", done.stderr.splitlines()[1])
    assert command is not None
    encoded = subprocess.run(["bash", "-c", command.group(1).replace("python3", sys.executable)],
                             input=PASSWORD + "\n", capture_output=True, text=True)
    assert encoded.stdout.strip() == quote(PASSWORD, safe="") == "Pw%40%3A%2F%23%25%3F%2541x"
    printed += done.stdout + done.stderr
    # Encoded so, the URL connects.
    url = f"mariadb+pymysql://{user}:{quote(PASSWORD, safe='')}@127.0.0.1:3306/test"
    done = cli("init", url, "--table-prefix", prefix)
    assert done.returncode == 0, done.stderr
    printed += done.stdout + done.stderr
    # "%41" left as written reads as "A": the server refuses the password, and the fix says how a URL holds one.
    done = cli("stats", url.replace("%2541", "%41"), "--table-prefix", prefix)
    assert done.returncode == EXIT_UNAVAILABLE and done.stderr.splitlines()[1] == (
        "  fix: check the user and password in the URL; a URL holds a password percent-encoded (@ as %40, : as %3A,"
        " / as %2F, # as %23, % as %25, ? as %3F)"), done.stderr
    printed += done.stdout + done.stderr
    for shown in ("Pw@", "Pw%40", "%3F%2541x", "?%41x", "Pw%40%3A%2F%23%25%3F%41x"):
        assert shown not in printed


@pytest.mark.parametrize("mariadb_user", [f"Pw{c}zz{c}x" for c in ":/#?%"], ids=list(":/#?%"), indirect=True)
def test_a_password_holding_another_reserved_character_connects_as_written(
        mariadb_user: tuple[str, str, str]) -> None:
    """Without an "@" (and with no "%" before two hex digits), such a password is read as its writer meant: the URL
    works as written, and the password is never printed."""
    user, password, prefix = mariadb_user
    done = cli("init", f"mariadb+pymysql://{user}:{password}@127.0.0.1:3306/test", "--table-prefix", prefix)
    assert done.returncode == 0, done.stderr
    assert f"{user}:***@127.0.0.1:3306/test" in done.stdout and password not in done.stdout + done.stderr


# --- the command line ----------------------------------------------------------------------------------------------


# What each subcommand needs besides the mistyped option: its positional arguments and required options.
NEEDS = {"check": ["sqlite://"], "bench": ["sqlite://"], "report": ["r.json"], "init": ["sqlite://"],
         "ddl": ["sqlite"], "purge": ["sqlite://", "--older-than", "1d"], "stats": ["sqlite://"], "relay": ["sqlite://"]}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_option_typo_after_a_subcommand_prints_that_subcommands_usage(command: str) -> None:
    from idem_dialects.cli.plugins import COMMAND_GROUP, PROVIDERS, installed

    if command in PROVIDERS and not installed(COMMAND_GROUP, command):
        pytest.skip(f"{command} comes with {PROVIDERS[command]}, not installed here")
    done = cli(command, *NEEDS.get(command, []), "--no-such-option")
    assert done.returncode == EXIT_USAGE, done.stderr
    assert done.stderr.startswith(f"usage: idem-dialects {command} "), done.stderr
    assert done.stderr.rstrip().endswith(f"idem-dialects {command}: error: unrecognized arguments: --no-such-option")


# --- the build -----------------------------------------------------------------------------------------------------


@pytest.mark.slow  # an isolated build environment from the package index
def test_python_m_build_warns_of_nothing(tmp_path: Path) -> None:
    """`python -m build` on a copy of the checkout (what git tracks): no "Package would be ignored", no warning of
    any kind. PYTHONDONTWRITEBYTECODE, if set where the test runs, is left out: a user's shell has none, and with it
    setuptools warns that it skips byte-compiling."""
    pytest.importorskip("build", reason="the build package is not installed (it is in [dev])")
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        if (ROOT / name).is_file() and not (ROOT / name).is_symlink():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTEST_ADDOPTS")}
    done = subprocess.run([sys.executable, "-m", "build", "--outdir", str(tmp_path / "dist"), str(src)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    output = done.stdout + done.stderr
    assert "would be ignored" not in output
    assert [line for line in output.splitlines() if re.search(r"warning", line, re.I)] == []


# --- the pages -----------------------------------------------------------------------------------------------------


# How the project was built, which its pages never tell: a working tree's state, a round of work, the machine or the
# session that made it.
PROCESS_WORDING = re.compile(r"uncommitted changes|\bround \d+\b|\b(?:the|this) project's (?:\S+ )?machines?\b"
                             r"|\bthis session\b", re.I)


def test_readme_benchmarks_and_docs_speak_of_the_product_not_of_how_it_was_built() -> None:
    pages = [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "tools" / "benchmarks" / "BENCHMARKS.md.in",
             *sorted((ROOT / "docs").rglob("*.md"))]
    found = [f"{page.relative_to(ROOT)}:{n}: {m.group(0)!r}" for page in pages
             for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
             for m in PROCESS_WORDING.finditer(line)]
    assert found == []


def test_the_benchmarks_page_names_a_checkout_by_commit_alone() -> None:
    """The renderer quotes neither a commit's subject nor the state of a working tree in words."""
    pytest.importorskip("idem_dialects_bench", reason="the benchmark harness (pip install -e tools/bench)")
    sys.path.insert(0, str(ROOT))
    try:
        from tools.benchmarks.render import checkout
    finally:
        sys.path.remove(str(ROOT))
    assert checkout({"commit": "c96f9ca9ad0123", "subject": "Round 4: ...", "dirty": True}) == "c96f9ca9ad-dirty"
    assert checkout({"commit": "757bb6d02a0123", "subject": "x", "dirty": False}) == "757bb6d02a"


def test_the_conformance_page_runs_it_in_ci_around_the_shipped_workflow() -> None:
    """The "Run it in your CI" section names every job of the shipped workflow: each engine and each service image
    (the page promises what the workflow does)."""
    yaml = pytest.importorskip("yaml")
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "conformance.yml").read_text(encoding="utf-8"))
    page = (ROOT / "docs" / "conformance.md").read_text(encoding="utf-8")
    section = page[page.index("## Run it in your CI"):]
    assert ".github/workflows/conformance.yml" in section
    for entry in workflow["jobs"]["matrix"]["strategy"]["matrix"]["include"]:
        assert f"`{entry['engine']}`" in section, entry["engine"]
        image = entry["image"]
        assert not image or image in section or f"`:{image.rpartition(':')[2]}`" in section, image
    assert "--require" in section and "IDEM_URL_" in section


def test_missing_tables_answer_503_and_are_logged_once_with_the_fix(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """An app whose store's tables were never created: every idempotent request answers 503, and the log says once,
    at WARNING, which tables are missing and how to create them (not once per request)."""
    import logging

    from idem_dialects import IdempotencyStore
    from idem_dialects.http import IdempotencyPolicy
    from idem_dialects.http.wsgi import IdempotencyMiddleware

    def app(environ: dict[str, object], start_response: Any) -> list[bytes]:
        start_response("201 Created", [("Content-Type", "application/json")])
        return [b"{}"]

    prefix = f"idem_nt{uuid.uuid4().hex[:6]}_"  # a message of its own: one logged by another test is not this one
    with IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'empty.db'}", table_prefix=prefix) as store:
        wrapped = IdempotencyMiddleware(app, store, IdempotencyPolicy(scope=lambda r: "account:1"))
        caplog.set_level(logging.WARNING, logger="idem_dialects")
        statuses = []
        for key in ("k1", "k2", "k1"):
            environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/payments", "QUERY_STRING": "", "wsgi.input":
                       io.BytesIO(b"{}"), "CONTENT_LENGTH": "2", "CONTENT_TYPE": "application/json",
                       "HTTP_IDEMPOTENCY_KEY": f'"{key}"', "SERVER_NAME": "t", "SERVER_PORT": "80",
                       "wsgi.url_scheme": "http"}
            b"".join(wrapped(environ, lambda status, headers, exc_info=None: statuses.append(status)))
    assert [s.split()[0] for s in statuses] == ["503", "503", "503"]
    told = [r for r in caplog.records if r.levelno == logging.WARNING and prefix in r.getMessage()]
    assert len(told) == 1, [r.getMessage() for r in caplog.records]
    assert "idem-dialects init URL" in told[0].getMessage() and "create_tables()" in told[0].getMessage()
