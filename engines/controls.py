"""What a cluster engine lets the cluster checks do to it: the `controls` of a `Server` (engines/patroni.py,
engines/haproxy.py)."""

from __future__ import annotations

from typing import Protocol

from sqlalchemy.engine import URL


class ClusterControls(Protocol):
    """What a cluster engine lets the cluster checks do to it (engines/patroni.py, engines/haproxy.py)."""

    # "multi-primary": every node takes writes (Galera); "failover": a leader and a replica the stack promotes.
    kind: str

    def node_urls(self) -> list[URL]:
        """One URL per live node, bypassing any proxy (multi-primary: any of them takes writes)."""
        ...

    def kill(self) -> str:
        """SIGKILL one node mid-load (failover: the leader; one writer: the writer) with all its processes; says
        which."""
        ...

    def await_failover(self) -> None:
        """Wait until the cluster's own machinery has failed over (Patroni elected a new leader that takes writes,
        HAProxy marked the killed node down). The harness never promotes anything itself."""
        ...

    def rejoin(self) -> str:
        """Start the killed node again and wait until it is back in the cluster (failover: a replica of the new
        leader); says how it came back."""
        ...

    def facts(self) -> dict[str, object]:
        """What the cluster is, for the matrix's behaviour table (nodes, replication mode, ...)."""
        ...
