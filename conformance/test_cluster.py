"""Checks for clusters: a same-key race with one pool spread over every node and a replay on another node right
after the acknowledgement (feature ``multi_primary``), and a node or the leader killed mid-load, the stack failing
over by itself and the node rejoining (feature ``multi_primary`` or ``synchronous_standby``). Single servers lack
those features and skip with that reason; the checks that reach single nodes or kill them also need the cluster's
controls (`Server.controls`, which the catalogue's own ``postgresql-patroni`` and ``galera-haproxy-*`` engines have),
and skip with that reason on a cluster reached by URL alone."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from idem_dialects import IdempotencyStore, Result, RetryPolicy
from idem_dialects.engines import ClusterControls

from .plugin import EngineUnderTest
from .support import Effects

REQ = {"amount": 100}
Observe = Callable[[str, object], None]
# Covers a Patroni failover (ttl 10 s: 10-13 s measured) or a Galera view change (evs.suspect_timeout 3 s) many times.
FAILOVER_BUDGET = RetryPolicy(total=90.0, initial=0.01, max_wait=0.5)


def outage(killed_at: float, acked_at: list[float]) -> float:
    """The longest stretch without any acknowledgement from `killed_at` on (the failover as callers see it: a
    commit that completed as the kill happened does not end it; writes that go on elsewhere keep it short)."""
    times = [killed_at, *sorted(t for t in acked_at if t > killed_at)]
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def cluster_controls(engine: EngineUnderTest) -> ClusterControls:
    """The cluster's controls, or a skip saying why there are none."""
    if engine.server.controls is None:
        pytest.skip(f"{engine.name} ({engine.server.how}) has no cluster controls to reach single nodes or kill"
                    " them: only the catalogue's own cluster engines (postgresql-patroni, galera-haproxy-*) have them")
    return engine.server.controls


