"""Every configuration mistake in docs/errors.md, made for real: each row's command runs in a subprocess against the
machine's PostgreSQL 15, MariaDB and SQLite, and prints exactly the row's lines with the row's exit status (the table
is parsed from the page, so the two cannot drift). Then: the same mistake gives the same lines from every command,
and a wrong password under PostgreSQL's password authentication is a configuration error, raised without a retry."""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
from cli_common import CLI, run, run_each
from sqlalchemy import create_engine, make_url, text
from sqlalchemy.exc import ArgumentError

from idem_dialects import ConnectionConfigError, IdempotencyStore, RetryPolicy, dialects
from idem_dialects.cli import main

PAGE = Path(__file__).resolve().parents[1] / "docs" / "errors.md"
PG, MARIADB = "postgresql+psycopg://postgres@127.0.0.1:5432/test", "mariadb+pymysql://root@127.0.0.1:3306/test"

# Runs the CLI as in an environment without pytest: importing it fails as a missing module's import does.
NO_PYTEST = """
import runpy, sys
class NoPytest:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("pytest", "_pytest"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NoPytest())
sys.argv = ["idem-dialects", *sys.argv[1:]]
runpy.run_module("idem_dialects.cli", run_name="__main__")
"""



@dataclass(frozen=True)
class Row:
    mistake: str
    command: list[str]
    lines: list[str]
    status: int


def _cell_lines(cell: str) -> list[str]:
    lines = []
    for part in cell.split("<br>"):
        match = re.fullmatch(r"``(.*)``", part.strip())
        assert match, f"{PAGE.name}: a printed line is not a ``code span``: {part!r}"
        inner = match.group(1)
        # CommonMark: one space is stripped from each side of a code span padded on both sides
        lines.append(inner[1:-1] if inner.startswith(" ") and inner.endswith(" ") and inner.strip() else inner)
    return lines


def table() -> list[Row]:
    rows = []
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if not line.startswith("| ") or len(cells) != 4 or cells[0] == "Mistake" or not cells[3].isdigit():
            continue
        command = shlex.split(cells[1].strip("`"))
        assert command[0] == "idem-dialects", line
        rows.append(Row(cells[0], command[1:], _cell_lines(cells[2]), int(cells[3])))
    return rows


ROWS = table()


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def needs(port: int, what: str) -> None:
    if not listening(port):
        pytest.skip(f"{what} does not answer on 127.0.0.1:{port} here")


