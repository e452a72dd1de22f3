"""The outbox's statements on engines this machine cannot run, compiled by SQLAlchemy's real dialects (as the other
statements' offline checks do): each engine's skip-locked claim, the lease, the marks. The live checks are the
conformance suite's (conformance/test_outbox.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import create_engine

from idem_dialects.core import Core
from idem_dialects.dialects.mysql import MySQLFeatures
from idem_dialects.execution.plan import plan
from idem_dialects.ids import command_id, derive, downstream_key
from idem_dialects.outbox import Failure
from idem_dialects.steps import Exec, Stepper

URLS = {"mssql": "mssql+pyodbc://sa:x@127.0.0.1:1/db?driver=FreeTDS",
        "oracle": "oracle+oracledb://x:y@127.0.0.1:1/?service_name=x",
        "mysql": "mysql+pymysql://x@127.0.0.1:1/db", "postgresql": "postgresql+psycopg://x@127.0.0.1:1/db"}


def statements(core: Core, flow: Any, answers: list[Any]) -> list[str]:
    """The SQL of each statement `flow` yields, fed `answers` in turn."""
    out, stepper = [], Stepper(flow)
    while (step := stepper.next()) is not None:
        assert isinstance(step, Exec)
        out.append(" ".join(plan(step.statement, core.engine.dialect).sql.split()))
        stepper.send(answers.pop(0) if answers else 1)
    return out


class Row:
    """A claimed row as the driver would give it back."""

    command_id, destination, scope, operation, idem_key, seq, attempts = "a", "d", "s", "o", "k", 0, 0
    payload, headers = b'j{"a":1}', b"j{}"
    created_at = datetime(2026, 1, 1)


def core_for(name: str) -> Core:
    if name == "mssql":
        pytest.importorskip("pyodbc", exc_type=ImportError)
    return Core(create_engine(URLS[name]), "idem_", None, None)


def test_sql_server_claims_with_readpast_and_updlock() -> None:
    core = core_for("mssql")
    from idem_dialects.outbox import Outbox

    select_sql, lease = statements(core, Outbox(core)._claim("t", 50, 30.0, True), [[Row()]])
    assert select_sql.startswith("SELECT TOP 50 ")
    assert "FROM idem_outbox WITH (UPDLOCK, READPAST, ROWLOCK) WHERE" in select_sql
    assert "NOT (EXISTS (SELECT 1 FROM idem_outbox AS earlier WHERE earlier.scope = idem_outbox.scope" in select_sql
    assert "FOR UPDATE" not in select_sql and select_sql.endswith("ORDER BY idem_outbox.available_at")
    assert lease.startswith("UPDATE idem_outbox SET available_at=dateadd(second, 30, sysutcdatetime()),"
                            " claim_token=? WHERE idem_outbox.command_id IN (?")


def test_oracle_claims_its_first_rows_inside_and_skips_locked_ones_outside() -> None:
    """FOR UPDATE beside FETCH FIRST or an ordered view is ORA-02014: the first n are chosen in an inline view, the
    outer query on the table locks them with SKIP LOCKED."""
    core = core_for("oracle")
    from idem_dialects.outbox import Outbox

    select_sql, lease = statements(core, Outbox(core)._claim("t", 50, 30.0, False), [[Row()]])
    assert select_sql.startswith("SELECT idem_outbox.command_id")
    assert "WHERE ROWID IN (SELECT due.rid FROM (SELECT ROWID AS rid FROM idem_outbox WHERE" in select_sql
    assert "ORDER BY idem_outbox.available_at) due WHERE ROWNUM <= :param_1)" in select_sql
    assert select_sql.endswith("FOR UPDATE SKIP LOCKED") and "FETCH FIRST" not in select_sql
    assert "numtodsinterval" in lease and "IN (:id_0, :id_1" in lease


@pytest.mark.parametrize(("skip", "clause"), [(True, "FOR UPDATE SKIP LOCKED"), (False, "FOR UPDATE")])
def test_mysql_skips_locked_rows_where_the_server_can(skip: bool, clause: str) -> None:
    core = core_for("mysql")
    core.backend.features = MySQLFeatures(skip_locked=skip)
    from idem_dialects.outbox import Outbox

    select_sql = statements(core, Outbox(core)._claim("t", 5, 30.0, True), [[]])[0]
    assert select_sql.endswith(f"LIMIT %(param_1)s {clause}")


def test_marks_are_fenced_by_the_lease() -> None:
    core = core_for("postgresql")
    from idem_dialects.outbox import Outbox

    sql = statements(core, Outbox(core)._settle("t", ["a"], [Failure("b", "E: x", dead=False, delay=4),
                                                            Failure("c", "E: y", dead=True)], ["d"]), [1, 1, 1, 1])
    assert len(sql) == 4 and all("claim_token = %(token)s" in s and "state = %(state_" in s for s in sql)
    assert "SET state=%(param_1)s::INTEGER" in sql[0] or "state=" in sql[0]
    assert "+ %(param_1)s" in sql[2] and "attempts=(idem_outbox.attempts + %(attempts_1)s::INTEGER)" in sql[2]


def test_ids_are_rfc9562_version_8_and_stable() -> None:
    one = command_id("acct:1", "debit:v1", "k", 0)
    assert one == command_id("acct:1", "debit:v1", "k", 0) != command_id("acct:1", "debit:v1", "k", 1)
    assert one[14] == "8" and one[19] in "89ab" and len(one) == 36
    assert derive("message", "acct:1", "debit:v1", "k", 0) != one  # a message's commands never collide
    assert downstream_key("charge", record=type("R", (), {"scope": "acct:1", "operation": "debit:v1",
                                                           "key": "k"})()) != one
