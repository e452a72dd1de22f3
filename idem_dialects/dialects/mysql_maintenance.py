"""MySQL's and MariaDB's maintenance part: generations rotated under LOCK TABLES (DDL is not transactional), estimates
from InnoDB's statistics (`information_schema.TABLES.TABLE_ROWS`); the backlog past retention is counted.

LOCK TABLES ... WRITE takes the tables' exclusive metadata locks, so it waits for every transaction that touched
them (a claim holds its metadata lock to its end) and new claims wait behind it; under it the claims not completed
are moved into the next generation's table (made before, as the rows carried forward are copied before) and the
three tables renamed one by one (`ALTER TABLE ... RENAME`: RENAME TABLE is refused under LOCK
TABLES), so no claim ever sees the tables half rotated. The old generation is dropped after UNLOCK TABLES
(`drop_retired`): DROP TABLE frees its tablespace file whole, without InnoDB's purge lag or a lock on the ranges
claims insert into. Not on a Galera node: LOCK TABLES is not replicated there (its purge runs in batches at READ
COMMITTED).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Table, and_, delete, func, or_, select, text
from sqlalchemy import column as sql_column
from sqlalchemy import table as sql_table
from sqlalchemy.engine import Connection
from sqlalchemy.schema import DropTable
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import Select

from .maintenance import Maintenance, carried, carried_columns, dropping, retired_name, rotation_wait


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
               keep: ColumnElement[bool], attempt: int = 0) -> int:
        quote = conn.dialect.identifier_preparer.format_table
        cols = carried_columns(current)
        # Before the lock: only a rotation changes the previous table.
        dropped = dropping(conn, previous) - carried(conn, previous, keep)
        # Before the lock, what no claim needs to wait for. The next generation's table as a copy of the current
        # one's definition, indexes included: one DDL statement (CREATE TABLE then CREATE INDEX was two, each a
        # tablespace or dictionary write and its flush). The rows still within retention carried into the current
        # table (a claim of one of their keys replays it from either table: the same record).
        conn.execute(DropTable(staging, if_exists=True))
        conn.exec_driver_sql(f"CREATE TABLE {quote(staging)} LIKE {quote(current)}")
        retired = retired_name(previous)
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {_quote(conn, retired)}")  # a rotation interrupted before
        conn.execute(current.insert().prefix_with("IGNORE").from_select(
            cols, select(*(previous.c[c] for c in cols)).where(keep)))
        saved = conn.exec_driver_sql("SELECT @@SESSION.lock_wait_timeout").scalar_one()
        # Whole seconds (MariaDB truncates a fraction to 0, which would be NOWAIT): at least 1 s.
        conn.exec_driver_sql(f"SET SESSION lock_wait_timeout = {max(1, round(rotation_wait(attempt, 1.0)))}")
        try:
            # LOCK TABLES commits the rows carried forward first (as DDL does, it ends the transaction).
            conn.exec_driver_sql(f"LOCK TABLES {quote(current)} WRITE, {quote(previous)} WRITE, {quote(staging)} WRITE")
            try:
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
        return max(0, dropped)

    def key_range(self, columns: Sequence[ColumnElement[Any]], values: Sequence[ColumnElement[Any]],
                  op: str) -> ColumnElement[bool] | None:
        # Written out column by column (c1 > v1 OR c1 = v1 AND (...)): MariaDB's optimizer ranges on that, and scans
        # the whole table for a row comparison. A purge batch's DELETE, read through the completion index, locks the
        # row of every entry it steps over, deleted ones too (until InnoDB's purge removes them): 23 us a row where
        # a batch of a group sharing one completion time began at its start again, 11 us by key ranges.
        first, value = columns[0], values[0]
        if len(columns) == 1:
            return first > value if op == ">" else first <= value
        strict = first > value if op == ">" else first < value
        rest = self.key_range(columns[1:], values[1:], op)
        assert rest is not None
        return or_(strict, and_(first == value, rest))

    def in_key_order(self, query: Select[Any], table: Table) -> Select[Any]:
        # The rows of one completion time after a key: planned on the completion index (the time's equality), they
        # are every row of that time read and sorted, each batch again (30 ms a batch in 50,000); on the primary key,
        # the batch's own rows.
        return query.with_hint(table, "FORCE INDEX (PRIMARY)")

    def rows(self, conn: Connection, table: Table) -> int | None:
        # InnoDB's running count (INNODB_SYS_TABLESTATS.NUM_ROWS on MariaDB), kept by every insert and delete, not by
        # ANALYZE TABLE, and reset to the sampled estimate at each recalculation (MySQL 8 caches it in the data
        # dictionary for information_schema_stats_expiry).
        found = conn.execute(text("SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()"
                                  " AND TABLE_NAME = :name"), {"name": table.name}).scalar()
        return None if found is None else int(found)

    # No `older_than`, and so no `stale`: EXPLAIN's estimate of a range is InnoDB's index dive, exact over the few
    # pages it reads and beyond them extrapolated and capped at half the table (records_in_range: 100,000 for a range
    # of 200,000 rows in a table of 200,000, before and after the background recalculation), whatever the freshness
    # of the persistent statistics (mysql.innodb_table_stats; INNODB_SYS_TABLESTATS.MODIFIED_COUNTER restarts when a
    # recalculation is queued, not when it is done). `stats` counts the backlog on the completion index instead: a
    # range costs what it holds, a few rows while purge keeps up.


def _quote(conn: Connection, name: str) -> str:
    return str(conn.dialect.identifier_preparer.quote(name))
