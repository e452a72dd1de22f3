"""Oracle's maintenance part: table sizes from the schema's segments (`user_segments`); no generations or estimates
(the portable default's: purge in batches, exact counts)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table, func, literal, or_, select
from sqlalchemy import column as sql_column
from sqlalchemy import table as sql_table
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.elements import ColumnElement

from .maintenance import Maintenance


class OracleMaintenance(Maintenance):
    def size_statement(self, table: Table) -> Executable:
        # The schema's own segments: the table's and its LOB columns' (large responses) as the table, its indexes'
        # (LOB indexes included) as the index size. A table without rows may have no segment yet (deferred segment
        # creation): 0 bytes.
        segments = sql_table("user_segments", sql_column("segment_name"), sql_column("bytes"))
        lobs = sql_table("user_lobs", sql_column("table_name"), sql_column("segment_name"))
        indexes = sql_table("user_indexes", sql_column("table_name"), sql_column("index_name"))
        name = literal(self.backend.engine.dialect.denormalize_name(table.name))  # as the data dictionary spells it

        def total(condition: ColumnElement[bool]) -> Any:
            return select(func.coalesce(func.sum(segments.c.bytes), 0)).where(condition).scalar_subquery()

        own_lobs = select(lobs.c.segment_name).where(lobs.c.table_name == name)
        own_indexes = select(indexes.c.index_name).where(indexes.c.table_name == name)
        return select(total(or_(segments.c.segment_name == name, segments.c.segment_name.in_(own_lobs))),
                      total(segments.c.segment_name.in_(own_indexes)))
