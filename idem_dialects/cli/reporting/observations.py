"""The matrix's behaviour observations, read back into series for charts and into "what differs" sentences.

Only what a run measured is used: a sentence is written only from observations present in the report, and says
nothing the numbers do not show. Observation names are those the conformance checks record (`observe(...)`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

MEDIAN, SLOWEST, RETRIES, RESOLVED = ": median caller (ms)", ": slowest caller (ms)", ": retries absorbed", \
    ": duplicates resolved by"
WAITED, RETRIED = "waited", "retried"
T = TypeVar("T")


def title(label: str) -> str:
    """An observation label as a chart row title: isolation levels name the race they were measured in."""
    return label if any(word in label for word in ("race", "processes", "winner")) else f"16-thread race under {label}"


def ran(report: Mapping[str, Any]) -> list[str]:
    return [name for name, e in report["engines"].items() if e["available"]]


def unavailable(report: Mapping[str, Any]) -> list[str]:
    return [name for name, e in report["engines"].items() if not e["available"]]


def tally(report: Mapping[str, Any]) -> str:
    """The run's counts, separating the engines that ran from those that could not be had (all skipped)."""
    summary, missing = report["summary"], set(unavailable(report))
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for check in report["checks"]:
        for engine, cell in check["results"].items():
            if engine not in missing:
                counts[cell["outcome"]] = counts.get(cell["outcome"], 0) + 1
    text = (f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped (check x engine) on"
            f" the {len(ran(report))} engine{'s' * (len(ran(report)) != 1)} that ran")
    if missing:
        text += (f", {summary['skipped'] - counts['skipped']} more skipped on the {len(missing)} not run here"
                 " (unavailable, or not asked for)")
    return text + f"; {summary['duration']}s, exit status {summary['exit_status']}"


def _labels(report: Mapping[str, Any], suffix: str) -> list[str]:
    labels: list[str] = []
    for obs in report["observations"].values():
        labels += [k.removesuffix(suffix) for k in obs if k.endswith(suffix) and k.removesuffix(suffix) not in labels]
    return labels


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _per_label(report: Mapping[str, Any], suffix: str,
               read: Callable[[Mapping[str, Any], str], T | None]) -> dict[str, dict[str, T]]:
    """Label (an observation name less `suffix`) -> engine -> `read(engine's observations, label)`, for the engines
    that ran and where `read` finds a value (not None)."""
    out: dict[str, dict[str, T]] = {}
    for label in _labels(report, suffix):
        for engine in ran(report):
            value = read(report["observations"].get(engine, {}), label)
            if value is not None:
                out.setdefault(label, {})[engine] = value
    return out


def latency(report: Mapping[str, Any]) -> dict[str, dict[str, tuple[float, float]]]:
    """Race label (16-thread race, each isolation level) -> engine -> (median, slowest) caller latency in ms."""

    def read(obs: Mapping[str, Any], label: str) -> tuple[float, float] | None:
        median, slowest = _number(obs.get(label + MEDIAN)), _number(obs.get(label + SLOWEST))
        return None if median is None or slowest is None else (median, slowest)

    return _per_label(report, MEDIAN, read)


def retries(report: Mapping[str, Any]) -> dict[str, dict[str, dict[str, int]]]:
    """Label -> engine -> cause -> retries absorbed ({} where the engine needed none)."""

    def read(obs: Mapping[str, Any], label: str) -> dict[str, int] | None:
        value = obs.get(label + RETRIES)
        if value is None:
            return None
        return {str(k): int(v) for k, v in value.items()} if isinstance(value, dict) else {}

    return _per_label(report, RETRIES, read)


def resolution(report: Mapping[str, Any]) -> dict[str, dict[str, tuple[str, str]]]:
    """Label -> engine -> (WAITED | RETRIED, the observed sentence): how concurrent duplicates were resolved."""

    def read(obs: Mapping[str, Any], label: str) -> tuple[str, str] | None:
        text = obs.get(label + RESOLVED)
        return (RETRIED if "retried" in text else WAITED, text) if isinstance(text, str) else None

    return _per_label(report, RESOLVED, read)


