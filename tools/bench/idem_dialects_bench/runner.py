"""The one bench runner: each API's benchmark (sync store, async store, HTTP middleware; a consumer next) is run the
same way on the databases named — every one provided before anything is measured (so a missing one stops the run at
once), measured one after another, stopped at the end — and their reports come back as one.

A benchmark is anything with `refuse` and `measure` (`Benchmark`); adding one is a module with such a class and a
line in `idem_dialects_bench.benchmark`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import make_url
from sqlalchemy.engine import URL

from idem_dialects import dialects
from idem_dialects.cli.output import Log, prefixed
from idem_dialects.dialects.base import Backend
from idem_dialects.errors import IdemError
from idem_dialects.url import parse

from .report import combine

if TYPE_CHECKING:
    from idem_dialects.engines import Server
    from idem_dialects.store import IdempotencyStore



class UsageError(Exception):
    """Bad arguments: reported before anything is provided or measured."""


class Unavailable(Exception):
    """A named engine cannot be had here (`hint`: how to provide it), or no engine at all."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class CannotMeasure(Exception):
    """A database cannot be reached, or has no backend or driver here; the message is one line."""


class BenchFailed(Exception):
    """The run cannot vouch for its numbers (exit status 1)."""


class ExactlyOnceViolation(BenchFailed):
    """The database shows a different number of effects than distinct keys: the protocol failed."""


class Benchmark(Protocol):
    """One API's benchmark on one database at a time."""

    def refuse(self, backend: type[Backend]) -> str | None:
        """Why this benchmark cannot run on `backend` (a usage error, said with the targets it concerns before
        anything is provided), or None."""

    def measure(self, url: URL, log: Log) -> dict[str, Any]:
        """Run on the database at `url` and return its report (with "schema" and "engine"). Raises CannotMeasure
        (from its setup) and BenchFailed (ExactlyOnceViolation above all)."""


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


@contextmanager
def reaching(url: URL) -> Iterator[None]:
    """Any error inside (an unknown dialect, a missing driver, a refused connection) means the database cannot be
    measured here: the library's own classification of it (what every command prints for the same mistake), else
    CannotMeasure with the error's first line, never a traceback."""
    try:
        yield
    except IdemError:
        raise
    except Exception as exc:
        raise CannotMeasure(f"cannot connect to {url.render_as_string()}: {first_line(exc)}") from None


def pool_options(url: URL, connections: int, overflow: int) -> dict[str, Any]:
    """A pool that keeps `connections` open (so no worker pays for reconnecting), where the database takes several
    connections at all (an in-memory SQLite database has one, and a pool without sizes)."""
    if not backend_of(url).url_features(url).concurrent_connections:
        return {}
    return {"pool_size": connections, "max_overflow": overflow}


@contextmanager
def scratch_store(url: URL, connections: int) -> Iterator[tuple[IdempotencyStore, dict[str, Any]]]:
    """A sync store on tables of a new prefix at `url`, and the report's "engine" entry; the tables are dropped and
    the engine disposed of at the end. Failing to reach the database raises CannotMeasure."""
    from idem_dialects.store import IdempotencyStore
    from idem_dialects.storebase import connect

    from .report import engine_info, new_prefix

    with reaching(url):
        store = IdempotencyStore.from_url(url, table_prefix=new_prefix(), **pool_options(url, connections, 2))
    try:
        with reaching(url), connect(store.engine, store.backend) as conn:
            info = engine_info(store.engine.url, store.engine.dialect, store.backend.name,
                               conn.dialect.server_version_info)
        try:
            yield store, info
        finally:
            store.drop_tables()
    finally:
        store.close()


def to_measure(url: str | None, engines: Sequence[str]) -> tuple[list[str], bool]:
    """The URLs / engine names to measure, and whether unavailable ones are skipped ('all') or an error."""
    if url and engines:
        raise UsageError("give either a URL/engine name or --engine, not both")
    if url:
        return [url], False
    if not engines:
        raise UsageError("which database? give a URL, an engine name or --engine NAME (repeatable, or 'all')")
    from idem_dialects.engines import expand

    try:
        return expand(engines), "all" in engines
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None


def backend_of(target: str | URL) -> type[Backend]:
    """The backend class of a URL or catalogue engine name, without providing anything."""
    from idem_dialects.engines import get

    if isinstance(target, URL) or "://" in target:
        name = parse(target).get_backend_name()  # InvalidURL, which never repeats the text (it may hold a password)
    else:
        try:
            name = get(target).backend
        except KeyError as exc:
            raise UsageError(exc.args[0]) from None
    try:
        return dialects.load(name)
    except Exception as exc:  # UnsupportedEngine: no backend for it here
        raise CannotMeasure(f"{target}: {first_line(exc)}") from None


def run(names: Sequence[str], benches: Sequence[Benchmark], *, lenient: bool, log: Log) -> dict[str, Any]:
    """Provide every target, measure each in turn with each of `benches` (one per concurrency level), stop them; one
    report (a set for several engines or levels, or when some engine was skipped). Raises UsageError, Unavailable,
    CannotMeasure (the target's name leading its message) and BenchFailed (likewise)."""
    from idem_dialects.engines import provision

    refused: dict[str, list[str]] = {}
    for name in names:
        why = benches[0].refuse(backend_of(name))
        if why:
            refused.setdefault(why, []).append(name)
    if refused:
        raise UsageError("; ".join(f"{why}; not on {', '.join(on)}" for why, on in refused.items()))
    servers: dict[str, Server | None] = {}
    skipped: dict[str, str] = {}
    try:
        for name in names:
            if "://" in name:
                servers[name] = None
                continue
            status = provision(name, {})  # as the matrix does: provided, and answering a connection
            if status.server is not None:
                servers[name] = status.server
                log(f"{name}: {status.server.how} ({status.server_version})")
            elif lenient:
                skipped[name] = str(status.reason)
                log(f"{name}: unavailable, skipped ({status.reason})")
            else:
                raise Unavailable(f"{name} is unavailable: {status.reason}", status.hint)
        if not servers:
            raise Unavailable("no engine available here: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
        reports = []
        for name, server in servers.items():
            # A URL's password is never printed: the name a URL target is reported under hides it.
            shown = make_url(name).render_as_string() if server is None else name
            for bench in benches:
                try:
                    report = bench.measure(server.url if server else make_url(name), prefixed(log, f"{shown}: "))
                except (CannotMeasure, BenchFailed) as exc:
                    raise type(exc)(f"{shown}: {exc}") from None
                if server is not None:
                    report["engine"]["name"] = name
                reports.append(report)
    finally:
        for server in servers.values():
            if server is not None:
                server.stop()
    return reports[0] if len(reports) == 1 and not skipped else combine(reports, skipped)
