"""MySQL's and MariaDB's maintenance part: generations rotated under LOCK TABLES (DDL is not transactional), estimates
from InnoDB's statistics (`information_schema.TABLES.TABLE_ROWS`, EXPLAIN's index dive on a range).

LOCK TABLES ... WRITE takes the tables' exclusive metadata locks, so it waits for every transaction that touched
them (a claim holds its metadata lock to its end) and new claims wait behind it; under it the carried rows are
copied and the three tables renamed one by one (`ALTER TABLE ... RENAME`: RENAME TABLE is refused under LOCK
TABLES), so no claim ever sees the tables half rotated. The old generation is dropped after UNLOCK TABLES
(`drop_retired`): DROP TABLE frees its tablespace file whole, without InnoDB's purge lag or a lock on the ranges
claims insert into. Not on a Galera node: LOCK TABLES is not replicated there (its purge runs in batches at READ
COMMITTED).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table, delete, func, select, text
from sqlalchemy import column as sql_column
from sqlalchemy import table as sql_table
from sqlalchemy.engine import Connection
from sqlalchemy.schema import DropTable
from sqlalchemy.sql.elements import ColumnElement

from .maintenance import Maintenance, carried_columns, dropping, retired_name

ROTATION_LOCK_WAIT = 10  # seconds (lock_wait_timeout, metadata locks): then 1205, which the purge's retry tries again


class MySQLMaintenance(Maintenance):
    def size_statement(self, table: Table) -> Any:
        # InnoDB's estimates (the clustered primary key is the data; INDEX_LENGTH the secondary indexes), refreshed
        # with its persistent statistics; MySQL 8 caches them up to information_schema_stats_expiry (a day).
        tables = sql_table("TABLES", sql_column("TABLE_SCHEMA"), sql_column("TABLE_NAME"), sql_column("DATA_LENGTH"),
                           sql_column("INDEX_LENGTH"), schema="information_schema")
        return select(tables.c.DATA_LENGTH, tables.c.INDEX_LENGTH).where(
            tables.c.TABLE_SCHEMA == func.database(), tables.c.TABLE_NAME == table.name)

    def generations(self) -> bool:
        return not getattr(self.backend.features, "wsrep", False)

    def rotate(self, conn: Connection, current: Table, previous: Table, staging: Table,
               keep: ColumnElement[bool]) -> int:
        quote = conn.dialect.identifier_preparer.format_table
        cols = carried_columns(current)
        dropped = dropping(self, conn, previous)  # before the lock: only a rotation changes the previous table
        conn.execute(DropTable(staging, if_exists=True))
        staging.create(conn)
        retired = retired_name(previous)
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {_quote(conn, retired)}")  # a rotation interrupted before
        saved = conn.exec_driver_sql("SELECT @@SESSION.lock_wait_timeout").scalar_one()
        conn.exec_driver_sql(f"SET SESSION lock_wait_timeout = {ROTATION_LOCK_WAIT}")
        try:
            conn.exec_driver_sql(f"LOCK TABLES {quote(current)} WRITE, {quote(previous)} WRITE, {quote(staging)} WRITE")
            try:
                kept = conn.execute(current.insert().prefix_with("IGNORE").from_select(
                    cols, select(*(previous.c[c] for c in cols)).where(keep))).rowcount
                is_open = current.c.completed_at.is_(None)
                conn.execute(staging.insert().from_select(cols, select(*(current.c[c] for c in cols)).where(is_open)))
                conn.execute(delete(current).where(is_open))
                conn.exec_driver_sql(f"ALTER TABLE {quote(previous)} RENAME TO {_quote(conn, retired)}")
                conn.exec_driver_sql(f"ALTER TABLE {quote(current)} RENAME TO {quote(previous)}")
                conn.exec_driver_sql(f"ALTER TABLE {quote(staging)} RENAME TO {quote(current)}")
            finally:
                conn.exec_driver_sql("UNLOCK TABLES")
        finally:
            conn.exec_driver_sql(f"SET SESSION lock_wait_timeout = {int(saved)}")
        return max(0, dropped - max(0, kept))

    def rows(self, conn: Connection, table: Table) -> int | None:
        # InnoDB's persistent statistics: refreshed in the background once a tenth of the table has changed.
        found = conn.execute(text("SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()"
                                  " AND TABLE_NAME = :name"), {"name": table.name}).scalar()
        return None if found is None else int(found)

    def older_than(self, conn: Connection, table: Table, column: str, seconds: float) -> int | None:
        # EXPLAIN's row count for a range on an indexed column is InnoDB's index dive (records_in_range): a few
        # pages read, whatever the range's size. Without an index it is the table's estimate, an upper bound.
        prep = conn.dialect.identifier_preparer
        micros = round(seconds * 1_000_000)
        # FORCE INDEX: where the range is most of the table the optimizer would plan a full scan, whose estimate is
        # the whole table's; the index's plan carries the dive's estimate of the range itself.
        index = next((i.name for i in table.indexes if [c.name for c in i.columns] == [column]), None)
        hint = f" FORCE INDEX ({prep.quote(str(index))})" if index else ""
        row = conn.exec_driver_sql(
            f"EXPLAIN SELECT 1 FROM {prep.format_table(table)}{hint} WHERE {prep.quote(column)}"
            f" < TIMESTAMPADD(MICROSECOND, {-micros}, UTC_TIMESTAMP(6))").mappings().first()
        if row is None:
            return None
        rows = {str(k).lower(): v for k, v in row.items()}.get("rows")
        return None if rows is None else int(rows)


def _quote(conn: Connection, name: str) -> str:
    return str(conn.dialect.identifier_preparer.quote(name))