@contextmanager
def alone(role: str) -> Iterator[None]:
    """Held while a test creates, uses and drops the machine-wide `role`: other pytest workers' tests of the same role
    wait (the table's rows and the tests after it use one role name)."""
    with open(Path(tempfile.gettempdir()) / f"idem-test-{role}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@contextmanager
def pg_role_without_create() -> Iterator[None]:
    """A real login role of the machine's PostgreSQL 15 that may not create in any schema of its search path: PostgreSQL
    15 grants PUBLIC no CREATE on schema public, and the role gets nothing else. Dropped afterwards."""
    needs(5432, "PostgreSQL")
    admin = create_engine(PG, isolation_level="AUTOCOMMIT")
    with alone("idem_no_create"):
        try:
            with admin.connect() as conn:
                conn.execute(text("DROP ROLE IF EXISTS idem_no_create"))
                conn.execute(text("CREATE ROLE idem_no_create LOGIN"))
                if conn.execute(text("SELECT has_schema_privilege('idem_no_create', 'public', 'CREATE')")).scalar():
                    pytest.skip("PUBLIC may create in schema public on this server (granted before PostgreSQL 15)")
            yield
        finally:
            with admin.connect() as conn:
                conn.execute(text("DROP ROLE IF EXISTS idem_no_create"))
            admin.dispose()


@contextmanager
def mariadb_select_only() -> Iterator[None]:
    """A real MariaDB user with SELECT on the test database only. Dropped afterwards."""
    needs(3306, "MariaDB")
    admin = create_engine(MARIADB)
    with alone("idem_select_only"):
        try:
            with admin.begin() as conn:
                conn.execute(text("DROP USER IF EXISTS 'idem_select_only'@'%'"))
                conn.execute(text("CREATE USER 'idem_select_only'@'%' IDENTIFIED BY 'Sel3ct-0nly'"))
                conn.execute(text("GRANT SELECT ON test.* TO 'idem_select_only'@'%'"))
            yield
        finally:
            with admin.begin() as conn:
                conn.execute(text("DROP USER IF EXISTS 'idem_select_only'@'%'"))
            admin.dispose()


def hiding(soname: str) -> list[str]:
    """A command prefix that runs its command where the dynamic loader cannot load `soname`, as on a machine without
    it: a private mount namespace in which /dev/null covers the library's file (the machine's is untouched)."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here to hide a system library from one process")
    found = [Path(d) / soname for d in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")
             if (Path(d) / soname).exists()]
    if not found:
        return []  # really missing here: nothing to hide
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a private mount namespace here to hide {soname}: {probe.stderr.decode().strip()}")
    return ["unshare", "-m", "sh", "-c", 'mount --bind /dev/null "$0" && exec "$@"', str(found[0].resolve())]


def setup(row: Row, tmp: Path) -> tuple[list[str], AbstractContextManager[Any]]:
    """The command line that makes the row's mistake here, and what must exist while it runs."""
    cli = CLI
    url = next((arg for arg in row.command if "://" in arg), "")
    given = parsed(url)
    if given is not None and given.host == "127.0.0.1" and given.port in (5432, 3306):
        needs(given.port, given.get_backend_name())
    mistake = row.mistake
    if mistake.startswith("no pytest"):
        script = tmp / "no_pytest.py"
        script.write_text(NO_PYTEST, encoding="utf-8")
        return [sys.executable, str(script)], nullcontext()
    if mistake.startswith("missing system library"):
        target = make_url(url)
        known = dialects.driver(dialects.load(target.get_backend_name()), target.get_driver_name())
        assert known is not None and known.libraries, url
        if not known.installed():
            pytest.skip(f"{known.module} is not installed here")
        return [*hiding(known.libraries[0].soname), *cli], nullcontext()
    if mistake == "missing driver package" and find_spec("MySQLdb") is not None:
        pytest.skip("mysqlclient is installed here: the driver loads")
    if mistake == "role without CREATE (PostgreSQL)":
        return cli, pg_role_without_create()
    if mistake.startswith("role without CREATE (MariaDB"):
        return cli, mariadb_select_only()
    return cli, nullcontext()


def parsed(arg: str) -> Any:
    """`arg` as a URL, or None (not one, or one the row means to be malformed)."""
    try:
        return make_url(arg) if "://" in arg else None
    except (ValueError, ArgumentError):
        return None


def passwords(args: list[str]) -> list[str]:
    found = [u.password for u in map(parsed, args) if u is not None and u.password]
    # a URL SQLAlchemy cannot parse (the non-numeric port) still holds its password between ':' and '@'
    found += [m.group(1) for a in args if parsed(a) is None for m in [re.search(r"://[^:/@]+:([^@]+)@", a)] if m]
    return found


def test_the_table_has_every_mistake_of_the_issue() -> None:
    wanted = ["wrong password", "unknown user", "unknown database", "unknown host", "refused port",
              "refused port (PostgreSQL)", "password with an unencoded `@`",
              "missing SQLite directory", "missing driver package", "missing system library", "role without CREATE",
              "no pytest", "non-numeric port", "driver-level autocommit", "no password", "bad option value",
              "unknown option", "port out of range", "several hosts", "missing SQLite file", "a URL without its NAME="]
    assert all(any(r.mistake.startswith(w) for r in ROWS) for w in wanted), [r.mistake for r in ROWS]


def against_password_server(row: Row, request: pytest.FixtureRequest) -> list[str]:
    """The row's command; a "no password" row's URL pointed at the PostgreSQL of this module that asks for
    passwords (the machine's trusts local logins), its port the only change."""
    if not row.mistake.startswith("no password"):
        return row.command
    server = make_url(request.getfixturevalue("scram_server").format(driver="psycopg", role="idem_pw"))
    return [arg.replace("127.0.0.1:5432", f"127.0.0.1:{server.port}") if "://" in arg else arg
            for arg in row.command]


# --- each mistake as the table prints it; a connection mistake, the same from every command --------------------------


def _commands(url: str) -> dict[str, list[str]]:
    return {"init": ["init", url], "check": ["check", url, "--quiet"], "purge": ["purge", url, "--older-than", "1d"],
            "matrix": ["matrix", "--url", f"target={url}", "--quiet"],
            "bench": ["bench", url, "--requests", "5", "--repetitions", "1", "--quiet"]}


SAME_EVERYWHERE = [r.mistake for r in ROWS if r.mistake in (
    "wrong password", "unknown user", "unknown database", "unknown host", "refused port", "refused port (PostgreSQL)",
    "password with an unencoded `@`", "missing SQLite directory",
    "missing driver package", "missing system library (pyodbc without unixODBC)",
    "missing system library (mssql-python without libltdl)", "non-numeric port", "driver-level autocommit",
    "no password (PostgreSQL asking for one)", "bad option value (PostgreSQL)", "bad option value (MariaDB)",
    "unknown option (MariaDB)", "port out of range", "several hosts in the host part")]


@pytest.mark.parametrize("row", ROWS, ids=[r.mistake for r in ROWS])
def test_each_mistake_prints_its_table_row(row: Row, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The row's command prints the row's lines with the row's exit status. A connection mistake: so do init, check,
    purge, matrix --url and bench (the lines after the command's name)."""
    command = against_password_server(row, request)
    prefix, context = setup(Row(row.mistake, command, row.lines, row.status), tmp_path)
    url = next((arg for arg in command if "://" in arg), "")
    every = _commands(url) if row.mistake in SAME_EVERYWHERE else {}
    commands = [command, *every.values()]
    with context:
        runs = run_each(commands, tmp_path, prefix[:-len(CLI)]) if every else [run(prefix, command, tmp_path)]
    done, *others = runs
    printed = done.stderr.rstrip("\n").splitlines()
    assert "Traceback" not in done.stderr, done.stderr
    assert printed == row.lines, f"{row.mistake}: printed\n{done.stderr}"
    assert done.returncode == row.status, f"{row.mistake}: exit {done.returncode}\n{done.stderr}"
    for secret in passwords(row.command):
        assert secret not in done.stdout + done.stderr
    expected = [line.split(": ", 1)[1] if i == 0 else line for i, line in enumerate(row.lines)]
    for name, done in zip(every, others, strict=True):
        printed = done.stderr.rstrip("\n").splitlines()
        assert printed[:1] and printed[0].startswith(f"idem-dialects {name}: "), (name, done.stderr)
        assert [printed[0].split(": ", 1)[1], *printed[1:]] == expected, (name, done.stderr)
        assert done.returncode == row.status, (name, done.returncode, done.stderr)
        for secret in passwords([url]):
            assert secret not in done.stdout + done.stderr, name


@pytest.mark.parametrize("command", [["matrix", "--url", "target={url}"], ["init", "{url}", "--table-prefix", "{own}"]])
def test_role_without_create_stops_every_command_that_creates(command: list[str], tmp_path: Path) -> None:
    row = next(r for r in ROWS if r.mistake == "role without CREATE (PostgreSQL)")
    prefix, context = setup(row, tmp_path)
    url = next(arg for arg in row.command if "://" in arg)
    # A prefix of its own: tables another run left under the default idem_ in the shared database would let
    # `init` succeed without creating anything.
    own = f"idem_nc{uuid.uuid4().hex[:6]}_"
    with context:
        done = run(prefix, [part.format(url=url, own=own) for part in command], tmp_path)
    assert done.returncode == row.status and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.split(": ", 1)[1].strip() == row.lines[0].split(": ", 1)[1], done.stderr


# --- PostgreSQL with password authentication -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def scram_server() -> Iterator[str]:
    """A PostgreSQL server of our own (the machine's trusts local logins) that asks for SCRAM-SHA-256 passwords: the
    superuser keeps trust for the set-up, the role idem_pw logs in with a password. Its URL without password."""
    engines: Any = pytest.importorskip("idem_dialects.engines")
    from idem_dialects.engines.local import chown_tree, free_ports, unprivileged_user
    from idem_dialects.engines.pgserver import PgServer, bindir, query

    try:
        binaries = bindir()
        user = unprivileged_user("postgres")
    except engines.Unavailable as exc:
        pytest.skip(str(exc))
    root = Path(tempfile.mkdtemp(prefix="idem-scram-"))
    server = PgServer(free_ports(1)[0], binaries, user, datadir=root / "data")
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, root, True)
        stack.callback(server.stop)
        server.start("password_encryption=scram-sha-256")
        hba = root / "data" / "pg_hba.conf"
        # One role per password method the server may ask for: SCRAM-SHA-256, MD5 (an MD5-stored password) and
        # cleartext ("password").
        hba.write_text("local all all trust\nhost all postgres 127.0.0.1/32 trust\n"
                       "host all idem_md5 127.0.0.1/32 md5\nhost all idem_clear 127.0.0.1/32 password\n"
                       "host all all 127.0.0.1/32 scram-sha-256\n", encoding="utf-8")
        chown_tree(root, user)
        query(server.port, "CREATE ROLE idem_pw LOGIN PASSWORD 'Right-Pw-5150'")
        query(server.port, "GRANT CREATE ON SCHEMA public TO idem_pw")  # `init` with the right password creates
        query(server.port, "CREATE ROLE idem_clear LOGIN PASSWORD 'Right-Pw-5150'")
        query(server.port, "SET password_encryption = 'md5'; CREATE ROLE idem_md5 LOGIN PASSWORD 'Right-Pw-5150'")
        query(server.port, "SELECT pg_reload_conf()")
        yield f"postgresql+{{driver}}://{{role}}@127.0.0.1:{server.port}/postgres"


@pytest.mark.parametrize("role", ["idem_pw", "idem_md5", "idem_clear"], ids=["scram", "md5", "cleartext"])
@pytest.mark.parametrize("driver", ["psycopg", "psycopg2", "pg8000"])
def test_wrong_password_under_password_auth_is_configuration_and_not_retried(scram_server: str, driver: str,
                                                                             role: str, tmp_path: Path) -> None:
    pytest.importorskip(driver)
    base = make_url(scram_server.format(driver=driver, role=role))
    wrong = base.set(password="Wr0ng-Pw-7731")
    # The right password connects: the server really asks for it.
    with IdempotencyStore.from_url(base.set(password="Right-Pw-5150")) as store, store.transaction():
        pass
    # A generous budget: a retried error would surface as RetriesExhausted, not as ConnectionConfigError.
    with IdempotencyStore.from_url(wrong, retry=RetryPolicy(total=30)) as store:
        with pytest.raises(ConnectionConfigError) as err:
            store.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: "never")
    assert f"authentication failed for user '{role}' (SQLSTATE 28P01)" in str(err.value)
    assert "Wr0ng-Pw-7731" not in str(err.value)
    # An unknown database behind password authentication is told apart from a wrong password.
    with IdempotencyStore.from_url(base.set(password="Right-Pw-5150", database="idem_no_such_db")) as store:
        with pytest.raises(ConnectionConfigError, match="'idem_no_such_db' does not exist"):
            store.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: "never")
    done = run(CLI,
               ["init", wrong.render_as_string(hide_password=False)], tmp_path)
    assert done.returncode == 2 and done.stderr.splitlines() == [
        f"idem-dialects init: cannot connect to the postgresql database: authentication failed for user '{role}'"
        " (SQLSTATE 28P01)",
        "  fix: check the user and password in the URL (and the server's pg_hba.conf); a URL holds a password"
        " percent-encoded (@ as %40, : as %3A, / as %2F, # as %23, % as %25, ? as %3F)"], done.stderr
    assert "Wr0ng-Pw-7731" not in done.stdout + done.stderr


