"""Before/after: the same runs on two checkouts, round by round; per (API, engine, driver, level) the median of each
side and the median of the per-round ratios after / before (paired: the two runs of a round ran minutes apart)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from .plan import AB_LEVELS, AB_PAIRS
from .reports import Report, Reports

# (name on the page, mode, what): the figures compared. The bare effect's is mostly the machine's drift between the
# two runs of a round: of the library, it runs only the store's transaction.
METRICS = (("first-time client CPU µs", "first", "cpu"), ("replay client CPU µs", "replay", "cpu"),
           ("bare client CPU µs", "bare", "cpu"), ("first-time × bare", "first", "ratio"),
           ("replay × bare", "replay", "ratio"))


def figure(report: Report, mode: str, what: str) -> float | None:
    m = report.get("modes", {}).get(mode)
    if m is None:
        return None
    if what == "cpu":
        cpu = m.get("cpu_ms_per_request")
        return None if cpu is None else float(cpu) * 1000
    ratio = m.get("ratio_to_bare_paired", m.get("ratio_to_bare"))
    return None if ratio is None else float(ratio)


@dataclass
class Pair:
    api: str
    engine: str
    driver: str
    level: int
    before: dict[str, list[float]] = field(default_factory=dict)
    after: dict[str, list[float]] = field(default_factory=dict)
    paired: dict[str, list[float]] = field(default_factory=dict)
    rounds: int = 0

    def median(self, side: str, metric: str) -> float | None:
        values = (self.before if side == "before" else self.after).get(metric, [])
        return statistics.median(values) if values else None

    def ratio(self, metric: str) -> float | None:
        values = self.paired.get(metric, [])
        return statistics.median(values) if values else None


def pairs(reports: Reports) -> list[Pair]:
    """Every before/after pair the reports hold, in the plan's order; empty without a --before run."""
    found = []
    rounds = reports.ab_rounds()
    for api, engine, driver in AB_PAIRS:
        for level in AB_LEVELS:
            pair = Pair(api, engine, driver, level)
            for rnd in rounds:
                before = reports.ab("before", rnd, api, engine, driver, level)
                after = reports.ab("after", rnd, api, engine, driver, level)
                if before is None or after is None:
                    continue
                pair.rounds += 1
                for name, mode, what in METRICS:
                    b, a = figure(before, mode, what), figure(after, mode, what)
                    if b is not None:
                        pair.before.setdefault(name, []).append(b)
                    if a is not None:
                        pair.after.setdefault(name, []).append(a)
                    if a is not None and b:
                        pair.paired.setdefault(name, []).append(a / b)
            if pair.rounds:
                found.append(pair)
    return found


def summary(reports: Reports) -> dict[str, Any]:
    """What the page says about the comparison: the checkouts and what the before side could not run."""
    checkouts = reports.manifest.get("checkouts", {})
    ab = [e for e in reports.manifest["runs"].values() if e.get("round") is not None and e["status"] == "ok"]
    return {"before": checkouts.get("before"), "after": checkouts.get("after"),
            "dropped": reports.manifest.get("dropped", {}), "rounds": reports.ab_rounds(),
            "cpus": sorted({cpu for e in ab for cpu in e.get("cpus") or ()}) if all(e.get("cpus") for e in ab) else []}
