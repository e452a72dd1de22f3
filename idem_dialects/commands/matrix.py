"""`idem-dialects matrix`: run the conformance suite on several engines and compare them side by side.

Engines are provisioned once, up front (so a required engine that cannot be had stops the run at once, exit 2);
the suite then runs in-process under pytest with a collector plugin that records every (check, engine) outcome,
skip reason and observation, printing progress to stderr. The report goes to stdout as a table, GitHub markdown or
JSON (schema version 1, documented in the conformance README), rendered by idem_dialects.reporting; `--html`
also writes the self-contained HTML report.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from sqlalchemy import create_engine, make_url
from sqlalchemy.engine import URL

from .. import __version__

# The shipped suite lives in packages mypy cannot map from their source directories (setuptools package-dir).
from ..conformance import CHECK_MODULES  # type: ignore[import-not-found, unused-ignore]
from ..conformance.naming import (  # type: ignore[import-not-found, unused-ignore]
    OBSERVATION,
    PROVISIONED,
    check_id,
    check_statement,
)
from ..engines import (  # type: ignore[import-not-found, unused-ignore]
    ENGINES,
    EngineUnavailable,
    Server,
    Unavailable,
    env_var,
    expand,
)
from ..reporting import render, render_html

SCHEMA_VERSION = 1
FORMATS = ("table", "markdown", "json", "html")
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
EXIT_OK, EXIT_FAILED, EXIT_UNAVAILABLE = 0, 1, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", action="append", metavar="NAME",
                        help="engine to run on (repeatable; 'all'; a family such as 'mssql' means every mssql-*);"
                             " default: every engine, those unavailable here listed as skipped")
    parser.add_argument("--url", action="append", metavar="NAME=URL", default=[],
                        help="database URL for an engine (repeatable); a NAME outside the catalogue adds an engine")
    parser.add_argument("--require", action="append", metavar="NAME", default=[],
                        help="exit 2 if this engine cannot be provisioned (repeatable; 'all'; families expand)")
    add_output_arguments(parser)


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=FORMATS, default="table", help="report format (default: table)")
    parser.add_argument("-k", dest="select", metavar="EXPR",
                        help="only the checks matching this pytest -k expression (e.g. 'keys or purge')")
    parser.add_argument("--output", metavar="FILE", help="write the report (in --format) to FILE instead of stdout")
    parser.add_argument("--html", metavar="FILE", help="also write the self-contained HTML report to FILE")
    parser.add_argument("--show-skipped", action="store_true",
                        help="table/markdown: a column and a line (reason, how to enable) per unavailable engine")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def run(args: argparse.Namespace) -> int:
    try:
        urls = parse_urls(args.url)
        adhoc = [n for n in urls if n not in ENGINES]
        names = expand(args.engine or ["all"], adhoc)
        required = expand(args.require, adhoc)
    except (KeyError, ValueError) as exc:
        print(f"idem-dialects matrix: {exc.args[0]}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    names = list(dict.fromkeys(names + required))
    return run_matrix(names, urls=urls, required=required, fmt=args.format, select=args.select,
                      output=args.output, quiet=args.quiet, html=args.html, show_skipped=args.show_skipped)


def parse_urls(items: Sequence[str]) -> dict[str, URL]:
    urls: dict[str, URL] = {}
    for item in items:
        name, sep, url = item.partition("=")
        if not sep or not name or not url:
            raise ValueError(f"--url wants NAME=URL, got {item!r}")
        urls[name] = make_url(url)
    return urls


# --- provisioning ---------------------------------------------------------------------------------------------


@dataclass
class EngineStatus:
    """What provisioning found for one engine."""

    name: str
    required: bool
    server: Server | None = None
    reason: str | None = None
    hint: str | None = None
    server_version: str | None = None

    @property
    def available(self) -> bool:
        return self.server is not None

    def as_json(self) -> dict[str, Any]:
        spec = ENGINES.get(self.name)
        return {
            "available": self.available,
            "required": self.required,
            "title": spec.title if spec else "ad-hoc engine (URL given)",
            "backend": self.server.url.get_backend_name() if self.server else (spec.backend if spec else None),
            "how": self.server.how if self.server else None,
            "url": self.server.url.render_as_string(hide_password=True) if self.server else None,
            "server_version": self.server_version,
            "reason": self.reason,
            "hint": self.hint,
            "env_var": env_var(self.name),
        }


def provision(name: str, urls: Mapping[str, URL], required: bool = False) -> EngineStatus:
    """Provide one engine (a URL given on the command line wins) and check it answers a connection."""
    status = EngineStatus(name, required)
    try:
        if name in urls:
            server = Server(name, urls[name], "URL from --url")
        else:
            server = ENGINES[name].provide()
    except EngineUnavailable as exc:
        status.reason, status.hint = "; ".join(exc.reasons), exc.hint
        return status
    except Unavailable as exc:
        status.reason = str(exc)
        return status
    try:
        status.server_version = probe(server.url)
    except Exception as exc:  # any driver or network error means "cannot be had here", with its text as reason
        server.stop()
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        status.reason = f"{server.how}: cannot connect to {server.url.render_as_string()}: {first}"
        spec = ENGINES.get(name)
        status.hint = spec.how_to_enable() if spec else "check the URL, the server and its driver"
        return status
    status.server = server
    return status


def probe(url: URL) -> str:
    """Connect once with plain SQLAlchemy (no backend involved) and return the server's version."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            info = conn.dialect.server_version_info
            version = ".".join(str(part) for part in info) if info else "unknown"
            return f"{conn.dialect.name} {version}"
    finally:
        engine.dispose()


