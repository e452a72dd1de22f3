"""SQLite's maintenance part: table sizes from the dbstat virtual table; no generations or estimates (the portable
default's: purge in batches, exact counts)."""

from __future__ import annotations

from sqlalchemy import Table, text
from sqlalchemy.sql.base import Executable

from .maintenance import Maintenance


class SQLiteMaintenance(Maintenance):
    def size_statement(self, table: Table) -> Executable:
        # The dbstat virtual table (in the sqlite3 of CPython's builds; where it is missing, stats says so), summed per
        # b-tree: the table's own (its rows) and its indexes' (the primary key's autoindex among them).
        return text(
            "SELECT sum(CASE WHEN d.name = :t THEN d.pgsize ELSE 0 END),"
            " sum(CASE WHEN d.name = :t THEN 0 ELSE d.pgsize END)"
            " FROM dbstat('main', 1) AS d JOIN sqlite_master AS m ON m.name = d.name WHERE m.tbl_name = :t"
        ).bindparams(t=table.name)
