"""Patroni with an asynchronous replica: the backend sees no synchronous standby, and Patroni's lag guard
(``maximum_lag_on_failover``) refuses to promote a replica that is further behind than that: the leader's death is
an outage, not a loss of acknowledged keys. (The synchronous `postgresql-patroni` engine's failover is the
conformance check ``cluster_node_killed_mid_load``.)"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from idem_dialects import IdempotencyStore, RetriesExhausted, RetryPolicy
from idem_dialects.conformance.plugin import unique_prefix
from idem_dialects.conformance.support import Effects
from idem_dialects.engines import Unavailable, get, patroni
from idem_dialects.engines.pgserver import query

REQ = {"amount": 1}


@pytest.fixture(scope="module")
def async_cluster() -> Iterator[patroni.PatroniCluster]:
    try:
        cluster = patroni.patroni_cluster(synchronous=False)
    except Unavailable as exc:
        pytest.skip(f"Patroni unavailable: {exc}; to enable: {get('postgresql-patroni').how_to_enable()}")
    yield cluster
    cluster.stop()


def test_asynchronous_replica_is_no_synchronous_standby(async_cluster: patroni.PatroniCluster) -> None:
    with IdempotencyStore.from_url(async_cluster.url(), table_prefix=unique_prefix()) as store:
        with store.transaction():
            assert not store.features.synchronous_standby and store.features.exclusive_claim


def _replica_lag(cluster: patroni.PatroniCluster) -> int:
    lags = [m.get("lag") for m in cluster.members() if m.get("role") != "leader"]
    return max((lag for lag in lags if isinstance(lag, int)), default=0)


def test_lag_guard_refuses_to_promote_a_lagging_replica(async_cluster: patroni.PatroniCluster) -> None:
    """With the leader's WAL sender paused, 8 threads commit keys the replica never receives until it is more than
    maximum_lag_on_failover behind; the leader is then killed. Patroni promotes nobody (callers get
    RetriesExhausted: an outage), and once the old leader's Patroni is back it leads again with every acknowledged
    key: none lost, none applied twice."""
    cluster = async_cluster
    store = IdempotencyStore.from_url(cluster.url(), table_prefix=unique_prefix(), retry=RetryPolicy(total=30),
                                      pool_size=8, max_overflow=0)
    store.create_tables()
    effects = Effects(store)
    effects.create()
    leader = cluster.leader()
    assert leader is not None
    sender = int(str(query(leader.port, "SELECT pid FROM pg_stat_replication")[0][0]))
    os.kill(sender, signal.SIGSTOP)  # WAL now stays on the leader; the sender dies with it below
    acked: dict[str, Any] = {}
    lock, stop = threading.Lock(), threading.Event()

    def worker(t: int) -> None:
        i = 0
        while not stop.is_set():
            key = f"lag-{t}-{i}"
            i += 1
            result = store.run(scope="s", operation="op", key=key, request=REQ, effect=effects.effect(key))
            with lock:
                acked[key] = result.response

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    try:  # until Patroni itself reports the replica beyond the limit (the leader publishes its position each loop)
        while _replica_lag(cluster) <= patroni.MAX_LAG and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    lag = _replica_lag(cluster)
    assert lag > patroni.MAX_LAG, f"the replica never fell behind: lag {lag} bytes"
    cluster.kill()
    # The leader key expires after the ttl; the replica then checks its lag and refuses the leader race.
    assert not cluster.elected(patroni.TTL + 5 * patroni.LOOP_WAIT + 3), \
        "Patroni promoted a replica beyond maximum_lag_on_failover"
    with pytest.raises(RetriesExhausted):
        store.run(scope="s", operation="op", key="during-outage", request=REQ, effect=effects.effect("x"),
                  retry=RetryPolicy(total=2))
    replica_log = next(n for n in cluster.nodes if not n.killed).log.read_text(errors="replace")
    assert "exceeds maximum replication lag" in replica_log
    cluster.rejoin()  # the old leader's Patroni: the most advanced node, it takes the leader lock again
    store.engine.dispose()
    lost = [key for key, response in acked.items()
            if store.run(scope="s", operation="op", key=key, request=REQ, effect=effects.effect(key)).response
            != response]
    per_key = effects.per_key()
    effects.drop()
    store.drop_tables()
    store.close()
    assert len(acked) > 100
    assert lost == [], f"{len(lost)} of {len(acked)} acknowledged keys lost"
    assert per_key == dict.fromkeys(acked, 1)
