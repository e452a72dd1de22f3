"""What a backend offers for one database, as one typed object (Django's ``DatabaseFeatures`` model).

A backend computes its `Features` from the URL (no connection) and may refine them from a live server where the
server decides (e.g. MySQL vs MariaDB behind a ``mysql://`` URL, SQL Server's SNAPSHOT being enabled, Galera).
Conformance checks, the store's own guards and the reports read features, never an engine's name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Self


def flag(doc: str, default: bool = True) -> Any:
    """A boolean feature a conformance check may require (``@pytest.mark.idem_requires(name)``)."""
    return field(default=default, metadata={"flag": True, "doc": doc})


@dataclass(frozen=True, slots=True)
class Features:
    """Typed facts about one backend on one database. Subclass to add a backend's own server-dependent facts."""

    isolation_levels: tuple[str, ...] = dataclasses.field(
        default=("READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"),
        metadata={"doc": "isolation levels (SQLAlchemy spelling) under which the protocol is guaranteed; a store"
                         " refuses an engine configured with any other (or AUTOCOMMIT)"})
    concurrent_connections: bool = flag("several connections may run transactions on the database at once")
    processes: bool = flag("several processes may share the database (not an in-process :memory: database)")
    exclusive_claim: bool = flag(
        "an atomic claim excludes every other claimer of the key before it commits, so an atomic effect callable"
        " runs once per key (False on multi-primary clusters that certify at commit, such as Galera)")
    multi_primary: bool = flag(
        "a cluster whose every node takes writes, so one pool may spread over the nodes (Galera)", default=False)
    synchronous_standby: bool = flag(
        "a commit is acknowledged only once a synchronous standby has it, so a promoted standby has every"
        " acknowledged key (PostgreSQL with synchronous_standby_names and synchronous_commit on)", default=False)
    session_state: bool = flag(
        "a connection's transactions share one server session, so what a driver keeps there between them (prepared"
        " statements, SET) lasts (False behind a transaction-mode pooler, such as PgBouncer)")
    failover_window: float | None = dataclasses.field(
        default=None, metadata={"doc": "seconds a failover of the database's HA stack takes at most, as declared (the"
                                       " URL's failover_window); RetryPolicy.total should exceed it"})
    max_identity_bytes: int | None = dataclasses.field(
        default=None, metadata={"doc": "UTF-8 bytes scope + operation + key may hold together (None: every valid"
                                       " identity fits)"})
    max_statement_bytes: int | None = dataclasses.field(
        default=None, metadata={"doc": "bytes the server takes in one statement as the driver sends it (MySQL and"
                                       " MariaDB: the session's max_allowed_packet, read from the server; PostgreSQL:"
                                       " 1 GiB per protocol message and value); a response whose completion would be"
                                       " larger is refused before it is sent (None: no limit the store must guard)"})
    statement_limit: str | None = dataclasses.field(
        default=None, metadata={"doc": "what sets max_statement_bytes, as ResponseTooLarge names it"})
    writers: int | None = dataclasses.field(
        default=None, metadata={"doc": "how many transactions may write at once (1: writers take turns on one lock, as"
                                       " on SQLite; None: no limit the protocol knows of)"})
    default_isolation: str | None = dataclasses.field(
        default=None, metadata={"doc": "the server's default isolation level, once read from a live connection"})
    expected_failures: tuple[tuple[str, str], ...] = dataclasses.field(
        default=(), metadata={"doc": "(check id, reason) pairs of conformance checks known to fail here"})

    @classmethod
    def flags(cls) -> dict[str, str]:
        """The names a check may require, with what each means."""
        return {f.name: f.metadata["doc"] for f in dataclasses.fields(cls) if f.metadata.get("flag")}

    def has(self, name: str) -> bool:
        if name not in self.flags():
            raise KeyError(f"unknown feature {name!r}; known features: {', '.join(sorted(self.flags()))}")
        return bool(getattr(self, name))

    def expected_failure(self, check: str) -> str | None:
        return dict(self.expected_failures).get(check)

    def replace(self, **changes: Any) -> Self:
        return dataclasses.replace(self, **changes)

    def as_json(self) -> dict[str, Any]:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v)
                for f in dataclasses.fields(self)}