# --- collecting results ---------------------------------------------------------------------------------------


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

    def __init__(self, statuses: Mapping[str, EngineStatus], stream: TextIO | None) -> None:
        self.statuses = statuses
        self.stream = stream
        self.checks: dict[str, Check] = {}
        self.observations: dict[str, dict[str, Any]] = {name: {} for name in statuses}
        self.where: dict[str, tuple[str, str, str]] = {}
        self.current: dict[str, Outcome] = {}
        self.total = 0
        self.done = 0
        self.errors: list[str] = []
        setattr(self, PROVISIONED, {name: s.server or Unavailable(s.reason or "unavailable")
                                    for name, s in statuses.items()})

    def pytest_collection_finish(self, session: Any) -> None:
        for item in session.items:  # after -k deselection
            ident, variant = check_id(item)
            callspec = getattr(item, "callspec", None)
            engine = callspec.params.get("idem_engine") if callspec else None
            if engine is None:
                continue
            if ident not in self.checks:
                module = getattr(getattr(item, "module", None), "__name__", "")
                self.checks[ident] = Check(ident, check_statement(item), module)
            self.where[item.nodeid] = (ident, variant, engine)
        self.total = sum(1 for _, _, e in self.where.values() if self.statuses[e].available)

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
        for tag, value in report.user_properties:
            if tag == OBSERVATION:
                name, observed = value
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


# --- running --------------------------------------------------------------------------------------------------


