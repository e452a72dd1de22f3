"""The performance targets beside what the reports measured: met, missed, or not measured (and why).

The targets are the harness's one list (`idem_dialects_bench.targets.TARGETS`, the same every bench report checks
itself against), each shown beside every run of the plan it applies to: one row per level it names, or, for a target
of every level, one row with the worst level's figure. Three more read the whole output directory: the before/after
comparison, the conformance run and the runs' exactly-once checks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from idem_dialects_bench.targets import LEVEL_UNITS, TARGETS, Target, number, where

from idem_dialects.engines import get

from .compare import pairs
from .plan import AB_LEVELS, AB_PAIRS, SYNC_ENGINES, Run, Sizes, ab_id, main_runs
from .reports import Report, Reports


@dataclass(frozen=True)
class Result:
    name: str
    where: str
    measured: float | None  # None: not measured (`why` says why)
    limit: float
    at_most: bool  # True: measured <= limit; False: measured >= limit
    unit: str = ""
    why: str = ""
    shown: str = ""  # the measured value as the page shows it, when a number alone would not say enough
    bound_text: str = ""

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


def result(target: Target, at: str, report: Report | None, why: str, shown: str = "") -> Result:
    measured = None if report is None else target.figure(report)
    text = shown or ("" if report is None or measured is None else target.text(report, measured))
    return Result(target.name, at, measured, target.limit, target.at_most, target.unit, why, text, target.bound())


def measured_by(target: Target, run: Run, reports: Reports) -> Iterator[Result]:
    """The target beside one run of the plan: a row per level it names, or its worst level's."""
    api, label = ("memory" if run.kind == "memory" else run.kind), reports.label(run.engines[0])
    driver = run.driver if api == "async" else None
    why = reports.missing(run.id, run.kind)
    if not run.levels:
        yield result(target, where(api, label, driver, None), reports.at(run.id, None), why)
        return
    if target.levels:
        for level in (n for n in run.levels if n in target.levels):
            yield result(target, where(api, label, driver, level), reports.at(run.id, level), why)
        return
    found = [(level, report, target.figure(report)) for level in run.levels
             if (report := reports.at(run.id, level)) is not None]
    figures = [(level, report, value) for level, report, value in found if value is not None]
    levels = ", ".join(str(n) for n in run.levels[:-1]) + f" and {run.levels[-1]} {LEVEL_UNITS[api]}s"
    at = where(api, label, driver, None) + f", {levels}"
    if not figures:
        yield result(target, at, None, why)
        return
    level, report, value = (max if target.at_most else min)(figures, key=lambda f: f[2])
    unit = LEVEL_UNITS[api] + ("s" if level != 1 else "")
    yield result(target, at, report, why, shown=f"{target.text(report, value)} (worst: {level} {unit})")


def per_report(reports: Reports) -> Iterator[Result]:
    runs = main_runs(Sizes(), memory=True)  # every run the page may quote (sizes do not change which)
    for target in TARGETS:
        for run in runs:
            api = "memory" if run.kind == "memory" else run.kind
            backend = get(run.engines[0]).backend
            if any(target.applies(api, backend, run.driver, level) for level in (run.levels or (None,))):
                yield from measured_by(target, run, reports)


def before_after(reports: Reports) -> Iterator[Result]:
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
    name = "client CPU per request after ÷ before"
    for api, engine, driver in AB_PAIRS:
        at = f"{api} store, {reports.label(engine)} via {driver}, {levels} {'workers' if api == 'sync' else 'tasks'}"
        ratios = found.get((api, engine, driver))
        if not ratios:
            rounds = reports.ab_rounds()
            why = reports.missing(ab_id("before", rounds[0], api, engine, driver, AB_LEVELS[0]) if rounds else "",
                                  "ab")
            yield Result(name, at, None, 1.0, True, "×", why)
            continue
        worst_at, worst = max(ratios, key=lambda r: r[1])
        yield Result(name, at, worst, 1.0, True, "×", shown=f"{worst:.2f}× (highest: {worst_at})")


def conformance(reports: Reports) -> Iterator[Result]:
    report = reports.conformance()
    summary = (report or {}).get("summary", {})
    failed = summary.get("failed")
    which = [f"{check['id']} on {engine}" for check in (report or {}).get("checks", [])
             for engine, outcome in check["results"].items() if outcome["outcome"] == "failed"]
    engines = ", ".join(reports.label(e) for e in SYNC_ENGINES)
    yield Result("conformance checks failed", f"sync and async stores, {engines}", failed, 0, True, "",
                 reports.missing("conformance", "conformance"),
                 shown="" if failed is None else
                 f"{failed} ({summary.get('passed', 0)} passed, {summary.get('skipped', 0)} skipped)"
                 + "".join(f"; {w}" for w in which))


def exactly_once(reports: Reports) -> Iterator[Result]:
    runs = [e for e in reports.manifest["runs"].values() if e["status"] in ("ok", "failed")
            and e["kind"] != "conformance"]
    violated = sum(bool(e.get("violated")) for e in runs)  # each bench checks it in the database and exits 1
    yield Result("runs that found an effect applied twice or not at all", f"every bench run above ({len(runs)})",
                 violated if runs else None, 0, True, "", "no run", shown=f"{violated}")


SOURCES = (per_report, before_after, conformance, exactly_once)


def targets(reports: Reports) -> list[Result]:
    return [found for source in SOURCES for found in source(reports)]


__all__ = ["SOURCES", "Result", "targets"]
