"""The performance targets, each beside what the reports measured: met, missed, or not measured (and why).

One function per target; `targets(reports)` lists them in the page's order. A limit is inclusive (`<=` or `>=`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .compare import pairs
from .plan import AB_LEVELS, AB_PAIRS, HTTP_ENGINE, LEVELS, MEMORY_ENGINES, SYNC_ENGINES, TELEMETRY_ENGINE, ab_id
from .reports import Report, Reports


@dataclass(frozen=True)
class Target:
    target: str
    where: str
    measured: float | None  # None: not measured (`why` says why)
    limit: float
    at_most: bool  # True: measured <= limit; False: measured >= limit
    unit: str = ""  # "µs", "×", "%", " KiB"
    why: str = ""
    shown: str = ""  # the measured value as the page shows it, when a number alone would not say enough
    bound_text: str = ""  # the bound as the page shows it, likewise

    @property
    def met(self) -> bool | None:
        if self.measured is None:
            return None
        return self.measured <= self.limit if self.at_most else self.measured >= self.limit

    @property
    def verdict(self) -> str:
        return {True: "met", False: "**missed**", None: "not measured"}[self.met]

    def value(self) -> str:
        if self.measured is None:
            return f"— ({self.why})" if self.why else "—"
        return self.shown or number(self.measured, self.unit)

    def bound(self) -> str:
        return self.bound_text or ("≤ " if self.at_most else "≥ ") + number(self.limit, self.unit)


def number(value: float, unit: str = "") -> str:
    if unit == "×":
        return f"{value:.2f}×"
    if unit == "%":
        return f"{value:+.1f} %"
    if unit == "µs":
        return f"{value:,.0f} µs"
    if unit == " KiB":
        return f"{value:.2f} KiB"
    return f"{value:,.3g}"


def mode(report: Report | None, name: str) -> dict[str, float] | None:
    if report is None:
        return None
    found: dict[str, float] | None = report.get("modes", {}).get(name)
    return found


def paired(report: Report | None, name: str) -> float | None:
    m = mode(report, name)
    if m is None:
        return None
    return float(m.get("ratio_to_bare_paired", m.get("ratio_to_bare", 0.0)))


def cpu_us(report: Report | None, name: str) -> float | None:
    m = mode(report, name)
    return None if m is None or m.get("cpu_ms_per_request") is None else float(m["cpu_ms_per_request"]) * 1000


def async_store(reports: Reports) -> Iterator[Target]:
    for driver in ("asyncpg", "psycopg"):
        where = f"async store, {reports.label('postgresql')} via {driver}"
        run_id = f"async-postgresql-{driver}"
        at8, at32 = reports.aio("postgresql", driver, 8), reports.aio("postgresql", driver, 32)
        why8, why32 = reports.missing(run_id), reports.missing(run_id)
        yield Target("client CPU per replay", f"{where}, 8 tasks", cpu_us(at8, "replay"), 250, True, "µs", why8)
        yield Target("client CPU per first-time request", f"{where}, 8 tasks", cpu_us(at8, "first"), 450, True, "µs",
                     why8)
        yield Target("replays × the bare async effect", f"{where}, 32 tasks", paired(at32, "replay"), 0.9, False, "×",
                     why32)


def before_after(reports: Reports) -> Iterator[Target]:
    found: dict[tuple[str, str, str], list[tuple[str, float]]] = {}
    for pair in pairs(reports):
        for metric in ("first-time client CPU µs", "replay client CPU µs"):
            ratio = pair.ratio(metric)
            if ratio is not None:
                what = "first-time" if metric.startswith("first") else "replay"
                unit = "worker" if pair.api == "sync" else "task"
                found.setdefault((pair.api, pair.engine, pair.driver), []).append(
                    (f"{what}, {pair.level} {unit}{'s' if pair.level > 1 else ''}", ratio))
    levels = " and ".join(str(n) for n in AB_LEVELS)
    for api, engine, driver in AB_PAIRS:
        where = f"{api} store, {reports.label(engine)} via {driver}, {levels} {'workers' if api == 'sync' else 'tasks'}"
        ratios = found.get((api, engine, driver))
        if not ratios:
            rounds = reports.ab_rounds()
            why = reports.missing(ab_id("before", rounds[0], api, engine, driver, AB_LEVELS[0]) if rounds else "",
                                  "ab")
            yield Target("client CPU per request after ÷ before", where, None, 1.0, True, "×", why)
            continue
        worst_at, worst = max(ratios, key=lambda r: r[1])
        yield Target("client CPU per request after ÷ before", where, worst, 1.0, True, "×",
                     shown=f"{worst:.2f}× (highest: {worst_at})")


def mariadb_replays(reports: Reports) -> Iterator[Target]:
    for level, limit in ((1, 0.8), (8, 0.6)):
        unit = "worker" if level == 1 else "workers"
        yield Target("replays × the bare effect", f"sync store, {reports.label('mariadb')}, {level} {unit}",
                     paired(reports.sync("mariadb", level), "replay"), limit, False, "×",
                     reports.missing("sync-mariadb"))
    for level, limit in ((1, 0.8), (8, 0.6)):
        unit = "task" if level == 1 else "tasks"
        where = f"async store, {reports.label('mariadb')} via asyncmy, {level} {unit}"
        yield Target("replays × the bare effect", where, paired(reports.aio("mariadb", "asyncmy", level), "replay"),
                     limit, False, "×", reports.missing("async-mariadb-asyncmy"))


def postgresql_first(reports: Reports) -> Iterator[Target]:
    for engine in ("postgresql", "postgresql-18"):
        yield Target("first-time requests × the bare effect", f"sync store, {reports.label(engine)}, 1 worker",
                     paired(reports.sync(engine, 1), "first"), 0.6, False, "×", reports.missing(f"sync-{engine}"))


def sqlite_async(reports: Reports) -> Iterator[Target]:
    for level in LEVELS:
        report = reports.aio("sqlite", "aiosqlite", level)
        first, bare = cpu_us(report, "first"), cpu_us(report, "bare")
        ratio = first / bare if first is not None and bare else None
        unit = "task" if level == 1 else "tasks"
        yield Target("client CPU per first-time request × the bare async debit's",
                     f"async store, {reports.label('sqlite')} via aiosqlite, {level} {unit}", ratio, 1.3, True, "×",
                     reports.missing("async-sqlite-aiosqlite"),
                     shown="" if ratio is None else f"{ratio:.2f}× ({first:,.0f} against {bare:,.0f} µs)")


def http(reports: Reports) -> Iterator[Target]:
    entry = reports.entry(f"http-{HTTP_ENGINE}")
    levels = entry["levels"] if entry else [1, 8, 16, 32]
    why = reports.missing(f"http-{HTTP_ENGINE}")
    for level in levels:
        report = reports.http(HTTP_ENGINE, level)
        paths = {p["path"]: p for p in report["paths"]} if report else {}
        where = f"HTTP, {reports.label(HTTP_ENGINE)}, {level} connection{'s' if level > 1 else ''}"
        for path, what, limit in (("middleware first-time", "first-time request", 1.6),
                                  ("middleware replay", "replay", 1.0)):
            value = paths.get(path, {}).get("cpu_ratio_to_bare")
            yield Target(f"server CPU per {what} × the bare endpoint's", where, value, limit, True, "×", why)
        if level == 16:
            replay = paths.get("middleware replay")
            tail = replay["latency_ms"]["p99"] / replay["latency_ms"]["p50"] if replay else None
            yield Target("replay p99 ÷ its p50", where, tail, 2.5, True, "×", why,
                         shown="" if replay is None or tail is None else
                         f"{tail:.2f}× ({replay['latency_ms']['p99']:.2f} / {replay['latency_ms']['p50']:.2f} ms)")


def telemetry(reports: Reports) -> Iterator[Target]:
    report = reports.telemetry(TELEMETRY_ENGINE)
    over = report["overhead"] if report else {}
    why = reports.missing(f"telemetry-{TELEMETRY_ENGINE}")
    where = f"replays, sync store, {reports.label(TELEMETRY_ENGINE)}"
    api = over.get("api", {}).get("cpu_pct")
    yield Target("telemetry, API without an SDK: client CPU per replay", where, api, 2.0, True, "%", why)
    sdk, sqla = over.get("sdk", {}).get("cpu_us"), over.get("sqlalchemy", {}).get("cpu_us")
    if report and "sqlalchemy" in report.get("not_measured", {}):
        why = f"not measured ({report['not_measured']['sqlalchemy']})"
    yield Target("telemetry, SDK: client CPU per replay, against what OpenTelemetry's SQLAlchemy instrumentation"
                 " adds to the same replays", where, None if sdk is None or sqla is None else sdk - sqla, 0.0, True,
                 "µs", why, shown="" if sdk is None or sqla is None else f"{sdk:+.1f} µs against {sqla:+.1f} µs",
                 bound_text="≤ the instrumentation's")
    dropped = over.get("dropped", {}).get("cpu_pct")
    yield Target("telemetry, a span the sampler drops: client CPU per replay", where, dropped, 1.0, True, "%",
                 reports.missing(f"telemetry-{TELEMETRY_ENGINE}"))


def memory(reports: Reports) -> Iterator[Target]:
    for engine in MEMORY_ENGINES:
        report = reports.memory(engine)
        check = (report or {}).get("memory", {}).get("check") or {}
        growth = check.get("growth_per_10k_kib")
        yield Target("memory growth per 10,000 requests", f"sync store, {reports.label(engine)}, "
                     f"{check.get('requests', 100_000):,} requests", growth, 8.0, True, " KiB",
                     reports.missing(f"memory-{engine}", "memory"))


def conformance(reports: Reports) -> Iterator[Target]:
    report = reports.conformance()
    summary = (report or {}).get("summary", {})
    failed = summary.get("failed")
    which = [f"{check['id']} on {engine}" for check in (report or {}).get("checks", [])
             for engine, result in check["results"].items() if result["outcome"] == "failed"]
    engines = ", ".join(reports.label(e) for e in SYNC_ENGINES)
    yield Target("conformance checks failed", f"sync and async stores, {engines}", failed, 0, True, "",
                 reports.missing("conformance", "conformance"),
                 shown="" if failed is None else
                 f"{failed} ({summary.get('passed', 0)} passed, {summary.get('skipped', 0)} skipped)"
                 + "".join(f"; {w}" for w in which))


def exactly_once(reports: Reports) -> Iterator[Target]:
    runs = [e for e in reports.manifest["runs"].values() if e["status"] in ("ok", "failed")
            and e["kind"] != "conformance"]
    violated = sum(bool(e.get("violated")) for e in runs)  # each bench checks it in the database and exits 1
    yield Target("runs that found an effect applied twice or not at all", f"every bench run above ({len(runs)})",
                 violated if runs else None, 0, True, "", "no run", shown=f"{violated}")


SOURCES = (async_store, before_after, mariadb_replays, postgresql_first, sqlite_async, http, telemetry, memory,
           conformance, exactly_once)


def targets(reports: Reports) -> list[Target]:
    return [target for source in SOURCES for target in source(reports)]


__all__ = ["SOURCES", "SYNC_ENGINES", "Target", "targets"]
