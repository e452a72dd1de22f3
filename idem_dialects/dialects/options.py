"""Query options of a database URL that idem-dialects consumes; the driver never sees them.

A deployment knows facts about its database that a client cannot ask the server: how long its HA stack takes to
fail over, that a transaction-mode pooler sits in front of it, that its load balancer sends every session to one
writer. The URL says so, and the backend turns that into its `Features` and into driver settings:

- ``failover_window=SECONDS`` (PostgreSQL, MySQL, MariaDB): how long a failover takes, at most; a store whose
  ``RetryPolicy.total`` is shorter warns once (its callers would get RetriesExhausted during a failover).
- ``pooler=transaction`` (PostgreSQL): PgBouncer (or another pooler) in transaction mode, so a client's next
  transaction may run on another server session: server-side prepared statements are turned off on every driver.
  Without it the backend asks the first connection whether a pooler is in front (`pooler.py`).
  ``pooler=session`` says a session-mode pooler is there (nothing to change).
- ``purge=portable`` (PostgreSQL): purge deletes by primary key (the keys selected first, then deleted) instead of
  the engine's own batch statement, for a server that refuses the latter (Citus: a multi-shard ``FOR UPDATE`` or
  ``ctid``); ``purge=native`` is the default.
- ``writers=single`` (MariaDB Galera): a load balancer sends every session to one node (HAProxy with backup
  servers), so an atomic claim excludes other claimers as on a single server; ``writers=all`` is the default.

The options stay in the engine's URL (features are read from it) and are removed from the driver's connect()
arguments by a ``do_connect`` listener the backend installs on every engine a store wraps: they work with
`from_url` and with an engine the caller built from the same URL.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Collection
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import URL

from ..errors import ConnectionConfigError, InvalidURL, InvalidURLOption

FAILOVER_WINDOW = "failover_window"
POOLER = "pooler"
PURGE = "purge"
WRITERS = "writers"
CHOICES: dict[str, tuple[str, ...]] = {POOLER: ("session", "transaction"), PURGE: ("native", "portable"),
                                       WRITERS: ("all", "single")}
ALL = (FAILOVER_WINDOW, POOLER, PURGE, WRITERS)

_installed: weakref.WeakSet[Engine] = weakref.WeakSet()


def _raw(url: URL, name: str, accepted: Collection[str]) -> str | None:
    raw = url.query.get(name)
    if raw is None:
        return None
    backend = url.get_backend_name()
    if name not in accepted:
        raise InvalidURLOption(name, f"the {backend} backend has no such option (it has:"
                                     f" {', '.join(sorted(accepted)) or 'none'})")
    if not isinstance(raw, str):
        raise InvalidURLOption(name, "given more than once")
    return raw


def choice(url: URL, name: str, accepted: Collection[str]) -> str | None:
    """The value of option `name` (one of CHOICES[name]) if the URL has it; InvalidURLOption if it is wrong."""
    raw = _raw(url, name, accepted)
    if raw is not None and raw not in CHOICES[name]:
        raise InvalidURLOption(name, f"{raw!r} is not one of {', '.join(CHOICES[name])}")
    return raw


def failover_window(url: URL, accepted: Collection[str]) -> float | None:
    """The failover window the URL declares, in seconds; InvalidURLOption unless a positive number."""
    raw = _raw(url, FAILOVER_WINDOW, accepted)
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise InvalidURLOption(FAILOVER_WINDOW, f"{raw!r} is not a positive number of seconds")
    return seconds


def check_port(url: URL) -> None:
    """InvalidURL for a port outside 1-65535, which drivers would take for a server that does not answer (and so
    retry) or refuse with an error of their own."""
    if url.port is not None and not 1 <= url.port <= 65535:
        raise InvalidURL(f"the port in the URL, {url.port}, is not a TCP port (1 to 65535)",
                         "give the server's port, or leave it out for the engine's default")


def check(url: URL, accepted: Collection[str]) -> None:
    """InvalidURLOption for the first option in `url` that is not `accepted`, repeated, or has a wrong value;
    InvalidURL for a port that cannot be one (also for an engine the caller built)."""
    check_port(url)
    for name in ALL:
        if name in CHOICES:
            choice(url, name, accepted)
        else:
            failover_window(url, accepted)


def driver_options(url: URL) -> list[str]:
    """The names of the URL's query options that reach the driver's connect() (not this module's, not the repeated
    ``host`` of a multi-host URL)."""
    return [name for name in url.query if name not in ALL and name != "host"]


def refused(backend: str, url: URL, exc: BaseException) -> ConnectionConfigError | None:
    """The driver refused the URL's own query options as arguments (an unknown name, a value of the wrong type:
    ``?connect_timeout=abc``) before any server could answer: no retry changes that. None when the URL has no driver
    option to blame. The driver's words are kept (without the URL's password), the option names said."""
    names = driver_options(url)
    if not names:
        return None
    orig = getattr(exc, "orig", None) or exc
    said = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
    if url.password:
        said = said.replace(url.password, "***")
    return ConnectionConfigError(backend, f"the driver refused the URL's options ({', '.join(names)}): {said}",
                                 "give each ?name=value a name the driver's connect() takes and a value of its type")


def driver_url(url: URL) -> URL:
    """`url` without the options of this module: what a plain driver connection (no store) accepts."""
    return url.difference_update_query(ALL)


def install(engine: Engine, adjust: Callable[[dict[str, Any], Any], None]) -> None:
    """Remove the options from every connect() of `engine`, then let `adjust` set the driver's own arguments (it gets
    them and the pool's record of the connection being opened); once per engine: several stores may share one."""
    if engine in _installed:
        return
    _installed.add(engine)

    @event.listens_for(engine, "do_connect")
    def consume(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
        for name in ALL:
            cparams.pop(name, None)
        adjust(cparams, record)


def budget_warning(total: float, window: float | None) -> str | None:
    """What to warn about when a retry budget of `total` seconds is shorter than a failover `window`."""
    if window is None or total >= window:
        return None
    return (f"the retry budget (RetryPolicy.total = {total:g} s) is shorter than this database's failover window"
            f" ({window:g} s, the URL's failover_window): callers would get RetriesExhausted during a failover;"
            f" give the store a RetryPolicy whose total exceeds {window:g} s")
