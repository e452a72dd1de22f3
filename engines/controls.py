"""What a cluster engine lets the cluster checks do to it: the `controls` of a `Server` (engines/galera.py,
engines/pg_ha.py)."""

from __future__ import annotations

from typing import Protocol

from sqlalchemy.engine import URL


class ClusterControls(Protocol):
    """What a cluster engine lets the cluster checks do to it (engines/galera.py, engines/pg_ha.py)."""

    # "multi-primary": every node takes writes (Galera); "failover": a primary and a standby to promote.
    kind: str

    def node_urls(self) -> list[URL]:
        """One URL per live node, bypassing any proxy (multi-primary: any of them takes writes)."""
        ...

    def kill(self) -> str:
        """SIGKILL one node mid-load (failover: the primary) with all its processes; says which."""
        ...

    def promote(self) -> None:
        """Failover: promote the standby and wait until it takes writes. Multi-primary: nothing to do."""
        ...

    def facts(self) -> dict[str, object]:
        """What the cluster is, for the matrix's behaviour table (nodes, replication mode, ...)."""
        ...
