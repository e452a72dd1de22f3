"""Alembic: put the store's tables into a service's own migrations, with each engine's exact key types.

In the service's ``env.py`` (or wherever its MetaData lives)::

    from idem_dialects.migrations import include_tables, render_item
    include_tables(target_metadata, config.get_main_option("sqlalchemy.url"))   # the engine the migrations target
    context.configure(..., target_metadata=target_metadata, render_item=render_item)  # (for SQL Server)

``alembic revision --autogenerate`` then writes the same tables `store.create_tables()` would create on that engine --
``VARCHAR(255) COLLATE "C"`` on PostgreSQL, ``VARBINARY(1020)`` on MySQL/MariaDB/SQL Server (nonclustered primary key),
``RAW(1020)`` on Oracle -- as plain SQLAlchemy types, so the migration file does not import idem_dialects.
"""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy import MetaData, PrimaryKeyConstraint
from sqlalchemy.engine import URL
from sqlalchemy.types import TypeDecorator

from .schema import Tables, build_tables, check_prefix
from .url import offline


def include_tables(metadata: MetaData, url: str | URL, table_prefix: str = "idem_") -> Tables:
    """Add the store's tables for the engine of `url` (only its dialect matters: nothing connects) to `metadata`.

    Columns get the database types the backend's own types store into (a key kept as UTF-8 bytes is its
    VARBINARY/RAW column), which is what the migration creates and what autogenerate compares with the database.
    """
    backend = offline(url)
    tables = build_tables(check_prefix(table_prefix), backend, metadata)
    for table in tables.all:
        for column in table.columns:
            if isinstance(column.type, TypeDecorator):
                column.type = getattr(column.type, "binary", None) or column.type.impl_instance
        backend.migration_table(table)  # what the backend's DDL hooks do at create time, visible to autogenerate
    return tables



def render_item(type_: str, obj: Any, autogen_context: Any) -> str | Literal[False]:
    """Alembic's ``render_item`` hook: a primary key declared NONCLUSTERED for SQL Server keeps ``mssql_clustered``
    in the migration (Alembic renders no dialect options for primary keys); everything else renders as usual."""
    if (type_ == "primary_key" and isinstance(obj, PrimaryKeyConstraint)
            and obj.dialect_options["mssql"]["clustered"] is False):
        columns = ", ".join(repr(column.name) for column in obj.columns)
        return f"sa.PrimaryKeyConstraint({columns}, name={obj.name!r}, mssql_clustered=False)"
    return False
