"""PostgreSQL's maintenance part: generations rotated in one transaction (DDL is transactional), estimates from the
statistics the server keeps (`pg_stat_user_tables.n_live_tup`, the planner's estimate of a range).

A rotation locks both record tables ACCESS EXCLUSIVE, the previous one first (the order claims take them in): it
waits for every transaction that touched them (each claim holds its lock to its end), and new claims queue behind it
for its few milliseconds; `lock_timeout` bounds the wait (55P03, retried with a longer one: `rotation_wait`).
Dropping a table unlinks its files: no dead tuples, no vacuum debt, and the cost does not grow with the rows dropped.
Renaming keeps the statements valid: they name tables, and a cached plan is re-planned on the table it finds by that
name.
"""

from __future__ import annotations

import json

from sqlalchemy import Table, delete, func, literal, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection
from sqlalchemy.schema import DropTable
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.elements import ColumnElement

from .maintenance import Maintenance, carried, carried_columns, dropping, retired_name, rotation_wait

# A table's statistics are stale once the rows written since its last ANALYZE pass this share of the rows that ANALYZE
# saw, plus STALE_FLOOR: twice autovacuum's own trigger (autovacuum_analyze_scale_factor 0.1), so a table autovacuum
# keeps up with never reads as stale between two of its rounds, while one analysed empty and then bulk loaded does.
STALE_SHARE = 0.2
STALE_FLOOR = 1000


class PostgreSQLMaintenance(Maintenance):
    def size_statement(self, table: Table) -> Executable:
        # pg_table_size counts the heap, TOAST (large responses) and the free space and visibility maps.
        relation = func.to_regclass(literal(self.backend.engine.dialect.identifier_preparer.format_table(table)))
        return select(func.pg_table_size(relation), func.pg_indexes_size(relation))

    def generations(self) -> bool:
        return True

    def rotate(self, conn: Connection, current: Table, previous: Table, staging: Table,
               keep: ColumnElement[bool], attempt: int = 0) -> int:
        quote = conn.dialect.identifier_preparer.format_table
        cols = carried_columns(current)
        # Counted before the lock (only a rotation changes the previous table); the count's ACCESS SHARE lock, held to
        # this transaction's end, keeps another purge's rotation from swapping the table meanwhile, and claims (which
        # only read it) never wait on it.
        dropped = dropping(conn, previous)
        # What is carried forward is found on the completion index (a range and its NULLs); a generation never
        # analysed (a bulk load, a young table) would be planned as a sequential scan (249 ms at 500,000 rows).
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        dropped -= carried(conn, previous, keep)
        # Before the lock, what no claim needs to wait for: the next generation's table made (invisible to others
        # until this transaction commits), and the rows still within retention carried into the current one (a
        # claim of one of their keys replays it from either table: the same record). Under the lock the rotation
        # is then renames and the claims not completed moved: 5.8 + 1.9 ms of CREATE TABLE and CREATE INDEX less.
        retired = retired_name(previous)
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {_quote(conn, retired)}")  # a rotation interrupted before
        conn.execute(DropTable(staging, if_exists=True))
        staging.create(conn)
        conn.execute(pg_insert(current).from_select(cols, select(*(previous.c[c] for c in cols)).where(keep))
                     .on_conflict_do_nothing())
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{round(rotation_wait(attempt) * 1000)}ms'")
        # The previous table first: a claim reads it before it inserts into the current one, so a rotation taking
        # them the other way round would deadlock with every claim between its two statements.
        conn.exec_driver_sql(f"LOCK TABLE {quote(previous)}, {quote(current)} IN ACCESS EXCLUSIVE MODE")
        # Renamed away, dropped once this transaction has committed (`drop_retired`): unlinking a large table's files
        # is then no part of the time claims wait for.
        self._rename(conn, previous, retired)
        self._rename(conn, current, previous.name)
        self._rename(conn, staging, current.name)
        # The claims not completed, out of the generation that has just become the previous one and into the new
        # current one, in one statement.
        moved = (delete(previous).where(previous.c.completed_at.is_(None))
                 .returning(*(previous.c[c] for c in cols)).cte("moved"))
        conn.execute(current.insert().from_select(cols, select(*(moved.c[c] for c in cols))))
        return max(0, dropped)

    def _rename(self, conn: Connection, table: Table, name: str) -> None:
        """`table` and its primary key and indexes renamed after `name` (index names are per schema)."""
        conn.exec_driver_sql(f"ALTER TABLE {_quote(conn, table.name)} RENAME TO {_quote(conn, name)}")
        for index in _index_names(table):
            conn.exec_driver_sql(f"ALTER INDEX {_quote(conn, index)} RENAME TO"
                                 f" {_quote(conn, name + index.removeprefix(table.name))}")

    def rows(self, conn: Connection, table: Table) -> int | None:
        # n_live_tup: kept by the cumulative statistics from every insert and delete (no ANALYZE needed), unlike
        # pg_class.reltuples, which is -1 until the table is first vacuumed or analysed.
        found = conn.execute(text("SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = to_regclass(:name)"),
                             {"name": conn.dialect.identifier_preparer.format_table(table)}).scalar()
        return None if found is None else int(found)

    def stale(self, conn: Connection, table: Table) -> bool:
        # n_mod_since_analyze: rows inserted, updated or deleted since the last ANALYZE (autovacuum's or anyone's), kept
        # by the cumulative statistics from every write; reltuples: the rows that ANALYZE (or VACUUM) saw, -1 before
        # either ever ran (and every write since the table's creation is then a modification since ANALYZE).
        name = conn.dialect.identifier_preparer.format_table(table)
        found = conn.execute(text(
            "SELECT s.n_mod_since_analyze, c.reltuples FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid"
            " WHERE s.relid = to_regclass(:name)"), {"name": name}).first()
        if found is None:
            return False
        return int(found[0]) > STALE_FLOOR + STALE_SHARE * max(0.0, float(found[1]))

    def count_older_than(self, conn: Connection, table: Table, column: str, seconds: float) -> int:
        # Asked when the statistics are stale, which is when the planner would misjudge the range: a table analysed
        # empty then bulk loaded is planned as a sequential scan of all of it. On the index, the count costs what the
        # range holds (to the end of this read-only transaction, which ends with the count).
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        return super().count_older_than(conn, table, column, seconds)

    def older_than(self, conn: Connection, table: Table, column: str, seconds: float) -> int | None:
        # The planner folds statement_timestamp() for its estimate and reads the column's histogram: no row is read.
        prep = conn.dialect.identifier_preparer
        sql = (f"EXPLAIN (FORMAT JSON) SELECT 1 FROM {prep.format_table(table)} WHERE {prep.quote(column)}"
               f" < statement_timestamp() - make_interval(secs => {float(seconds)!r})")
        plan = conn.exec_driver_sql(sql).scalar_one()
        found = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]["Plan Rows"]
        return int(found)


def _index_names(table: Table) -> list[str]:
    """The primary key's name, then each index's: what a rename must move with the table (names are per schema)."""
    assert table.primary_key.name is not None
    return [str(table.primary_key.name), *sorted(str(index.name) for index in table.indexes)]


def _quote(conn: Connection, name: str) -> str:
    return str(conn.dialect.identifier_preparer.quote(name))
