"""Probing catalogue entries for the commands: provide an engine, check that it answers, and say why not when it
cannot (`provision`). Listing the catalogue needs none of this: read `ENGINES` (`CatalogueEntry.ways`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.engine import URL, Dialect, Engine

from idem_dialects.dialects.options import driver_url
from idem_dialects.url import parse

from .catalogue import ENGINES
from .entry import EntryUnavailable, Server, Unavailable, env_var


@dataclass
class EngineStatus:
    """What provisioning found for one engine."""

    name: str
    required: bool
    server: Server | None = None
    reason: str | None = None
    hint: str | None = None
    server_version: str | None = None
    # Not run because every way to have it here starts a cluster or a container, and it was not asked for.
    on_request: bool = False

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
            "on_request": self.on_request,
            "env_var": env_var(self.name),
        }


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # an engine's name: what a report's column is headed by


def parse_named_urls(items: Sequence[str], option: str) -> dict[str, URL]:
    """``NAME=URL`` command-line values (of `option`) as a mapping; ValueError names a malformed pair, InvalidURL
    (never repeating the text: it may hold a password) a URL that is not one."""
    urls: dict[str, URL] = {}
    for item in items:
        name, sep, url = item.partition("=")
        if not sep or not _NAME.fullmatch(name) or not url:
            # Never the item itself: a URL given without its NAME= holds its password, if it has one.
            given = "a URL without NAME=" if "://" in item else f"{item!r}"
            raise ValueError(f"{option} wants NAME=URL, e.g. {option} mydb=postgresql+psycopg://app@db/app; got"
                             f" {given}")
        urls[name] = parse(url)
    return urls


def provision(name: str, urls: Mapping[str, URL], required: bool = False,
              server_version: str | None = None, start_on_request: bool = True) -> EngineStatus:
    """Provide one engine (a URL given on the command line wins) and check it answers a connection, unless the
    caller already connected to the URL it gave and says what answered (`server_version`, as `version_text`).
    `start_on_request=False`: do not start a cluster or a container for it (`CatalogueEntry.provide`)."""
    status = EngineStatus(name, required)
    try:
        if name in urls:
            server = Server(name, urls[name], "URL given on the command line")
        else:
            server = ENGINES[name].provide(start_on_request)
    except EntryUnavailable as exc:
        status.reason, status.hint = "; ".join(exc.reasons), exc.hint
        if exc.held_back:
            status.on_request = True
            status.reason = "; ".join([*exc.reasons, f"not started unless asked for: {'; '.join(exc.held_back)}"])
            status.hint = f"idem-dialects matrix --engine {name} (or --engine all); {exc.hint}"
        return status
    except Unavailable as exc:
        status.reason = str(exc)
        return status
    try:
        status.server_version = server_version if name in urls and server_version else probe(server.url)
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
    """Connect once with plain SQLAlchemy and return the server's version. A failure is told as the store tells it
    (the backend's `connect_error`: a wrong password, an unknown database or host say so), else raised as it is."""
    engine = create_engine(driver_url(url))  # without the options only a store's backend consumes
    try:
        with engine.connect() as conn:
            return version_text(conn.dialect)
    except Exception as exc:
        problem = _classified(engine, exc)
        if problem is None:
            raise
        raise problem from exc
    finally:
        engine.dispose()


def _classified(engine: Engine, exc: BaseException) -> Exception | None:
    from idem_dialects import dialects

    try:
        backend = dialects.load(engine.url.get_backend_name())(engine)
    except Exception:  # no backend for it here: the driver's own error says what failed
        return None
    return backend.errors.connect_error(exc)


def version_text(dialect: Dialect) -> str:
    """What answered, once a connection initialized `dialect`: e.g. "postgresql 15.20"."""
    info = dialect.server_version_info
    return f"{dialect.name} {'.'.join(str(part) for part in info) if info else 'unknown'}"
