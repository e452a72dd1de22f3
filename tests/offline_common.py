"""Running a backend's flows without a server: one small driver that executes each `Exec` step a flow yields on a
scripted stand-in for SQLAlchemy's Connection (tests/mssql_common.py, tests/ora_common.py), the way the library's
own loop does for the drivers that go through SQLAlchemy (`execution.sync.execute_sqlalchemy`)."""

from __future__ import annotations

from typing import Any, TypeVar

from idem_dialects.steps import Exec, Flow, Shape, Statements, Stepper

T = TypeVar("T")


def answer(result: Any, shape: Shape) -> Any:
    """What a statement of `shape` sends back to its flow, read from a SQLAlchemy-like result."""
    if shape is Shape.ROWCOUNT:
        return result.rowcount
    if shape is Shape.ROW:
        return result.first()
    if shape is Shape.ROWS:
        return result.all() if hasattr(result, "all") else list(result)
    return None


def run(flow: Flow[T], conn: Any) -> T:
    """Drive `flow` to its end on `conn`: each statement executed with its parameters, its answer (as the step's
    shape asks) sent back, its error thrown into the flow (which may catch a duplicate); the flow's value returned.
    A flow that yields anything but a statement (a transaction, an effect) is not one these tests drive."""
    stepper = Stepper(flow)
    while (step := stepper.next()) is not None:
        assert isinstance(step, Exec | Statements), f"an offline flow yields only statements, not {step!r}"
        try:
            if isinstance(step, Statements):  # a run of statements: driven in turn, as the sync store does
                stepper.send(run(step.body, conn))
            else:
                stepper.send(answer(conn.execute(step.statement.clause, dict(step.params)), step.statement.shape))
        except Exception as exc:
            stepper.throw(exc)
    return stepper.value