# --- system-library hints -------------------------------------------------------------------------------------------


def test_a_hint_for_an_installed_driver_missing_a_library_names_only_the_library_and_the_pip_only_driver() -> None:
    """The hint asks the dynamic loader itself (a library name no system has really fails to load): an installed
    driver needs only the library (its Debian package, what it is on any OS), plus a driver of the same kind that
    pip alone installs where the backend has one; a driver that is not installed needs its package as well."""
    from idem_dialects.dialects.mssql import MSSQLBackend
    from idem_dialects.drivers import Driver, SystemLibrary

    absent = SystemLibrary("libidem-absent.so.9", "libidem-absent9", "the absent library, libidem on other OSes")
    assert absent.missing()
    installed = Driver("pyodbc", "pyodbc", "idem-dialects[mssql]", libraries=(absent,))
    assert installed.installed() or pytest.skip("pyodbc is not installed here")
    assert installed.install_hint() == ("install the system library libidem-absent.so.9 (the absent library, libidem"
                                        " on other OSes; Debian/Ubuntu: apt-get install libidem-absent9)")
    not_installed = Driver("nodrv", "idem_no_such_module", "idem-no-such-package", libraries=(absent,))
    assert not_installed.install_hint().startswith("pip install 'idem-no-such-package', and the system library")

    class Patched(MSSQLBackend):
        drivers = (installed, *(d for d in MSSQLBackend.drivers if d.name != "pyodbc"))

    dialects.register("patchedmssql", Patched)
    try:
        assert dialects.install_hint("patchedmssql", "pyodbc") == (
            installed.install_hint() + "; or, with pip only: pip install 'pymssql' and use mssql+pymssql:// URLs")
        assert dialects.install_hint("patchedmssql", "pymssql") == "pip install 'pymssql'"
    finally:
        dialects._registry.pop("patchedmssql", None)


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
def test_wrong_password_under_scram_on_the_async_store(scram_server: str, driver: str) -> None:
    """The async store asks the same backend: psycopg's async connection (libpq, no SQLSTATE: the probe answers the
    SCRAM exchange) and asyncpg (its own SQLSTATE) both raise ConnectionConfigError, not retried."""
    pytest.importorskip(driver)
    pytest.importorskip("greenlet")
    import asyncio

    from idem_dialects import AsyncIdempotencyStore

    url = make_url(scram_server.format(driver=driver, role="idem_pw")).set(password="Wr0ng-Pw-7731")

    async def effect(conn: Any) -> str:
        return "never"

    async def attempt() -> BaseException:
        try:
            async with AsyncIdempotencyStore.from_url(url, retry=RetryPolicy(total=30)) as store:
                await store.run(scope="s", operation="op", key="k", request={}, effect=effect)
        except Exception as exc:
            return exc
        raise AssertionError("run did not fail")

    err = asyncio.run(attempt())
    assert isinstance(err, ConnectionConfigError), repr(err)
    assert "authentication failed for user 'idem_pw' (SQLSTATE 28P01)" in str(err)
    assert "Wr0ng-Pw-7731" not in str(err)


