"""A store statement compiled once per dialect and driver: its SQL, how a call's parameters become what the driver
takes, and how a row comes back - what SQLAlchemy's execution context works out per execution, worked out once.

SQLAlchemy compiles (its dialect renders the SQL, bind casts and paramstyle) and lends its type processors; the
executors (`native.py`, `aio.py`) run the result on the DBAPI cursor or the async driver's own connection.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy.engine import Dialect
from sqlalchemy.sql.elements import BindParameter

from ..sqla import bind_processor, result_processor
from ..steps import Shape, Statement

Processor = Callable[[Any], Any] | None


class Plan:
    """What executing `statement` takes on `dialect`, computed once."""

    __slots__ = ("_binds", "_dialect", "_processors", "_row", "_types", "named", "shape", "sql")

    _processors: list[Processor] | None

    def __init__(self, statement: Statement, dialect: Dialect) -> None:
        # render_postcompile: the few values fixed when the statement is built (a LIMIT) go into the SQL text.
        clause: Any = statement.clause
        compiled = clause.compile(dialect=dialect, compile_kwargs={"render_postcompile": True})
        self.sql: str = compiled.string
        self.shape = statement.shape
        self._dialect = dialect
        by_name = {name: bind for bind, name in compiled.bind_names.items()}
        self.named = not compiled.positional
        if compiled.positional:
            order = list(compiled.positiontup or ())
        else:  # every bind once, but those rendered into the SQL text (render_postcompile)
            inline = {compiled.bind_names[b] for b in compiled.literal_execute_params | compiled.post_compile_params}
            order = [name for name in dict.fromkeys(compiled.bind_names.values()) if name not in inline]
        escaped = compiled.escaped_bind_names
        # (driver key, call key or None for a constant, processor, constant value) per bind, in the driver's order.
        self._binds = [_bind(escaped.get(name, name), by_name[name], dialect) for name in order]
        columns = _columns(statement)
        self._types = [type_ for _, type_ in columns]
        self._row: Any = namedtuple("Row", [name for name, _ in columns], rename=True) if columns else None
        self._processors = None  # SQLAlchemy's result processors, from the first answer's column types

    def parameters(self, params: Mapping[str, Any]) -> Any:
        """The driver's parameters for one call: a dict (named paramstyles) or a tuple (positional ones)."""
        if self.named:
            return {key: (const if name is None else params[name] if proc is None else proc(params[name]))
                    for key, name, proc, const in self._binds}
        return tuple([const if name is None else params[name] if proc is None else proc(params[name])
                      for _, name, proc, const in self._binds])  # a list first: one call, not one per bind

    def result(self, raw: Any, description: Any) -> Any:
        """What the flow gets for the driver's answer `raw` and its cursor's `description` (see `read`; the
        description is read only while `wants_description`)."""
        if self.shape is Shape.ROW:
            return self.row(raw, description)
        if self.shape is Shape.ROWS:
            return [self.row(r, description) for r in raw]
        return raw

    def row(self, raw: Any, description: Any) -> Any:
        """A fetched row with SQLAlchemy's result processing applied, its values by column name where the statement
        names its columns (else a tuple); None stays None."""
        if raw is None:
            return None
        if self._row is None:
            return tuple(raw)  # a statement that names no columns (text()): its values as the driver gave them
        processors = self._processors
        if processors is None:  # the driver's column types are the same on every execution: read them once
            coltypes = [d[1] for d in description] if description else []
            processors = self._processors = [
                result_processor(type_, self._dialect, coltypes[i] if i < len(coltypes) else None)
                for i, type_ in enumerate(self._types)]
        return self._row._make([value if proc is None else proc(value)
                                for value, proc in zip(raw, processors, strict=True)])

    @property
    def wants_description(self) -> bool:
        """Whether the next answer's cursor description is still needed (a psycopg cursor builds one per access)."""
        return self._processors is None and self._row is not None


def _bind(key: str, bind: BindParameter[Any], dialect: Dialect) -> tuple[str, str | None, Processor, Any]:
    processor: Processor = bind_processor(bind.type, dialect)
    if bind.required:  # a parameter of every call
        return key, bind.key, processor, None
    value = bind.effective_value  # a constant fixed when the statement was built
    return key, None, None, value if processor is None else processor(value)


def _columns(statement: Statement) -> list[tuple[str, Any]]:
    """The result columns a statement declares (a SELECT's, RETURNING's): names and SQLAlchemy types."""
    clause: Any = statement.clause
    columns = getattr(clause, "selected_columns", None)
    if columns is None and getattr(clause, "_returning", None):
        columns = clause.exported_columns
    if columns is None:
        return []  # text() or a construct of ours: rows by position
    return [(column.key, column.type) for column in columns]


def plan(statement: Statement, dialect: Dialect) -> Plan:
    """`statement` compiled for `dialect` (a store's dialect: each statement meets one or two in its life)."""
    found: Plan | None = statement.compiled.get(dialect)
    if found is None:
        found = statement.compiled[dialect] = Plan(statement, dialect)
    return found


def read(cursor: Any, plan: Plan) -> tuple[Any, Any]:
    """A PEP 249 cursor's answer for `plan`: (rowcount or None, None), or (first row or every row, description; the
    description only while the plan still wants it)."""
    shape = plan.shape
    if shape is Shape.ROW or shape is Shape.ROWS:
        description = cursor.description if plan.wants_description else None
        return (cursor.fetchone() if shape is Shape.ROW else cursor.fetchall()), description
    return (cursor.rowcount if shape is Shape.ROWCOUNT else None), None
