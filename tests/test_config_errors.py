"""Configuration mistakes end in a ConfigurationError that says how to fix them: unknown backends (with a
did-you-mean), missing drivers (with the pip command), URLs that are not URLs, missing tables and missing
privileges (recognised by driver error code on every live engine)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from importlib import import_module
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from idem_dialects import ConfigurationError, IdempotencyStore, UnsupportedEngine
from idem_dialects.cli.commands import EXIT_CONFIG
from idem_dialects.errors import InsufficientPrivilege, InvalidURL, MissingDriver, MissingTables

engines: Any = import_module("idem_dialects.engines")


@pytest.mark.parametrize(("url", "hint"), [
    ("postgres://app@db/app", "did you mean postgresql://?"),
    ("postgresq://app@db/app", "did you mean postgresql://?"),
    ("sqlserver://sa@db/app", "did you mean mssql://?"),
])
def test_unknown_backend_lists_known_ones_and_guesses(url: str, hint: str) -> None:
    with pytest.raises(UnsupportedEngine) as err:
        IdempotencyStore.from_url(url)
    assert hint in str(err.value) and "known backends: mariadb, mssql, mysql, oracle, postgresql, sqlite" in str(
        err.value)


def test_not_a_url_never_repeats_it() -> None:
    with pytest.raises(ConfigurationError, match="not a database URL") as err:
        IdempotencyStore.from_url("app:hunter2@db")
    assert "hunter2" not in str(err.value)


@pytest.mark.parametrize("url", ["postgresql+psycopg://app:hunter2@db:54x2/app", "mysql+pymysql://app:hunter2@db:/app",
                                 "sqlite://:hunter2@:port/x.db"])
def test_a_port_that_is_not_a_number_is_a_url_error(url: str) -> None:
    """SQLAlchemy's own ValueError for the port becomes InvalidURL (a ConfigurationError), from every entry point,
    never repeating the text (it holds a password)."""
    from idem_dialects.url import offline, parse, target

    for build in (parse, target, offline, IdempotencyStore.from_url):
        with pytest.raises(InvalidURL) as err:
            build(url)
        assert "hunter2" not in str(err.value) and err.value.__cause__ is None and err.value.__suppress_context__


def test_unknown_driver() -> None:
    with pytest.raises(ConfigurationError, match="no driver 'nosuch' for postgresql://"):
        IdempotencyStore.from_url("postgresql+nosuch://app@db/app")


@pytest.mark.parametrize(("url", "module", "fix"), [
    ("postgresql+psycopg://app@db/app", "psycopg", "pip install 'idem-dialects[postgresql]'"),
    ("postgresql://app@db/app", "psycopg", "pip install 'idem-dialects[postgresql]'"),
    ("mysql+pymysql://app@db/app", "pymysql", "pip install 'idem-dialects[mysql]'"),
    ("postgresql+pg8000://app@db/app", "pg8000", "pip install 'pg8000'"),
])
def test_missing_driver_says_what_to_install(tmp_path: Path, url: str, module: str, fix: str) -> None:
    """In a subprocess where the driver's import fails as if it were not installed."""
    shim = tmp_path / "shim"
    (shim / module).mkdir(parents=True)
    (shim / module / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{module}'\")\n")
    if module == "psycopg":  # a bare postgresql:// falls back to psycopg2 when psycopg is absent: hide both
        (shim / "psycopg2").mkdir()
        (shim / "psycopg2" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'psycopg2'\")\n")
    code = textwrap.dedent(f"""
        from idem_dialects import IdempotencyStore
        from idem_dialects.errors import MissingDriver
        try:
            IdempotencyStore.from_url({url!r})
        except MissingDriver as exc:
            print(exc)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert fix in done.stdout, done.stdout + done.stderr
    assert issubclass(MissingDriver, ConfigurationError)


def test_missing_tables_say_how_to_create_them(live_engine: Any) -> None:
    prefix = f"nt_{uuid.uuid4().hex[:6]}_"
    with IdempotencyStore.from_url(live_engine.url, table_prefix=prefix) as store:
        with pytest.raises(MissingTables) as err:
            store.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: 1)
        assert f"{prefix}records" in str(err.value)
        assert "create_tables()" in str(err.value) and "idem-dialects init URL" in str(err.value)
        with pytest.raises(MissingTables), store.transaction() as conn:
            store.accept_message(conn, subscriber="s", message_id="m")


def test_a_missing_table_of_the_effect_is_not_ours(tmp_path: Path) -> None:
    with IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'e.db'}") as store:
        store.create_tables()
        with pytest.raises(Exception) as err:
            store.run(scope="s", operation="op", key="k", request={},
                      effect=lambda conn: conn.execute(text("UPDATE accounts SET balance = 0")))
        assert not isinstance(err.value, ConfigurationError) and "no such table: accounts" in str(err.value)


def test_read_only_sqlite_is_a_privilege_problem(tmp_path: Path) -> None:
    path = tmp_path / "ro.db"
    create_engine(f"sqlite:///{path}").connect().close()  # an empty database file
    with IdempotencyStore.from_url(f"sqlite:///file:{path}?mode=ro&uri=true") as store:
        with pytest.raises(InsufficientPrivilege, match="idem-dialects ddl URL"):
            store.create_tables()


def test_role_without_create_is_told_to_ask_or_apply_the_ddl() -> None:
    """On the embedded PostgreSQL 18 (a server of our own: the role is created and dropped there)."""
    spec = engines.get("postgresql-18")
    try:
        server = spec.provide()
    except engines.Unavailable as exc:
        pytest.skip(f"{spec.name}: {exc}")
    role = f"idem_noddl_{uuid.uuid4().hex[:6]}"
    admin = create_engine(server.url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f"CREATE ROLE {role} LOGIN"))
            conn.execute(text(f"REVOKE CREATE ON SCHEMA public FROM PUBLIC, {role}"))
        with IdempotencyStore.from_url(server.url.set(username=role, password=None)) as store:
            with pytest.raises(InsufficientPrivilege) as err:
                store.create_tables()
            assert "ask for the CREATE privilege" in str(err.value) and "idem-dialects ddl URL" in str(err.value)
        # `check` as that role stops at the first privilege failure, before any check runs: one line, exit 78.
        done = subprocess.run([sys.executable, "-m", "idem_dialects.cli", "check", "--quiet", "-k", "keys",
                               server.url.set(username=role, password=None).render_as_string(hide_password=False)],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == EXIT_CONFIG, done.stderr[-3000:]
        assert done.stderr.splitlines() == ["idem-dialects check: this database role may not create tables: ask for"
                                            " the CREATE privilege, or have a DBA apply the statements `idem-dialects"
                                            " ddl URL` prints"], done.stderr
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP ROLE IF EXISTS {role}"))
        admin.dispose()
        server.stop()
