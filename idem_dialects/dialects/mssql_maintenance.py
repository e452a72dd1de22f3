"""SQL Server's maintenance part: table sizes from `sys.dm_db_partition_stats`; no generations or estimates (the
portable default's: purge in batches, exact counts)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table, case, func, literal, literal_column, select
from sqlalchemy import column as sql_column
from sqlalchemy import table as sql_table
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.elements import ColumnElement

from .maintenance import Maintenance


class MSSQLMaintenance(Maintenance):
    def size_statement(self, table: Table) -> Executable:
        # Pages in use (in-row, LOB and row-overflow) of the heap or clustered index (index_id 0/1) and of the other
        # indexes; needs VIEW DATABASE STATE (or the table's owner), else stats says the size is unavailable.
        stats = sql_table("dm_db_partition_stats", *map(sql_column, ("object_id", "index_id", "used_page_count")),
                          schema="sys")
        pages = stats.c.used_page_count

        def total(condition: ColumnElement[bool]) -> ColumnElement[Any]:
            return func.sum(case((condition, pages), else_=literal_column("0"))) * literal_column("8192")

        name = self.backend.engine.dialect.identifier_preparer.format_table(table)
        return select(total(stats.c.index_id < literal_column("2")), total(stats.c.index_id >= literal_column("2"))
                      ).where(stats.c.object_id == func.object_id(literal(name)))
