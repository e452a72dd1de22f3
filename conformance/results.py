"""Capture and aggregation of one run of the suite, reusable by any runner: a pytest plugin (`Collector`) that records
every (check, variant, engine) outcome, skip reason and observation, and the JSON report built from it (schema
version 1, documented in the docs: Conformance). pytest is imported only by `run_suite`, when a suite really runs."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from sqlalchemy.engine import URL

from idem_dialects import __version__
from idem_dialects.engines import EngineStatus, Unavailable
from idem_dialects.engines.started import temp_dir
from idem_dialects.errors import InsufficientPrivilege

from .naming import PROVISIONED, check_id, check_statement, observation_name

SCHEMA_VERSION = 1
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
PLUGIN = "idem_dialects.conformance.plugin"


@dataclass
class Outcome:
    outcome: str = PASSED
    reason: str | None = None
    duration: float = 0.0
    detail: str | None = None  # a failure's full report, printed to stderr


@dataclass
class Check:
    id: str
    statement: str
    module: str
    results: dict[str, dict[str, Outcome]] = field(default_factory=dict)  # engine -> variant -> outcome


class Collector:
    """pytest plugin: per (check, variant, engine) outcomes and observations, with progress on stderr."""

    def __init__(self, statuses: Mapping[str, EngineStatus], stream: TextIO | None,
                 engines: Mapping[str, EngineStatus] | None = None) -> None:
        """`statuses` per matrix column; `engines` per provisioned engine when columns differ (--idem-api async)."""
        self.statuses = statuses
        self.stream = stream
        self.checks: dict[str, Check] = {}
        self.observations: dict[str, dict[str, Any]] = {name: {} for name in statuses}
        self.where: dict[str, tuple[str, str, str]] = {}
        self.current: dict[str, Outcome] = {}
        self.total = 0
        self.done = 0
        self.errors: list[str] = []
        # A check that failed because the role may not create or use tables: every other check would fail the same
        # way, so the run stops there and the runner reports this one error (InsufficientPrivilege, exit 78).
        self.privilege: InsufficientPrivilege | None = None
        setattr(self, PROVISIONED, {name: s.server or Unavailable(s.reason or "unavailable")
                                    for name, s in (engines or statuses).items()})

    def pytest_collection_finish(self, session: Any) -> None:
        for item in session.items:  # after -k deselection
            ident, variant = check_id(item)
            callspec = getattr(item, "callspec", None)
            engine = callspec.params.get("idem_engine") if callspec else None
            if not isinstance(engine, str):  # None, or pytest's NOTSET: no column for it (async-only under sync)
                continue
            if ident not in self.checks:
                # The module that defines the check, not the one that collected it (a suite that imports it).
                module = getattr(getattr(item, "function", None), "__module__", "")
                self.checks[ident] = Check(ident, check_statement(item), module)
            self.where[item.nodeid] = (ident, variant, engine)
        self.total = sum(1 for _, _, e in self.where.values() if self.statuses[e].available)

    def pytest_exception_interact(self, node: Any, call: Any, report: Any) -> None:
        error = getattr(call.excinfo, "value", None)
        if isinstance(error, InsufficientPrivilege) and self.privilege is None:
            self.privilege = error
            node.session.shouldstop = f"stopped at the first privilege failure: {error}"

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self.errors.append(f"collecting {report.nodeid or 'the suite'} failed:\n{report.longreprtext}")

    def pytest_runtest_logreport(self, report: Any) -> None:
        place = self.where.get(report.nodeid)
        if place is None:
            return
        ident, variant, engine = place
        result = self.current.setdefault(report.nodeid, Outcome())
        result.duration += report.duration
        if report.skipped and result.outcome == PASSED:
            result.outcome, result.reason = SKIPPED, _skip_reason(report)
        elif report.failed:
            phase = "" if report.when == "call" else f"error in {report.when}: "
            if result.outcome != FAILED:
                result.outcome, result.reason = FAILED, phase + _crash_message(report)
            result.detail = (result.detail or "") + report.longreprtext
        if report.when != "teardown":
            return
        del self.current[report.nodeid]
        self.checks[ident].results.setdefault(engine, {})[variant] = result
        for prop, observed in report.user_properties:
            name = observation_name(prop)
            if name is not None:
                self.observations[engine][name] = observed
        if self.statuses[engine].available:
            self.done += 1
            self._progress(engine, ident + (f"[{variant}]" if variant else ""), result)

    def _progress(self, engine: str, label: str, result: Outcome) -> None:
        if self.stream is None:
            return
        width = len(str(self.total))
        line = f"[{self.done:>{width}}/{self.total}] {engine:<14} {label[:70]:<70} {result.outcome}"
        if result.outcome != PASSED:
            line += f": {(result.reason or '')[:160]}"
        else:
            line += f" ({result.duration:.2f}s)"
        print(line, file=self.stream, flush=True)


def _skip_reason(report: Any) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return str(text).removeprefix("Skipped: ")


def _crash_message(report: Any) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message).splitlines()[0] if crash.message else "failed"
    lines = [line for line in report.longreprtext.splitlines() if line.strip()]
    return lines[-1] if lines else "failed"



def run_suite(names: Sequence[str], urls: Mapping[str, URL], collector: Collector, select: str | None,
              api: str = "sync") -> int:
    """Run the shipped checks (`idem_dialects.conformance.suite`) in-process on `names` (already provisioned:
    `collector` carries the servers); pytest's exit status."""
    import pytest  # the suite's runner, imported only when the suite runs

    from . import suite

    class Suite:
        """pytest plugin: the suite module collected as imported, by its package name. pytest would import the file
        again under a name of its own (``conformance.suite``, where an editable install maps conformance/)."""

        def pytest_pycollect_makemodule(self, module_path: Path, parent: Any) -> Any:
            if module_path != Path(suite.__file__ or ""):
                return None
            module = pytest.Module.from_parent(parent, path=module_path)
            module.obj = suite
            return module

    with temp_dir("idem-matrix-") as tmp:
        # An empty ini and rootdir of our own, so the caller's project configuration cannot change the run.
        ini = Path(tmp) / "pytest.ini"
        ini.write_text("[pytest]\n", encoding="utf-8")
        args = [str(suite.__file__), "-c", str(ini), "--rootdir", tmp, "-p", "no:cacheprovider", "-p", "no:terminal",
                "-W", "ignore::pytest.PytestAssertRewriteWarning", "-p", PLUGIN]
        for name in names:
            args += ["--idem-engine", name]
            if name in urls:  # the plugin uses the server provisioned above; this only names the ad-hoc engine
                args += ["--idem-url", f"{name}={urls[name].render_as_string(hide_password=False)}"]
        args += ["--idem-api", api]
        if select:
            args += ["-k", select]
        # PYTEST_ADDOPTS belongs to whatever pytest run launched us (e.g. CI's --idem-require), not to this one; nor
        # do the plugins installed beside it (pytest-django would set up Django's test environment a second time
        # in a process that has one): the suite needs its own plugin alone.
        saved = {name: os.environ.pop(name, None) for name in ("PYTEST_ADDOPTS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD")}
        os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        try:
            return int(pytest.main(args, plugins=[collector, Suite()]))
        finally:
            for name, value in saved.items():
                os.environ.pop(name, None)
                if value is not None:
                    os.environ[name] = value


