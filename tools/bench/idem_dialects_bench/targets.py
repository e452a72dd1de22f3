"""The performance targets, one list: every bench report carries those its run measured (`check`), and BENCHMARKS.md
shows each beside the runs that measure it (tools/benchmarks reads `TARGETS`). A limit is inclusive (<= or >=).

A target names the reports it reads (`apis`: sync, async, http, telemetry, memory), where it applies (backends,
drivers, levels of concurrency: none named means every one) and how its figure is read from one report.

Replays at one worker or task must keep up with the bare effect (>= 1.0x): a replay sends fewer round trips than the
debit it replaces and writes nothing, so where the database's latency sets the pace a slower replay is the library's
own cost. At 8, where the client's CPU sets the pace on a machine whose cores the client and the database share, the
bound is 0.6x.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Report = Mapping[str, Any]
Figure = Callable[[Report], "float | None"]
LEVEL_UNITS = {"sync": "worker", "async": "task", "http": "connection"}


def mode(report: Report | None, name: str) -> Mapping[str, Any] | None:
    found: Mapping[str, Any] | None = None if report is None else report.get("modes", {}).get(name)
    return found


def paired(name: str) -> Figure:
    """A mode's throughput beside the bare effect's, paired per repetition."""
    def figure(report: Report) -> float | None:
        m = mode(report, name)
        return None if m is None else float(m.get("ratio_to_bare_paired", m.get("ratio_to_bare", 0.0)))

    return figure


def rate(report: Report | None, name: str) -> float | None:
    m = mode(report, name)
    if m is None:
        return None
    throughput = m["throughput_per_s"]
    return float(throughput["median"] if isinstance(throughput, Mapping) else throughput)


def rates(num: str, den: str) -> Figure:
    """One mode's throughput against another's (the medians)."""
    def figure(report: Report) -> float | None:
        a, b = rate(report, num), rate(report, den)
        return None if a is None or not b else a / b

    return figure


def cpu_us(report: Report | None, name: str) -> float | None:
    m = mode(report, name)
    return None if m is None or m.get("cpu_ms_per_request") is None else float(m["cpu_ms_per_request"]) * 1000


def cpu(name: str, against: str | None = None) -> Figure:
    """A mode's client CPU per request in µs, or against another mode's."""
    def figure(report: Report) -> float | None:
        value = cpu_us(report, name)
        if against is None or value is None:
            return value
        base = cpu_us(report, against)
        return value / base if base else None

    return figure


def path(name: str, key: str) -> Figure:
    """A figure of one HTTP path."""
    def figure(report: Report) -> float | None:
        found = next((p for p in report.get("paths", []) if p["path"] == name), None)
        return None if found is None or found.get(key) is None else float(found[key])

    return figure


def tail(report: Report) -> float | None:
    replay = next((p for p in report.get("paths", []) if p["path"] == "middleware replay"), None)
    return replay["latency_ms"]["p99"] / replay["latency_ms"]["p50"] if replay and replay["latency_ms"]["p50"] else None


def tail_shown(report: Report) -> str:
    replay = next(p for p in report["paths"] if p["path"] == "middleware replay")
    p99, p50 = replay["latency_ms"]["p99"], replay["latency_ms"]["p50"]
    return f"{p99 / p50:.2f}× ({p99:.2f} / {p50:.2f} ms)"


def full_collections(name: str) -> Figure:
    """Full (generation 2) garbage collections per 1,000 requests of one HTTP path: each pauses every request in
    flight."""
    def figure(report: Report) -> float | None:
        found = next((p for p in report.get("paths", []) if p["path"] == name), None)
        per = None if found is None else found.get("collections_per_1000")
        return None if per is None else float(per["gen2"])

    return figure


def full_collections_shown(name: str) -> Callable[[Report], str]:
    def shown(report: Report) -> str:
        found = next(p for p in report["paths"] if p["path"] == name)
        return (f"{found['collections_per_1000']['gen2']:.2f} ({found['collections']['gen2']} in"
                f" {found['requests']:,} requests, {found['full_collections_ms']:,.0f} ms)")

    return shown


def sleep_figure(key: str) -> Figure:
    def figure(report: Report) -> float | None:
        found = report.get("sleep_figure", {}).get("sleep_async")
        return None if found is None else float(found[key])

    return figure


def against_sync(name: str) -> Figure:
    """The async store's throughput against the sync store's on as many threads as it has tasks."""
    return rates(name, f"sync_{name}")


def overhead(condition: str, key: str) -> Figure:
    def figure(report: Report) -> float | None:
        found = report.get("overhead", {}).get(condition, {}).get(key)
        return None if found is None else float(found)

    return figure


def sdk_beside_instrumentation(report: Report) -> float | None:
    sdk, sqla = overhead("sdk", "cpu_us")(report), overhead("sqlalchemy", "cpu_us")(report)
    return None if sdk is None or sqla is None else sdk - sqla


def sdk_shown(report: Report) -> str:
    over = report["overhead"]
    return f"{over['sdk']['cpu_us']:+.1f} µs against {over['sqlalchemy']['cpu_us']:+.1f} µs"


def memory_growth(report: Report) -> float | None:
    check = (report.get("memory") or {}).get("check") or {}
    return None if check.get("growth_per_10k_kib") is None else float(check["growth_per_10k_kib"])


def number(value: float, unit: str = "") -> str:
    if unit == "×":
        return f"{value:.2f}×"
    if unit == "%":
        return f"{value:+.1f} %"
    if unit in ("µs", "ms"):
        return f"{value:,.0f} {unit}"
    if unit == " KiB":
        return f"{value:.2f} KiB"
    return f"{value:,.3g}"


@dataclass(frozen=True)
class Target:
    name: str
    apis: tuple[str, ...]  # the reports it reads
    figure: Figure
    limit: float
    at_most: bool  # True: figure <= limit; False: figure >= limit
    unit: str = ""  # "µs", "ms", "×", "%", " KiB"
    backends: tuple[str, ...] = ()
    drivers: tuple[str, ...] = ()
    levels: tuple[int, ...] = ()  # workers, tasks or connections
    shown: Callable[[Report], str] | None = None  # the figure as text, where the number alone says too little
    bound_text: str = ""  # the bound as the page shows it, where `limit` alone says too little

    def applies(self, api: str, backend: str, driver: str | None, level: int | None) -> bool:
        return (api in self.apis and (not self.backends or backend in self.backends)
                and (not self.drivers or driver in self.drivers)
                and (not self.levels or level is None or level in self.levels))

    def bound(self) -> str:
        return self.bound_text or ("≤ " if self.at_most else "≥ ") + number(self.limit, self.unit)

    def met(self, measured: float) -> bool:
        return measured <= self.limit if self.at_most else measured >= self.limit

    def text(self, report: Report, measured: float) -> str:
        """The measured figure as the reports and the page show it."""
        return self.shown(report) if self.shown else number(measured, self.unit)


TARGETS: tuple[Target, ...] = (
    # the sync store
    Target("first-time requests × the bare effect", ("sync",), paired("first"), 0.6, False, "×", levels=(1,)),
    Target("replays × the bare effect", ("sync", "async"), paired("replay"), 1.0, False, "×", levels=(1,)),
    Target("replays × the bare effect", ("sync", "async"), paired("replay"), 0.6, False, "×", levels=(8,)),
    Target("first-time requests × the same debit as one PL/pgSQL function", ("sync",),
           rates("first", "plpgsql_first"), 0.5, False, "×", backends=("postgresql",), levels=(1,)),
    Target("replays × the same debit as one PL/pgSQL function", ("sync",), rates("replay", "plpgsql_replay"), 0.5,
           False, "×", backends=("postgresql",), levels=(1,)),
    Target("client CPU per replay", ("sync",), cpu("replay"), 700, True, "µs", backends=("postgresql",), levels=(1,)),
    # the async store
    Target("client CPU per replay", ("async",), cpu("replay"), 250, True, "µs", backends=("postgresql",),
           drivers=("asyncpg", "psycopg"), levels=(8,)),
    Target("client CPU per first-time request", ("async",), cpu("first"), 450, True, "µs", backends=("postgresql",),
           drivers=("asyncpg", "psycopg"), levels=(8,)),
    Target("replays × the bare effect", ("async",), paired("replay"), 0.9, False, "×", backends=("postgresql",),
           drivers=("asyncpg", "psycopg"), levels=(32,)),
    Target("client CPU per first-time request × the bare async debit's", ("async",), cpu("first", "bare"), 1.3, True,
           "×", backends=("sqlite",)),
    Target("async replays × sync replays (as many tasks as threads)", ("async",), against_sync("replay"), 1.0, False,
           "×"),
    Target("async first-time requests × sync ones (as many tasks as threads)", ("async",), against_sync("first"), 1.0,
           False, "×"),
    Target("requests sent at once, each awaiting an external call: wall time × the call's", ("async",),
           sleep_figure("x_effect_time"), 2.0, True, "×"),
    Target("event-loop lag beside them (a 10 ms heartbeat's worst delay)", ("async",),
           sleep_figure("heartbeat_worst_lag_ms"), 50, True, "ms"),
    # HTTP
    Target("server CPU per first-time request × the bare endpoint's", ("http",),
           path("middleware first-time", "cpu_ratio_to_bare"), 1.5, True, "×"),
    Target("server CPU per replay × the bare endpoint's", ("http",), path("middleware replay", "cpu_ratio_to_bare"),
           1.0, True, "×"),
    Target("replay p99 ÷ its p50", ("http",), tail, 2.5, True, "×", levels=(16,), shown=tail_shown),
    Target("full garbage collections per 1,000 first-time requests", ("http",),
           full_collections("middleware first-time"), 2.0, True, shown=full_collections_shown("middleware first-time")),
    Target("full garbage collections per 1,000 replays", ("http",), full_collections("middleware replay"), 2.0, True,
           shown=full_collections_shown("middleware replay")),
    Target("concurrent external calls through the middleware: wall time × the handler's", ("http",),
           path("middleware (external call)", "x_handler"), 2.0, True, "×"),
    # telemetry
    Target("telemetry, API without an SDK: client CPU per replay", ("telemetry",), overhead("api", "cpu_pct"), 2.0,
           True, "%"),
    Target("telemetry, SDK: client CPU per replay, against what OpenTelemetry's SQLAlchemy instrumentation adds to the"
           " same replays", ("telemetry",), sdk_beside_instrumentation, 0.0, True, "µs", shown=sdk_shown,
           bound_text="≤ the instrumentation's"),
    Target("telemetry, a span the sampler drops: client CPU per replay", ("telemetry",), overhead("dropped", "cpu_pct"),
           1.0, True, "%"),
    # memory (a sync run with --memory-check)
    Target("memory growth per 10,000 requests", ("memory",), memory_growth, 8.0, True, " KiB"),
)


def api_of(report: Report) -> str:
    """The API a single-engine report measured: its schema's (a sync one is `sync`)."""
    kind = str(report["schema"]).removeprefix("idem-dialects-bench").lstrip("-").split("/")[0]
    return kind or "sync"