def test_the_suite_stops_at_its_first_privilege_failure(tmp_path: Path) -> None:
    """An engine whose URL comes from the environment is probed, not created on, before the suite: the first check
    the role cannot run stops the run, and `matrix` prints that one line with exit 78 (not a failure per check)."""
    row = next(r for r in ROWS if r.mistake == "role without CREATE (PostgreSQL)")
    prefix, context = setup(row, tmp_path)
    url = next(arg for arg in row.command if "://" in arg)
    with context:
        env = dict(os.environ, IDEM_URL_POSTGRESQL=url)
        env.pop("PYTEST_ADDOPTS", None)
        done = subprocess.run([*prefix, "matrix", "--engine", "postgresql", "--quiet"], capture_output=True,
                              text=True, timeout=600, cwd=tmp_path, env=env)
    assert done.returncode == row.status, done.stderr[-3000:]
    assert done.stderr.splitlines() == ["idem-dialects matrix: " + row.lines[0].split(": ", 1)[1]], done.stderr[-3000:]


# --- no password where the server wants one ---------------------------------------------------------------------------


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2", "pg8000"])
def test_no_password_for_a_server_that_wants_one_is_configuration_and_not_retried(scram_server: str,
                                                                                  driver: str) -> None:
    """README's URL shape (no password) against a server asking for SCRAM passwords: ConnectionConfigError naming
    the missing password at once, with a 30 s retry budget that a retried error would have spent (RetriesExhausted)."""
    pytest.importorskip(driver)
    url = make_url(scram_server.format(driver=driver, role="idem_pw"))
    with IdempotencyStore.from_url(url, retry=RetryPolicy(total=30)) as store:
        with pytest.raises(ConnectionConfigError) as err:
            store.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: "never")
    assert "asks for a password for user 'idem_pw' and none was given" in str(err.value)
    assert store.retries == {}  # nothing retried


