"""What every benchmark's report shares: the machine and engine it ran on, latency percentiles, and the set that
holds several engines' reports of one invocation (BENCHMARKS.md documents the schemas)."""

from __future__ import annotations

import os
import platform
import resource
import secrets
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import URL, Dialect

from idem_dialects import __version__

SET_SCHEMA = "idem-dialects-bench-set/1"  # several engines measured in one invocation


def combine(reports: Sequence[dict[str, Any]], skipped: dict[str, str]) -> dict[str, Any]:
    """Several engines' reports of one invocation, side by side; `skipped` names engines that could not be had."""
    return {"schema": SET_SCHEMA, "machine": machine_info(), "runs": list(reports), "skipped": skipped}


def percentiles(latencies: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99/max in milliseconds (statistics.quantiles, inclusive method)."""
    if not latencies:
        return {"p50": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0}
    data = list(latencies) if len(latencies) > 1 else [latencies[0], latencies[0]]
    cuts = statistics.quantiles(data, n=100, method="inclusive")

    def ms(value: float) -> float:
        return round(value * 1000, 3)

    return {"p50": ms(cuts[49]), "p95": ms(cuts[94]), "p99": ms(cuts[98]), "max": ms(max(data))}


def peak_rss_mib() -> float:
    """The process's peak resident set size (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on: they mean little without it."""
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "idem_dialects": __version__,
    }


def engine_info(url: URL, dialect: Dialect, backend: str, version: tuple[Any, ...] | None) -> dict[str, Any]:
    """The database measured; `version` is the dialect's server_version_info once connected (SQLite's library
    version for SQLite)."""
    return {
        "url": url.render_as_string(hide_password=True),
        "backend": backend,
        "dialect": dialect.name,
        "driver": dialect.driver,
        "server_version": ".".join(str(p) for p in version) if version else None,
        "python": sys.version.split()[0],
    }


def new_prefix() -> str:
    return f"bench_{secrets.token_hex(3)}_"
