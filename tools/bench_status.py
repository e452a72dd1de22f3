"""The performance issue's targets beside what `tools/bench_status.sh` measured: one line per target, met or MISSED.

    python3 tools/bench_status.py /tmp/bench-status [--markdown]
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

Row = tuple[str, str, float, float, bool]  # (target, where, measured, limit, met)


def runs(path: Path) -> Iterator[dict[str, Any]]:
    if path.exists():
        report = json.loads(path.read_text())
        yield from report.get("runs", [report])


def level(run: dict[str, Any]) -> int:
    config = run["config"]
    return int(config.get("workers") or config.get("concurrency"))


def at_least(target: str, where: str, value: float, limit: float) -> Row:
    return target, where, value, limit, value >= limit


def at_most(target: str, where: str, value: float, limit: float) -> Row:
    return target, where, value, limit, value <= limit


def rows(out: Path) -> Iterator[Row]:
    for run in runs(out / "sync.json"):
        backend, n, modes = run["engine"]["backend"], level(run), run["modes"]
        where = f"{run['engine'].get('name', backend)}, sync, {n} worker(s)"
        if backend == "postgresql" and n == 1:
            yield at_least("first-time >= 0.6x bare (1 worker)", where, modes["first"]["ratio_to_bare"], 0.6)
        if backend in ("mysql", "mariadb") and n in (1, 8):
            yield at_least(f"replay >= {0.8 if n == 1 else 0.6}x bare", where, modes["replay"]["ratio_to_bare"],
                           0.8 if n == 1 else 0.6)
    for name in ("async-postgresql-asyncpg", "async-postgresql-psycopg", "async-others"):
        for run in runs(out / f"{name}.json"):
            backend, n, modes = run["engine"]["backend"], level(run), run["modes"]
            where = f"{run['engine'].get('name', backend)} via {run['engine']['driver']}, async, {n} task(s)"
            if backend == "postgresql" and n == 8:
                yield at_most("client CPU per replay <= 250 us", where, modes["replay"]["cpu_ms_per_request"] * 1000,
                              250)
                yield at_most("client CPU per first-time <= 450 us", where,
                              modes["first"]["cpu_ms_per_request"] * 1000, 450)
            if backend == "postgresql" and n == 32:
                yield at_least("replay >= 0.9x the bare async effect", where, modes["replay"]["ratio_to_bare"], 0.9)
            if backend in ("mysql", "mariadb") and n in (1, 8):
                yield at_least(f"replay >= {0.8 if n == 1 else 0.6}x bare", where, modes["replay"]["ratio_to_bare"],
                               0.8 if n == 1 else 0.6)
            if backend == "sqlite":
                yield at_most("client CPU per first-time <= 800 us", where,
                              modes["first"]["cpu_ms_per_request"] * 1000, 800)
    for run in runs(out / "http.json"):
        paths = {p["path"]: p for p in run["paths"]}
        where = f"{run['engine'].get('name')}, HTTP, {level(run)} connection(s)"
        yield at_most("server CPU per first-time <= 1.6x bare endpoint", where,
                      paths["middleware first-time"]["cpu_ratio_to_bare"], 1.6)
        yield at_most("server CPU per replay <= 1.0x bare endpoint", where,
                      paths["middleware replay"]["cpu_ratio_to_bare"], 1.0)
    for run in runs(out / "memory.json"):
        check = run["memory"]["check"]
        yield at_most("memory growth per 10k requests < 8 KiB", f"{run['engine'].get('name')}, 100,000 requests",
                      check["growth_per_10k_kib"], 8)


def main(argv: list[str]) -> int:
    out, markdown = Path(argv[1]), "--markdown" in argv
    found = list(rows(out))
    if markdown:
        print("| target | where | measured | limit | |\n|---|---|---|---|---|")
    for target, where, value, limit, met in found:
        mark = "met" if met else "MISSED"
        if markdown:
            print(f"| {target} | {where} | {value:.3g} | {limit:g} | {mark} |")
        else:
            print(f"{mark:<6}  {target:<48} {where:<44} {value:>8.3g}  (limit {limit:g})")
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