def effect_calls(report: Mapping[str, Any]) -> dict[str, dict[str, tuple[float, str]]]:
    """Observation -> engine -> (number, as recorded): how often the effect callable ran, and effects per key, where
    an engine (a cluster) reports them. A recorded text counts by its leading number ("2.9 (max 4; ...)")."""
    out: dict[str, dict[str, tuple[float, str]]] = {}
    for engine in ran(report):
        for name, value in report["observations"].get(engine, {}).items():
            low = name.lower()
            if "per key" not in low and "effect call" not in low:
                continue
            number = _number(value)
            if number is None and isinstance(value, str):
                match = re.match(r"\s*(\d+(?:\.\d+)?)", value)
                number = float(match.group(1)) if match else None
            if number is not None:
                out.setdefault(name, {})[engine] = (number, str(value))
    return out


def grouped(values: Mapping[str, str]) -> list[tuple[str, list[str]]]:
    """engine -> value, as (value, engines) in order of first appearance."""
    groups: dict[str, list[str]] = {}
    for engine, value in values.items():
        groups.setdefault(value, []).append(engine)
    return list(groups.items())


def _fact(report: Mapping[str, Any], name: str) -> dict[str, str]:
    return {e: str(report["observations"][e][name]) for e in ran(report)
            if name in report["observations"].get(e, {})}


def _sentence(subject: str, values: Mapping[str, str], total: int) -> str:
    groups = grouped(values)
    if len(groups) == 1 and len(groups[0][1]) == total and total > 1:
        return f"{subject}: {groups[0][0]} on all {total} engines."
    return f"{subject}: " + "; ".join(f"{', '.join(engines)}: {value}" for value, engines in groups) + "."


def differences(report: Mapping[str, Any]) -> list[str]:
    """Short sentences, each generated from measured observations only."""
    engines = ran(report)
    out: list[str] = []
    absorbed = retries(report)
    for label, resolved in resolution(report).items():
        groups: dict[str, list[str]] = {}
        for e, (how, _) in resolved.items():
            causes = absorbed.get(label, {}).get(e, {})
            if how == WAITED or not causes:
                verb, who = "losers waited on the key, then replayed", e
            else:
                verb = f"losers retried after {' and '.join(causes)}, then replayed"
                who = f"{e} ({', '.join(f'x{n}' for n in causes.values())})"
            groups.setdefault(verb, []).append(who)
        subject = f"Concurrent duplicates ({label})" if "race" in label else f"Concurrent duplicates under {label}"
        if len(groups) == 1 and len(resolved) == len(engines) > 1 and WAITED in next(iter(groups)):
            line = f"{subject}: {next(iter(groups))} on all {len(engines)} engines."
        else:
            line = f"{subject}: " + "; ".join(f"{', '.join(who)}: {verb}" for verb, who in groups.items()) + "."
        offered = _fact(report, "isolation levels declared")
        for e in (e for e in engines if e not in resolved):
            line += (f" {e} does not offer {label}." if e in offered and label not in offered[e] else
                     f" Not measured on {e}.")
        out.append(line)
    for label, timed in latency(report).items():
        if len(timed) > 1:
            fast = min(timed, key=lambda e: timed[e][0])
            slow = max(timed, key=lambda e: timed[e][0])
            ratio = timed[slow][0] / timed[fast][0] if timed[fast][0] else 0.0
            out.append(f"Median caller in the {label if 'race' in label else label + ' race'}: fastest {fast}"
                       f" {timed[fast][0]:g} ms, slowest {slow} {timed[slow][0]:g} ms"
                       + (f" ({ratio:.1f}x)." if ratio else "."))
    for name, subject in (("key column (declared DDL)", "Key column type"),
                          ("default isolation level", "Default isolation level"),
                          ("isolation levels declared", "Isolation levels offered")):
        values = _fact(report, name)
        if values:
            out.append(_sentence(subject, values, len(engines)))
    for name, calls in effect_calls(report).items():
        out.append(f"{name}: " + "; ".join(f"{e} {text}" for e, (_, text) in calls.items()) + ".")
    return out
