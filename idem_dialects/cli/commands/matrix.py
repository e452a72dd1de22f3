"""`idem-dialects matrix`: run the conformance suite on several engines and compare them side by side.

Engines are provisioned once, up front (so a required engine that cannot be had stops the run at once, exit 2);
the suite then runs in-process under pytest with the conformance package's collector (idem_dialects.conformance
.results), printing progress to stderr. The report goes to stdout as a table, GitHub markdown or JSON (schema
version 1, in the docs: Conformance), rendered by idem_dialects.reporting; `--html` also writes the HTML page.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL

from ...conformance.results import FAILED, Collector, build_report, run_suite
from ...engines import ENGINES, EngineStatus, env_var, expand, parse_named_urls, provision, version_text
from ...errors import ConfigurationError
from ...store import IdempotencyStore
from ...storebase import connect
from ..output import add_output, add_quiet, write
from ..reporting import render, render_html
from . import EXIT_FAILED, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE

FORMATS = ("table", "markdown", "json", "html")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", action="append", metavar="NAME",
                        help="engine to run on, provided whatever it takes: a cluster or a container is started for"
                             " it (repeatable; a family such as 'mssql' means every mssql-*; 'all': every engine of"
                             " the catalogue). Default: the embedded engines (SQLite, PostgreSQL 18) and the servers"
                             " found here (a local service, an IDEM_URL_<NAME>), without starting any cluster or"
                             " container; the others are listed as not run")
    parser.add_argument("--url", action="append", metavar="NAME=URL", default=[],
                        help="database URL for an engine (repeatable); a NAME outside the catalogue adds an engine")
    parser.add_argument("--require", action="append", metavar="NAME", default=[],
                        help="exit 2 if this engine cannot be provisioned (repeatable; 'all'; families expand)")
    parser.add_argument("--api", choices=("sync", "async", "both"), default="sync",
                        help="the store the checks run on: IdempotencyStore (sync, the default), AsyncIdempotencyStore"
                             " on each installed async driver (one column per engine x driver), or both")
    add_output_arguments(parser)


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=FORMATS, default="table", help="report format (default: table)")
    parser.add_argument("-k", dest="select", metavar="EXPR",
                        help="only the checks matching this pytest -k expression (e.g. 'keys or purge')")
    add_output(parser, "the report (in --format)")
    parser.add_argument("--html", metavar="FILE", help="also write the self-contained HTML report to FILE")
    parser.add_argument("--show-skipped", action="store_true",
                        help="table/markdown: a column and a line (reason, how to enable) per unavailable engine")
    add_quiet(parser)


def require_suite(command: str) -> None:
    """`check` and `matrix` run the conformance suite on pytest, which only the [conformance] extra installs: say so
    in one line (exit 78), before any work."""
    try:
        import pytest  # noqa: F401  # the suite's runner
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in ("pytest", "_pytest"):
            raise
        raise ConfigurationError("the conformance suite runs on pytest, which is not"
                                 " installed: pip install 'idem-dialects[conformance]'") from None


def reach(url: str | URL) -> tuple[URL, str]:
    """Connect to a database the user named, as the store does, so a mistake is the one answer every command gives
    (the backend's classification: two lines from the CLI's handler); then try what every check needs first,
    creating tables (and drop them), so a role without that privilege stops here (InsufficientPrivilege, exit 78)
    rather than failing every check. The URL engines are built from, and what answered."""
    with IdempotencyStore.from_url(url, table_prefix=f"idem_reach_{uuid.uuid4().hex[:8]}_") as store:
        with connect(store.engine, store.backend) as conn:
            resolved, version = store.engine.url, version_text(conn.dialect)
        store.create_tables()
        store.drop_tables()
    return resolved, version


def run(args: argparse.Namespace) -> int:
    require_suite("matrix")
    try:
        urls = parse_named_urls(args.url, "--url")
        adhoc = [n for n in urls if n not in ENGINES]
        names = expand(args.engine or ["all"], adhoc)
        required = expand(args.require, adhoc)
    except (KeyError, ValueError) as exc:
        print(f"idem-dialects matrix: {exc.args[0]}", file=sys.stderr)
        return EXIT_USAGE
    names = list(dict.fromkeys(names + required))
    # Engines named on the command line are provided whatever it takes; by default nothing heavy is started.
    asked = set(names) if args.engine else set(required)
    # An engine the user gave a URL for (--url or IDEM_URL_<NAME>) is one they meant to run: unreachable fails.
    required += [n for n in names if n not in required and (n in urls or os.environ.get(env_var(n)))]
    versions: dict[str, str] = {}
    for name in [n for n in names if n in urls]:  # a URL given here: a mistake in it is told as `check` tells it
        urls[name], versions[name] = reach(urls[name])
    return run_matrix(names, urls=urls, required=required, fmt=args.format, select=args.select,
                      output=args.output, quiet=args.quiet, api=args.api, html=args.html,
                      show_skipped=args.show_skipped, versions=versions, asked=asked)


# --- running --------------------------------------------------------------------------------------------------


def run_matrix(names: Sequence[str], *, urls: Mapping[str, URL], required: Sequence[str], fmt: str = "table",
               select: str | None = None, output: str | None = None, quiet: bool = False, api: str = "sync",
               html: str | None = None, show_skipped: bool = False, versions: Mapping[str, str] = {},
               asked: Collection[str] | None = None) -> int:
    """Provision `names`, run the suite on those available, print the report; the exit status as documented.
    `versions`: what answered at URLs the caller already connected to (not probed again). `asked`: the engines for
    which a cluster or a container may be started (default: all of `names`)."""
    stream = None if quiet else sys.stderr
    statuses: dict[str, EngineStatus] = {}
    try:
        for name in names:
            if stream:
                print(f"provisioning {name} ...", file=stream, flush=True)
            status = statuses[name] = provision(name, urls, name in required, versions.get(name),
                                                start_on_request=asked is None or name in asked)
            if stream:
                state = (f"available: {status.server.how} ({status.server_version})" if status.server else
                         f"not run: it starts a cluster or a container; ask for it with --engine {name}"
                         if status.on_request else f"unavailable: {status.reason}")
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
        columns = api_columns(statuses, api)
        collector = Collector(columns, stream, engines=statuses)
        pytest_status = run_suite(list(statuses), urls, collector, select, api)
        report = build_report(columns, collector, time.perf_counter() - started)
    finally:
        for status in statuses.values():
            if status.server is not None:
                status.server.stop()
    if collector.privilege is not None:  # the role's privileges, not the backend: one line, as `init` says it
        raise collector.privilege
    failures = [(c.id, e, v, o) for c in collector.checks.values() for e, vs in c.results.items()
                for v, o in vs.items() if o.outcome == FAILED]
    for i, (ident, engine, variant, outcome) in enumerate(failures):  # bounded: the first in full, then one line
        name = f"{ident}{f'[{variant}]' if variant else ''} on {engine}"
        print(f"\n=== FAILED {name}\n{outcome.detail or ''}" if i == 0 else f"=== FAILED {name}: {outcome.reason}",
              file=sys.stderr)
    for error in collector.errors:
        print(f"\n=== {error}", file=sys.stderr)
    if not collector.checks and not collector.errors:  # pytest's 5: -k deselected every check
        print(f"idem-dialects matrix: -k {select!r} selects no check (ids are the test_* names without test_, as in"
              " the report)", file=sys.stderr)
        return EXIT_USAGE
    code = EXIT_OK
    if failures or collector.errors or pytest_status not in (0, 1):
        code = EXIT_FAILED
    report["summary"]["exit_status"] = code
    text = render(report, fmt, show_skipped=show_skipped)
    if html:
        Path(html).write_text(render_html([report]), encoding="utf-8")
    write(text, output)
    return code


@dataclass
class ColumnStatus(EngineStatus):
    """An engine run on AsyncIdempotencyStore with one async driver: the column `<engine>-<driver>`."""

    engine: str = ""
    driver: str = ""

    def as_json(self) -> dict[str, Any]:
        base = dataclasses.replace(self, name=self.engine)
        return {**EngineStatus.as_json(base), "api": "async", "driver": self.driver}


def api_columns(statuses: Mapping[str, EngineStatus], api: str) -> dict[str, EngineStatus]:
    """The matrix's columns: each engine for the sync store, each engine x installed async driver for the async."""
    from ... import dialects

    columns: dict[str, EngineStatus] = {}
    for name, status in statuses.items():
        if api in ("sync", "both"):
            columns[name] = status
        spec = ENGINES.get(name)
        backend = status.server.url.get_backend_name() if status.server else spec.backend if spec else None
        if api in ("async", "both") and backend is not None:
            for driver in dialects.usable_drivers(dialects.load(backend), asynchronous=True):
                column = f"{name}-{driver}"
                columns[column] = ColumnStatus(**{f.name: getattr(status, f.name) for f in dataclasses.fields(status)}
                                               | {"name": column, "engine": name, "driver": driver})
    return columns
