"""Alembic: a real `alembic revision --autogenerate` + `alembic upgrade head` of a service whose metadata includes the
store's tables (`idem_dialects.migrations.include_tables`), on SQLite and PostgreSQL. The migrated tables carry the
engine's exact key types, a second autogenerate finds nothing to change, and the store works on them."""

from __future__ import annotations

import textwrap
import uuid
from collections.abc import Iterator
from importlib import import_module
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, inspect, text

from idem_dialects import IdempotencyStore

alembic_command: Any = pytest.importorskip("alembic.command", reason="pip install 'idem-dialects[alembic]'")
alembic_config: Any = import_module("alembic.config")
engines: Any = import_module("idem_dialects.engines")

ENV = '''
import runpy
from alembic import context
from sqlalchemy import create_engine
metadata = runpy.run_path({models!r})["metadata"]  # the service's models, loaded fresh each run

url = context.config.get_main_option("sqlalchemy.url")
engine = create_engine(url)
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=metadata, version_table={version!r},
                      include_name=lambda name, type_, parent: type_ != "table" or name.startswith({prefix!r}))
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
'''

MODELS = '''
from sqlalchemy import Column, Integer, MetaData, Table
from idem_dialects.migrations import include_tables

metadata = MetaData()
Table({prefix!r} + "accounts", metadata, Column("id", Integer, primary_key=True), Column("balance", Integer))
include_tables(metadata, {url!r}, table_prefix={prefix!r})
'''


@pytest.fixture(params=["sqlite", "postgresql-18"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'svc.db'}"
        return
    spec = engines.get(request.param)
    try:
        server = spec.provide()
    except engines.Unavailable as exc:
        pytest.skip(f"{spec.name}: {exc}")
    yield server.url.render_as_string(hide_password=False)
    server.stop()


def test_autogenerate_and_upgrade_create_the_stores_tables(tmp_path: Path, url: str) -> None:
    prefix = f"mig_{uuid.uuid4().hex[:6]}_"
    here = tmp_path / "svc"
    (here / "versions").mkdir(parents=True)
    (here / "models.py").write_text(MODELS.format(prefix=prefix, url=url))
    (here / "env.py").write_text(ENV.format(models=str(here / "models.py"), version=f"{prefix}version", prefix=prefix))
    (here / "script.py.mako").write_text(textwrap.dedent('''\
        """${message}"""
        from alembic import op
        import sqlalchemy as sa
        ${imports if imports else ""}
        revision = ${repr(up_revision)}
        down_revision = ${repr(down_revision)}
        branch_labels = None
        depends_on = None

        def upgrade():
            ${upgrades if upgrades else "pass"}

        def downgrade():
            ${downgrades if downgrades else "pass"}
        '''))
    cfg = alembic_config.Config()
    cfg.set_main_option("script_location", str(here))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    engine = create_engine(url)
    try:
        alembic_command.revision(cfg, message="idempotency tables", autogenerate=True)
        [migration] = list((here / "versions").glob("*.py"))
        source = migration.read_text()
        assert "idem_dialects" not in source  # plain SQLAlchemy types: the migration stands alone
        assert f"op.create_table('{prefix}records'" in source and f"op.create_table('{prefix}messages'" in source
        if url.startswith("postgresql"):
            assert "sa.String(length=255, collation='C')" in source
        alembic_command.upgrade(cfg, "head")

        tables = set(inspect(engine).get_table_names())
        assert {f"{prefix}records", f"{prefix}messages", f"{prefix}accounts"} <= tables
        if url.startswith("postgresql"):
            with engine.connect() as conn:
                collations = conn.execute(text(
                    "SELECT column_name, collation_name FROM information_schema.columns WHERE table_name = :t"
                    " AND column_name IN ('scope', 'operation', 'idem_key')"), {"t": f"{prefix}records"}).all()
            assert sorted(c for _, c in collations) == ["C", "C", "C"]

        # Nothing left to migrate: the database matches what include_tables declares.
        alembic_command.revision(cfg, message="nothing", autogenerate=True)
        second = next(p for p in (here / "versions").glob("*.py") if p != migration).read_text()
        assert "op.create_table" not in second and "op.add_column" not in second and "op.alter_column" not in second

        with IdempotencyStore.from_url(url, table_prefix=prefix) as store:  # no create_tables(): migrated
            first = store.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: {"ok": 1})
            again = store.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: "never")
            assert again.replayed and again.response == first.response == {"ok": 1}
    finally:
        alembic_command.downgrade(cfg, "base")
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {prefix}version"))
        engine.dispose()


@pytest.mark.parametrize(("backend", "expected"), [
    ("mysql", ["sa.VARBINARY(length=1020)", "mysql_engine='InnoDB'", "mysql_charset='utf8mb4'"]),
    ("mariadb", ["sa.VARBINARY(length=1020)", "mariadb_row_format='DYNAMIC'"]),
    ("mssql", ["mssql.VARBINARY(length=1020)",
               "sa.PrimaryKeyConstraint('scope', 'operation', 'idem_key', name='idem_records_pk',"
               " mssql_clustered=False)"]),
    ("oracle", ["oracle.RAW(length=1020)"]),
])
def test_rendered_migration_keeps_each_engines_key_types(backend: str, expected: list[str]) -> None:
    """Offline (no server here for these): what autogenerate would write for the record table."""
    from alembic.autogenerate import render_python_code
    from alembic.operations import ops
    from sqlalchemy import MetaData

    from idem_dialects.migrations import include_tables, render_item

    tables = include_tables(MetaData(), backend)
    code = render_python_code(ops.UpgradeOps(ops=[ops.CreateTableOp.from_table(tables.records)]),
                              render_item=render_item)
    for text_ in expected:
        assert text_ in code, code
    assert "idem_dialects" not in code