def _race_round(threads: int, call: Callable[[int], Any]) -> list[Any]:
    barrier = threading.Barrier(threads)
    out: list[Any] = [None] * threads

    def one(i: int) -> None:
        barrier.wait()
        try:
            out[i] = call(i)
        except Exception as exc:  # collected: the check says which callers saw an error
            out[i] = exc

    workers = [threading.Thread(target=one, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return out


@pytest.mark.idem_stack
@pytest.mark.idem_api("sync")
@pytest.mark.idem_requires("multi_primary")
def test_cluster_race_spread_over_nodes(idem_make_store: Callable[..., IdempotencyStore], idem_engine: EngineUnderTest,
                                        idem_observe: Observe) -> None:
    """16 threads whose pool spreads over every node race on each of 20 keys: one effect per key in the database,
    identical responses, no error reaching a caller; how often the effect callable ran is reported."""
    threads, keys = 16, [f"spread-{i}" for i in range(20)]
    store = idem_make_store(pool_size=threads, max_overflow=0)
    effects = Effects(store)
    effects.create()
    calls: Counter[str] = Counter()
    lock = threading.Lock()

    def effect(key: str) -> Callable[[Any], Any]:
        def run(conn: Any) -> Any:
            with lock:
                calls[key] += 1
            return {"effect": effects.apply(conn, key)}
        return run

    try:
        for key in keys:
            def call(i: int, key: str = key) -> Result:
                return store.run(scope="s", operation="op", key=key, request=REQ, effect=effect(key))

            results = _race_round(threads, call)
            errors = [r for r in results if not isinstance(r, Result)]
            assert errors == [], f"{key}: errors reached callers: {errors!r}"
            assert len({repr(r.response) for r in results}) == 1, f"{key}: callers got different responses"
            assert sum(not r.replayed for r in results) == 1
        assert effects.per_key() == {k: 1 for k in keys}
    finally:
        effects.drop()
    total = sum(calls.values())
    idem_observe("spread race (16 threads, 20 keys): effects per key in the database", 1)
    idem_observe("spread race: effect callable calls per key", f"{total / len(keys):.1f} (max {max(calls.values())};"
                 f" {total} calls, {total - len(keys)} rolled back)")
    idem_observe("spread race: retries absorbed", dict(store.retries) or "none")
    if idem_engine.server.controls is not None:
        idem_observe("spread race: cluster", idem_engine.server.controls.facts())


@pytest.mark.idem_stack
@pytest.mark.idem_api("sync")
@pytest.mark.idem_requires("multi_primary")
def test_cluster_replay_on_another_node(idem_make_store: Callable[..., IdempotencyStore],
                                        idem_engine: EngineUnderTest, idem_observe: Observe) -> None:
    """A retry sent to another node right after the acknowledgement replays it and never runs the effect
    callable (300 keys, each completed on one node and re-sent at once to the next)."""
    controls = cluster_controls(idem_engine)
    node_stores = [idem_make_store(url) for url in controls.node_urls()]
    effects = Effects(node_stores[0])
    effects.create()
    reran: list[str] = []
    try:
        for i in range(300):
            key = f"replay-{i}"
            first = node_stores[i % len(node_stores)]
            other = node_stores[(i + 1) % len(node_stores)]
            done = first.run(scope="s", operation="op", key=key, request=REQ, effect=effects.effect(key))

            def must_not_run(conn: Any, key: str = key) -> Any:
                reran.append(key)
                return {"effect": effects.apply(conn, key)}

            again = other.run(scope="s", operation="op", key=key, request=REQ, effect=must_not_run)
            assert again.replayed and again.response == done.response, f"{key}: the replay on another node differs"
        assert reran == [], f"the effect callable ran again on another node for {reran[:5]}"
        assert effects.count() == 300
    finally:
        effects.drop()
    retried = Counter[str]()
    for store in node_stores:
        retried.update(store.retries)
    idem_observe("replay on another node right after the ack: effect callable calls", f"{len(reran)} of 300")
    idem_observe("replay on another node: retries absorbed", dict(retried) or "none")


@pytest.mark.idem_stack
@pytest.mark.idem_api("sync")  # one kill per cluster: the async store's columns share the same servers
@pytest.mark.idem_disruptive
def test_cluster_node_killed_mid_load(idem_make_store: Callable[..., IdempotencyStore],
                                      idem_engine: EngineUnderTest, idem_observe: Observe) -> None:
    """A node (Galera) or the leader (Patroni then promotes the synchronous standby) is killed under 8 threads of
    load: no error reaches a caller whose retry budget covers the failover, and once the killed node rejoined,
    re-sending every key replays each acknowledged response (none lost) with exactly one effect per key in the
    database."""
    features = idem_engine.features
    if not (features.multi_primary or features.synchronous_standby):
        pytest.skip("needs multi_primary or synchronous_standby, which this engine lacks: with neither, a killed"
                    " server takes acknowledged keys with it")
    controls = cluster_controls(idem_engine)
    threads, per_thread = 8, 60
    store = idem_make_store(retry=FAILOVER_BUDGET, pool_size=threads, max_overflow=0)
    effects = Effects(store)
    effects.create()
    keys = [[f"kill-{t}-{i}" for i in range(per_thread)] for t in range(threads)]
    acked: dict[str, Any] = {}
    errors: list[tuple[str, BaseException]] = []
    lock = threading.Lock()
    killed_at: list[float] = []
    acked_at: list[float] = []
    kill_when = threads * per_thread // 4

    stopped = threading.Event()  # the stack did not fail over: callers stop, not spend a budget on every key

    def worker(mine: list[str]) -> None:
        for key in mine:
            if stopped.is_set():
                return
            try:
                result = store.run(scope="s", operation="op", key=key, request=REQ, effect=effects.effect(key))
            except Exception as exc:  # a raw error (or RetriesExhausted) reaching a caller: the check fails
                with lock:
                    errors.append((key, exc))
                continue
            with lock:
                acked[key] = result.response
                acked_at.append(time.monotonic())

    workers = [threading.Thread(target=worker, args=(mine,)) for mine in keys]
    for w in workers:
        w.start()
    try:
        while len(acked) < kill_when and any(w.is_alive() for w in workers):
            time.sleep(0.01)
        acked_before = len(acked)
        killed_at.append(time.monotonic())
        what = controls.kill()
        controls.await_failover()
        failed_over = time.monotonic() - killed_at[0]
    except BaseException:
        stopped.set()
        raise
    finally:
        for w in workers:
            w.join()
    assert errors == [], f"{len(errors)} callers saw errors, e.g. {errors[:3]!r}"
    rejoined = controls.rejoin()
    # Re-send every key through a fresh pool: an acknowledged key whose record was lost would run again and
    # answer with a different response.
    store.engine.dispose()
    resent = idem_make_store(retry=FAILOVER_BUDGET)
    lost, ran_again = [], []
    for key in (k for mine in keys for k in mine):
        result = resent.run(scope="s", operation="op", key=key, request=REQ, effect=effects.effect(key))
        if key in acked and result.response != acked[key]:
            lost.append(key)
        if not result.replayed:
            ran_again.append(key)
    per_key = effects.per_key()
    doubled = sorted(k for k, n in per_key.items() if n > 1)
    all_keys = [k for mine in keys for k in mine]
    idem_observe("node kill: what was killed", what)
    idem_observe("node kill: keys acknowledged before the kill / in total", f"{acked_before} / {len(acked)}")
    idem_observe("node kill: acknowledged keys lost, keys with 2+ effects", f"{len(lost)}, {len(doubled)}")
    idem_observe("node kill: longest time without an acknowledgement from the kill on (s)",
                 round(outage(killed_at[0], acked_at), 2))
    idem_observe("node kill: kill to the stack's failover done (s)", round(failed_over, 2))
    idem_observe("node kill: failover window the URL declares (s)", idem_engine.features.failover_window or "none")
    idem_observe("node kill: the killed node", rejoined)
    idem_observe("node kill: what callers saw", "results only (retries absorbed: "
                 + (", ".join(f"{c} x{n}" for c, n in sorted(store.retries.items())) or "none") + ")")
    idem_observe("node kill: cluster", controls.facts())
    effects.drop()
    assert lost == [], f"acknowledged keys lost: {lost[:5]}"
    assert doubled == [], f"keys with more than one effect: {doubled[:5]}"
    assert per_key == {k: 1 for k in all_keys}, "a key has no effect"
    assert not ran_again, f"acknowledged keys ran again on re-send: {ran_again[:5]}"
