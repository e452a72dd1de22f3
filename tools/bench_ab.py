"""Markdown tables of issue 18's before/after runs (tools/bench_ab.sh writes them): python3 tools/bench_ab.py DIR."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ENGINES = {"sqlite": "SQLite", "postgresql-18": "PostgreSQL 18", "postgresql": "PostgreSQL 15", "mariadb": "MariaDB"}


def load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def arrow(before: float | None, after: float | None, fmt: str) -> str:
    def f(v: float | None) -> str:
        return "—" if v is None else format(v, fmt)

    return f"{f(before)} → **{f(after)}**"


def sync_tables(runs: Path) -> None:
    print("| engine | workers | bare req/s | first-time x bare | replay x bare | contention x bare"
          " | CPU µs per first-time / replay | round trips first-time / replay |")
    print("|---|---|---|---|---|---|---|---|")
    targets: list[str] = []
    for name, label in ENGINES.items():
        for workers in (1, 8):
            b, a = load(runs / f"before-{name}-{workers}.json"), load(runs / f"after-{name}-{workers}.json")
            if b is None or a is None:
                continue

            def mode(r: dict[str, Any], m: str, *path: str) -> Any:
                value: Any = r["modes"][m]
                for p in path:
                    value = value[p]
                return value

            ratios = [arrow(mode(b, m, "ratio_to_bare_paired"), mode(a, m, "ratio_to_bare_paired"), ".2f")
                      for m in ("first", "replay", "contention")]
            cpu = " / ".join(arrow(mode(b, m, "cpu_ms_per_request") * 1000, mode(a, m, "cpu_ms_per_request") * 1000,
                                   ",.0f") for m in ("first", "replay"))
            trips = " / ".join(arrow(mode(b, m, "statements", "round_trips"), mode(a, m, "statements", "round_trips"),
                                     "d") for m in ("first", "replay"))
            bare = arrow(mode(b, "bare", "throughput_per_s", "median"), mode(a, "bare", "throughput_per_s", "median"),
                         ",.0f")
            print(f"| {label} | {workers} | {bare} | {' | '.join(ratios)} | {cpu} | {trips} |")
            for t in a["targets"]:
                value = t.get("ratio", t.get("cpu_ms", t.get("growth_per_10k_kib")))
                met = "met" if t["met"] else "**missed**"
                targets.append(f"| {label} | {workers} | {t['target']} | {value} | {met} |")
    print("\n| engine | workers | target (after) | value | met? |\n|---|---|---|---|---|")
    print("\n".join(targets))


def async_table(runs: Path) -> None:
    print("\n| engine | mode | req/s (8 tasks) | x sync store (8 threads) | CPU µs per request | round trips |")
    print("|---|---|---|---|---|---|")
    for name, label in ENGINES.items():
        b, a = load(runs / f"before-{name}-async.json"), load(runs / f"after-{name}-async.json")
        if b is None or a is None:
            continue
        for m in ("first", "replay"):
            def val(r: dict[str, Any], key: str, mode: str = m) -> float:
                return float(r["modes"][mode][key] or 0)

            x = [val(r, "throughput_per_s") / (val(r, "throughput_per_s", f"sync_{m}") or 1) for r in (b, a)]
            print(f"| {label} | {m} | {arrow(val(b, 'throughput_per_s'), val(a, 'throughput_per_s'), ',.0f')}"
                  f" | {arrow(x[0], x[1], '.2f')}"
                  f" | {arrow(val(b, 'cpu_ms_per_request') * 1000, val(a, 'cpu_ms_per_request') * 1000, ',.0f')}"
                  f" | {arrow(val(b, 'round_trips_per_request'), val(a, 'round_trips_per_request'), '.1f')} |")


if __name__ == "__main__":
    directory = Path(sys.argv[1])
    sync_tables(directory)
    async_table(directory)