def aggregate(variants: Mapping[str, Outcome]) -> dict[str, Any]:
    """One cell of the grid from a check's variants: failed if any failed, skipped if all skipped, else passed."""
    outcomes = list(variants.values())
    duration = round(sum(o.duration for o in outcomes), 3)
    failed = {v: o for v, o in variants.items() if o.outcome == FAILED}
    skipped = {v: o for v, o in variants.items() if o.outcome == SKIPPED}
    reasons = list(dict.fromkeys(o.reason or "" for o in skipped.values()))
    reason: str | None
    if failed:
        outcome = FAILED
        reason = "; ".join(f"[{v}] {o.reason}" if v else str(o.reason) for v, o in failed.items())
    elif len(skipped) == len(outcomes):
        outcome, reason = SKIPPED, "; ".join(reasons)
    else:
        outcome = PASSED
        reason = f"{len(skipped)} of {len(outcomes)} variants skipped: {'; '.join(reasons)}" if skipped else None
    cell: dict[str, Any] = {"outcome": outcome, "reason": reason, "duration": duration}
    if len(variants) > 1 or "" not in variants:
        cell["variants"] = {v: {"outcome": o.outcome, "reason": o.reason, "duration": round(o.duration, 3)}
                            for v, o in variants.items()}
    return cell


def jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def build_report(statuses: Mapping[str, EngineStatus], collector: Collector, elapsed: float) -> dict[str, Any]:
    checks = []
    counts = {PASSED: 0, FAILED: 0, SKIPPED: 0}
    for check in collector.checks.values():
        results = {}
        for engine in statuses:
            if engine in check.results:
                results[engine] = aggregate(check.results[engine])
                counts[results[engine]["outcome"]] += 1
        checks.append({"id": check.id, "statement": check.statement, "module": check.module, "results": results})
    observations: dict[str, dict[str, Any]] = {}
    for name, status in statuses.items():
        if status.available:
            observations[name] = {"server version": status.server_version}
            observations[name].update({k: jsonable(v) for k, v in collector.observations[name].items()})
    return {
        "version": SCHEMA_VERSION,
        "idem_dialects": __version__,
        "engines": {name: status.as_json() for name, status in statuses.items()},
        "checks": checks,
        "observations": observations,
        "summary": {**counts, "checks": len(checks), "duration": round(elapsed, 2), "exit_status": None},
    }
