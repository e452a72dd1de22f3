"""The sync store benchmark's JSON report (schema idem-dialects-bench/1, BENCHMARKS.md) and its targets."""

from __future__ import annotations

import statistics
from typing import Any

from ...engines.entry import provisioning
from .plan import ACCOUNT_BASE
from .report import machine_info, peak_rss_mib, percentiles
from .statements import implicit_begin, reset_reaches_server

SCHEMA = "idem-dialects-bench/1"
# What `run` should cost beside the bare effect, per worker count: (name, numerator mode, denominator mode, minimum
# ratio). With several workers the client threads and the server share the machine's cores, hence the lower bar.
RATIO_TARGETS: dict[bool, tuple[tuple[str, str, str, float], ...]] = {
    True: (("first-time via run >= 0.6x bare (1 worker)", "first", "bare", 0.6),
           ("replay via run >= 1.0x bare (1 worker)", "replay", "bare", 1.0)),
    False: (("replay via run >= 0.8x bare (several workers)", "replay", "bare", 0.8),),
}
PLPGSQL_TARGETS = (  # the stored function is the fastest path PostgreSQL has: run stays within 2x of it
    ("first-time via run within 2x of PL/pgSQL debit_once", "first", "plpgsql_first", 0.5),
    ("replay via run within 2x of PL/pgSQL debit_once replay", "replay", "plpgsql_replay", 0.5),
)
BARE_EFFECT = ("UPDATE account SET balance = balance - 1 WHERE id = ? ; SELECT balance"
               " -- one transaction begun by store.transaction(), no idempotency")


def build_report(bench: Any, engine_info: dict[str, Any], elapsed: float) -> dict[str, Any]:
    """The report of a finished `sync.Bench` run (typed loosely: that module calls this one)."""
    medians = {m: statistics.median(st.throughputs) for m, st in bench.stats.items() if st.throughputs}
    bare = bench.stats["bare"].throughputs
    extra_begin = 1 if implicit_begin(bench.store.engine) else 0
    wire_reset = reset_reaches_server(bench.store.engine)
    modes: dict[str, Any] = {}
    for m, st in bench.stats.items():
        if not st.throughputs:
            continue
        paired = [t / b for t, b in zip(st.throughputs, bare, strict=False)]
        log = st.statements
        modes[m] = {
            "requests": st.requests,
            "throughput_per_s": {"median": round(medians[m], 1),
                                 "per_repetition": [round(t, 1) for t in st.throughputs]},
            "ratio_to_bare": round(medians[m] / medians["bare"], 3),
            "ratio_to_bare_paired": round(statistics.median(paired), 3),
            "latency_ms": percentiles(st.latencies),
            # CPU time of this whole process (client, driver, and SQLite itself when embedded) per request.
            "cpu_ms_per_request": round(st.cpu_seconds * 1000 / st.requests, 4) if st.requests else None,
            "outcomes": dict(sorted(st.outcomes.items())),
            "retries": dict(sorted(st.retries.items())),
            "statements": None if log is None else {
                "count": len(log.statements), "kinds": log.kinds, "commits": log.commits,
                "pool_resets": log.resets,
                "round_trips": len(log.statements) + log.commits + extra_begin + (log.resets if wire_reset else 0)},
        }
    single = bench.cfg.workers == 1
    targets = []
    for name, num, den, minimum in (*RATIO_TARGETS[single], *PLPGSQL_TARGETS):
        if num in medians and den in medians:
            ratio = medians[num] / medians[den]
            targets.append({"target": name, "ratio": round(ratio, 3), "minimum": minimum, "met": ratio >= minimum})
    replay_cpu = modes.get("replay", {}).get("cpu_ms_per_request")
    limit = provisioning(bench.store.backend.name).replay_cpu_target_ms  # set where a CPU target was measured
    if single and limit is not None and replay_cpu is not None:
        targets.append({"target": f"client CPU per replay <= {limit} ms ({engine_info['backend']}, 1 worker)",
                        "cpu_ms": replay_cpu, "maximum": limit, "met": replay_cpu <= limit})
    if bench.memory is not None:
        targets.append({"target": "memory flat (growth < 8 KiB per 10k requests)",
                        "growth_per_10k_kib": bench.memory["growth_per_10k_kib"], "met": bench.memory["flat"]})
    total_debits = sum(v for k, v in bench.expected_debits.items() if k >= ACCOUNT_BASE["first"])
    total_keys = sum(v for k, v in bench.expected_keys.items())
    cfg = bench.cfg
    return {
        "schema": SCHEMA,
        "engine": engine_info,
        "machine": machine_info(),
        "config": {"workers": cfg.workers, "requests": cfg.requests, "duplicates": cfg.duplicates,
                   "repetitions": cfg.repetitions, "warmup": cfg.warmup, "memory_check": cfg.memory_check},
        "bare_effect": BARE_EFFECT,
        "implicit_begin": implicit_begin(bench.store.engine),
        "modes": modes,
        "exactly_once": {"verified": True, "checks": bench.checks, "effects": total_debits,
                         "distinct_keys": total_keys},
        "targets": targets,
        "memory": {"peak_rss_mib": round(peak_rss_mib(), 1), "check": bench.memory},
        "elapsed_s": round(elapsed, 2),
    }