def run_matrix(names: Sequence[str], *, urls: Mapping[str, URL], required: Sequence[str], fmt: str = "table",
               select: str | None = None, output: str | None = None, quiet: bool = False, html: str | None = None,
               show_skipped: bool = False) -> int:
    """Provision `names`, run the suite on those available, print the report; the exit status as documented."""
    stream = None if quiet else sys.stderr
    statuses: dict[str, EngineStatus] = {}
    try:
        for name in names:
            if stream:
                print(f"provisioning {name} ...", file=stream, flush=True)
            status = statuses[name] = provision(name, urls, name in required)
            if stream:
                state = f"available: {status.server.how} ({status.server_version})" if status.server else \
                    f"unavailable: {status.reason}"
                print(f"  {name}: {state}", file=stream, flush=True)
        missing = [s for s in statuses.values() if s.required and not s.available]
        if missing:
            for status in missing:
                print(f"idem-dialects matrix: required engine {status.name} is unavailable: {status.reason}",
                      file=sys.stderr)
                if status.hint:
                    print(f"  to provide it: {status.hint}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        started = time.perf_counter()
        collector = Collector(statuses, stream)
        pytest_status = _run_pytest(list(statuses), urls, collector, select)
        report = build_report(statuses, collector, time.perf_counter() - started)
    finally:
        for status in statuses.values():
            if status.server is not None:
                status.server.stop()
    failures = [(c.id, e, v, o) for c in collector.checks.values() for e, vs in c.results.items()
                for v, o in vs.items() if o.outcome == FAILED]
    for ident, engine, variant, outcome in failures:
        print(f"\n=== FAILED {ident}{f'[{variant}]' if variant else ''} on {engine}\n{outcome.detail or ''}",
              file=sys.stderr)
    for error in collector.errors:
        print(f"\n=== {error}", file=sys.stderr)
    code = EXIT_OK
    if failures or collector.errors or pytest_status not in (0, 1, 5):  # 5: nothing collected (e.g. -k)
        code = EXIT_FAILED
    report["summary"]["exit_status"] = code
    text = render(report, fmt, show_skipped=show_skipped)
    if html:
        Path(html).write_text(render_html([report]), encoding="utf-8")
    if output:
        Path(output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    return code


def _run_pytest(names: Sequence[str], urls: Mapping[str, URL], collector: Collector, select: str | None) -> int:
    import pytest  # the suite's runner, imported only when the suite runs

    with tempfile.TemporaryDirectory(prefix="idem-matrix-") as tmp:
        # An empty ini and rootdir of our own, so the caller's project configuration cannot change the run; one
        # module star-importing the checks, so they are collected under their installed module names.
        ini = Path(tmp) / "pytest.ini"
        ini.write_text("[pytest]\n", encoding="utf-8")
        module = Path(tmp) / "test_idem_conformance.py"
        module.write_text("".join(f"from {name} import *  # noqa: F403\n" for name in CHECK_MODULES),
                          encoding="utf-8")
        args = [str(module), "-c", str(ini), "--rootdir", tmp, "-p", "no:cacheprovider", "-p", "no:terminal",
                "-W", "ignore::pytest.PytestAssertRewriteWarning"]
        if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):  # the suite's plugin is an entry point: load it by hand
            args += ["-p", "idem_dialects.conformance.plugin"]
        for name in names:
            args += ["--idem-engine", name]
            if name in urls:  # the plugin uses the server provisioned above; this only names the ad-hoc engine
                args += ["--idem-url", f"{name}={urls[name].render_as_string(hide_password=False)}"]
        if select:
            args += ["-k", select]
        # PYTEST_ADDOPTS belongs to whatever pytest run launched us (e.g. CI's --idem-require), not to this one.
        saved = os.environ.pop("PYTEST_ADDOPTS", None)
        try:
            return int(pytest.main(args, plugins=[collector]))
        finally:
            if saved is not None:
                os.environ["PYTEST_ADDOPTS"] = saved


# --- the report -----------------------------------------------------------------------------------------------


def _aggregate(variants: Mapping[str, Outcome]) -> dict[str, Any]:
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


def _jsonable(value: Any) -> Any:
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
                results[engine] = _aggregate(check.results[engine])
                counts[results[engine]["outcome"]] += 1
        checks.append({"id": check.id, "statement": check.statement, "module": check.module, "results": results})
    observations: dict[str, dict[str, Any]] = {}
    for name, status in statuses.items():
        if status.available:
            observations[name] = {"server version": status.server_version}
            observations[name].update({k: _jsonable(v) for k, v in collector.observations[name].items()})
    return {
        "version": SCHEMA_VERSION,
        "idem_dialects": __version__,
        "engines": {name: status.as_json() for name, status in statuses.items()},
        "checks": checks,
        "observations": observations,
        "summary": {**counts, "checks": len(checks), "duration": round(elapsed, 2), "exit_status": None},
    }
