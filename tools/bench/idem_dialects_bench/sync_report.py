"""The sync store benchmark's JSON report (schema idem-dialects-bench/2, BENCHMARKS.md), with the targets it
measured (`targets`)."""

from __future__ import annotations

import statistics
from typing import Any

from .plan import ACCOUNT_BASE
from .report import machine_info, peak_rss_mib, percentiles
from .targets import check
from .wire import about, figures

# /2: round trips counted on the wire (`round_trips_per_request`, `wire`, `added_latency`), not modelled from the
# statements (/1's `statements.round_trips`, `statements.pool_resets`, `implicit_begin`).
SCHEMA = "idem-dialects-bench/2"
BARE_EFFECT = ("UPDATE account SET balance = balance - 1 WHERE id = ? ; SELECT balance"
               " -- one transaction begun by store.transaction(), no idempotency")


def build_report(bench: Any, engine_info: dict[str, Any], elapsed: float) -> dict[str, Any]:
    """The report of a finished `sync.Bench` run (typed loosely: that module calls this one)."""
    medians = {m: statistics.median(st.throughputs) for m, st in bench.stats.items() if st.throughputs}
    bare = bench.stats["bare"].throughputs
    cfg = bench.cfg
    modes: dict[str, Any] = {}
    for m, st in bench.stats.items():
        if not st.throughputs:
            continue
        paired = [t / b for t, b in zip(st.throughputs, bare, strict=False)]
        log, wire = st.statements, st.wire
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
                "count": len(log.statements), "kinds": log.kinds, "commits": log.commits},
            **(figures(wire.wire, wire.latencies, wire.seconds, cfg.added_latency_ms, medians[m]) if wire
               else figures(None)),
        }
    total_debits = sum(v for k, v in bench.expected_debits.items() if k >= ACCOUNT_BASE["first"])
    total_keys = sum(v for k, v in bench.expected_keys.items())
    report = {
        "schema": SCHEMA,
        "engine": engine_info,
        "machine": machine_info(),
        "config": {"workers": cfg.workers, "requests": cfg.requests, "duplicates": cfg.duplicates,
                   "repetitions": cfg.repetitions, "warmup": cfg.warmup, "memory_check": cfg.memory_check,
                   "added_latency_ms": cfg.added_latency_ms},
        "bare_effect": BARE_EFFECT,
        "wire": about(bench.no_wire, cfg.added_latency_ms),
        "modes": modes,
        "exactly_once": {"verified": True, "checks": bench.checks, "effects": total_debits,
                         "distinct_keys": total_keys},
        "memory": {"peak_rss_mib": round(peak_rss_mib(), 1), "check": bench.memory},
        "elapsed_s": round(elapsed, 2),
    }
    return report | {"targets": check(report)}