@pytest.mark.parametrize("command", ["check", "init", "stats"])
def test_no_password_exits_2_at_once_naming_it(scram_server: str, command: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`check`, `init` and `stats` with a password-less URL: two lines naming the missing password, exit 2, with no
    connection retried (each retry is logged: none is); and with the right password the command's own output shows
    the URL with *** for it."""
    url = scram_server.format(driver="psycopg", role="idem_pw")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    with caplog.at_level(logging.INFO, logger="idem_dialects"):
        status = main([command, url])
    stderr = capsys.readouterr().err
    assert status == 2, stderr
    assert stderr.splitlines() == [
        f"idem-dialects {command}: cannot connect to the postgresql database: the server asks for a password for"
        " user 'idem_pw' and none was given",
        "  fix: put the password in the URL (postgresql+psycopg://USER:PASSWORD@HOST/DB), in PGPASSWORD or in"
        " ~/.pgpass"], stderr
    retried = [r.getMessage() for r in caplog.records if r.getMessage().startswith("retrying")]
    assert retried == [], f"{command} retried the connection: {retried}"
    right = make_url(url).set(password="Right-Pw-5150").render_as_string(hide_password=False)
    done = run(CLI, ["init", right], tmp_path)
    assert done.returncode == 0 and "Right-Pw-5150" not in done.stdout + done.stderr and "***" in done.stdout, done


# --- no command prints a URL's password -------------------------------------------------------------------------------


SECRET = "Wr0ng-Pw-7731"


@pytest.mark.parametrize("args", [
    ["init", f"mariadb+pymysql://root:{SECRET}@127.0.0.1:3306/test"],
    ["check", f"mariadb+pymysql://root:{SECRET}@127.0.0.1:3306/test", "--quiet"],
    ["stats", f"mariadb+pymysql://root:{SECRET}@127.0.0.1:3306/test"],
    ["purge", f"mariadb+pymysql://root:{SECRET}@127.0.0.1:3306/test", "--older-than", "1d", "-v"],
    ["demo", "--url", f"mariadb+pymysql://root:{SECRET}@127.0.0.1:3306/test"],
    ["matrix", "--url", f"mariadb+pymysql://root:{SECRET}@127.0.0.1:3306/test"],
    ["matrix", "--url", f"t=mariadb+pymysql://root:{SECRET}@127.0.0.1:3306/test", "--quiet"],
    ["bench", f"mariadb+pymysql://root:{SECRET}@127.0.0.1:3306/test", "--requests", "5", "--repetitions", "1"],
    ["ddl", f"mariadb+pymysql://root:{SECRET}@127.0.0.1:3306/test"],
    [f"mariadb+pymysql://root:{SECRET}@127.0.0.1:3306/test"],  # no command: argparse's invalid choice
    ["init", "sqlite:///ok.db", f"mysql://root:{SECRET}@h/db"],  # an extra argument: argparse's unrecognized
    ["init", f"postgresql+psycopg://postgres:{SECRET}@127.0.0.1:70000/test"],
    ["init", f"postgresql+psycopg://postgres:{SECRET}@h1:5432,h2:5432/test"],
    ["init", f"postgresql+psycopg://postgres:{SECRET}@127.0.0.1:5432/test?connect_timeout=abc"],
], ids=lambda args: " ".join(a.split("://")[0] if "://" in a else a for a in args))
def test_no_command_prints_a_urls_password(args: list[str], tmp_path: Path) -> None:
    done = run(CLI, args, tmp_path)
    assert "Traceback" not in done.stderr, done.stderr
    assert SECRET not in done.stdout + done.stderr, done.stdout + done.stderr
