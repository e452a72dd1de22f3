"""The sync store benchmark's JSON report (schema idem-dialects-bench/1, BENCHMARKS.md), with the targets it
measured (`targets`)."""

from __future__ import annotations

import statistics
from typing import Any

from .plan import ACCOUNT_BASE
from .report import machine_info, peak_rss_mib, percentiles
from .statements import implicit_begin, reset_reaches_server
from .targets import check

SCHEMA = "idem-dialects-bench/1"
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
    total_debits = sum(v for k, v in bench.expected_debits.items() if k >= ACCOUNT_BASE["first"])
    total_keys = sum(v for k, v in bench.expected_keys.items())
    cfg = bench.cfg
    report = {
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
        "memory": {"peak_rss_mib": round(peak_rss_mib(), 1), "check": bench.memory},
        "elapsed_s": round(elapsed, 2),
    }
    return report | {"targets": check(report)}