def level_of(report: Report) -> int | None:
    config = report.get("config", {})
    level = config.get("workers") or config.get("concurrency")
    return None if level is None else int(level)


def where(api: str, label: str, driver: str | None, level: int | None) -> str:
    """Where a target was measured, as the reports and the page say it."""
    store = {"sync": "sync store", "memory": "sync store", "async": "async store", "http": "HTTP",
             "telemetry": "replays, sync store"}[api]
    via = f" via {driver}" if api == "async" and driver else ""
    at = ""
    if level is not None and api in LEVEL_UNITS:
        at = f", {level} {LEVEL_UNITS[api]}{'s' * (level != 1)}"
    return f"{store}, {label}{via}{at}"


def check(report: Report) -> list[dict[str, Any]]:
    """The targets one report's run measured: each with its figure, its bound and whether it was met."""
    engine = report["engine"]
    api, level = api_of(report), level_of(report)
    apis = [api, *(["memory"] if memory_growth(report) is not None else [])]
    label = f"{engine.get('name') or engine['backend']} {engine.get('server_version') or ''}".strip()
    found = []
    for kind in apis:
        for target in TARGETS:
            if not target.applies(kind, engine["backend"], engine.get("driver"), level):
                continue
            measured = target.figure(report)
            if measured is not None:
                found.append({"target": target.name, "where": where(kind, label, engine.get("driver"), level),
                              "value": round(measured, 3), "shown": target.text(report, measured),
                              "bound": target.bound(), "met": target.met(measured)})
    return found
