"""One home for a database URL: which backend, which driver, sync or async, and the engine built from it.

Every caller (both stores' `from_url`, the CLI, the conformance suite) asks `target(url)`; nothing else parses a URL
or decides whether its driver is asyncio-only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, create_engine, create_mock_engine, make_url
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from . import dialects
from .dialects import options as driver_options
from .dialects.classify import PERCENT_ENCODING
from .drivers import E
from .errors import ConfigurationError, InvalidURL, MissingDriver

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from .dialects.base import Backend


# The host part of a URL's text: between "://" (and any USER[:PASSWORD]@) and the path, query or end.
_HOST_PART = re.compile(r"^[\w+.-]+://(?:[^@/?#]*@)?([^/?#]*)")
# A URL's text read as its writer meant it when the user name or password holds an "@": what comes before its last
# "@" is USER[:PASSWORD], what follows is the host and the rest.
_LAST_AT = re.compile(r"^(?P<scheme>[\w+.-]+://)(?P<userinfo>.*)@(?P<rest>[^@]*)$", re.S)

ENCODE_COMMAND = """python3 -c 'import getpass, urllib.parse; print(urllib.parse.quote(getpass.getpass(), safe=""))'"""


def parse(url: str | URL) -> URL:
    """`make_url`, with InvalidURL (never repeating the text: it may hold a password) for what is not a URL, for a
    user name or password holding an unencoded "@" (SQLAlchemy would take the rest of it for the host), for
    several hosts in its host part and for a port outside 1-65535 (which drivers would take for a host that does
    not answer, and retry)."""
    if isinstance(url, str) and (problem := unencoded(url)) is not None:
        raise problem
    if isinstance(url, str) and (found := _HOST_PART.match(url)) is not None and "," in found.group(1):
        raise InvalidURL("the URL's host part names several hosts (HOST1:PORT1,HOST2:PORT2), and holds one",
                         several_hosts(url))
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise InvalidURL() from None
    except ValueError:  # SQLAlchemy's int() of the port
        raise InvalidURL("the port in the URL is not a number") from None
    driver_options.check_port(parsed)
    return parsed


def unencoded(text: str) -> InvalidURL | None:
    """InvalidURL if an "@" in the password of `text` is not percent-encoded: SQLAlchemy ends the password at its
    first "@", so the host it reads holds an "@" (or its port is not a number). The fix shows the URL with the
    password as a placeholder, how to encode one, and a command that encodes it from a prompt: the password itself
    is never printed, encoded or not."""
    found = _LAST_AT.match(text)
    if found is None or "@" not in found["userinfo"]:
        return None
    try:
        host = make_url(text).host or ""
    except (ArgumentError, ValueError):
        host = "@"  # the text after the first "@" did not even read as a host and port
    if "@" not in host:
        return None  # read as meant (SQLAlchemy takes an "@" in the user name; one in the query is no concern)
    user = found["userinfo"].partition(":")[0]
    return InvalidURL("the URL's password holds an '@' that is not percent-encoded, so what follows it was read as"
                      " the host", f"percent-encode the password: {found['scheme']}{user}:<password, percent-encoded>"
                      f"@{found['rest']} (write {PERCENT_ENCODING}; this prints a password encoded:"
                      f" {ENCODE_COMMAND})")


def several_hosts(url: str) -> str | None:
    """How the backend of `url` takes several hosts (its `several_hosts` form), or None: the general form."""
    scheme = url.partition("://")[0].partition("+")[0]
    try:
        form = dialects.load(scheme).several_hosts
    except Exception:  # not a backend we know: the general form
        return None
    return (f"this backend takes several hosts as {form}" if form else
            "this backend connects to one host: name one (a load balancer or proxy, if several serve it)")


@dataclass(frozen=True)
class Target:
    """A URL resolved: the backend its dialect name selects and the driver SQLAlchemy will load for it."""

    url: URL  # what engines are built from (a bare URL may have been given the installed driver)
    backend: type[Backend]
    driver: str
    asyncio_only: bool  # asyncpg, aiosqlite, asyncmy, aioodbc: usable by AsyncIdempotencyStore only
    async_capable: bool  # has an asyncio form (psycopg and oracledb have both)

    @property
    def drivername(self) -> str:
        return self.url.drivername

    def engine_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """`create_engine` options for a store's own engine: ``hide_parameters`` unless the caller says otherwise,
        so no stored response, token or request value reaches an error message or a log line (SQLAlchemy's
        ``echo`` included), then what the backend needs."""
        return self.backend.engine_options(self.url, {"hide_parameters": True, **options})

    def _own(self, create: Callable[..., E], options: dict[str, Any]) -> E:
        known = dialects.driver(self.backend, self.driver)
        return create(self.url, **options) if known is None else known.own_engine(partial(create, self.url), options)

    def install_hint(self) -> str:
        return dialects.install_hint(self.backend.name, self.driver)

    def missing_driver(self, exc: ImportError) -> MissingDriver:
        """The driver's import failed: its package is absent, or (installed) a system library it links is."""
        known = dialects.driver(self.backend, self.driver)
        missing = known.missing_libraries() if known is not None and known.installed() else []
        return MissingDriver(self.drivername, self.install_hint(), exc, missing[0].soname if missing else None)

    def create_engine(self, **options: Any) -> Engine:
        """A sync engine with the store's options; MissingDriver (saying what to install) if the driver cannot load,
        ConnectionConfigError if SQLAlchemy's dialect already refuses a query option's value (PyMySQL's int())."""
        try:
            return self._own(create_engine, self.engine_options(options))
        except ImportError as exc:
            raise self.missing_driver(exc) from exc
        except (TypeError, ValueError) as exc:
            raise (driver_options.refused(self.backend.name, self.url, exc) or exc) from exc

    def create_async_engine(self, **options: Any) -> AsyncEngine:
        """An AsyncEngine with the store's options (imports SQLAlchemy's asyncio layer, which needs greenlet)."""
        if find_spec("greenlet") is None:
            raise MissingDriver(self.drivername, "pip install 'idem-dialects[async]' (asyncio needs greenlet)",
                                ModuleNotFoundError("No module named 'greenlet'"))
        from sqlalchemy.ext.asyncio import create_async_engine

        try:
            return self._own(create_async_engine, self.engine_options(options))
        except ImportError as exc:
            raise self.missing_driver(exc) from exc
        except (TypeError, ValueError) as exc:
            raise (driver_options.refused(self.backend.name, self.url, exc) or exc) from exc


def target(url: str | URL) -> Target:
    """Resolve `url` without connecting: InvalidURL, UnsupportedEngine (no backend for its dialect) or a
    ConfigurationError (SQLAlchemy has no such driver) now, rather than a connection error later."""
    parsed = parse(url)
    backend = dialects.load(parsed.get_backend_name())
    parsed = backend.resolve_url(parsed)
    try:
        dialect = parsed.get_dialect()
    except NoSuchModuleError:
        name, _, driver = parsed.drivername.partition("+")
        raise ConfigurationError(f"SQLAlchemy has no driver {driver!r} for {name}:// URLs; leave it out"
                                 f" ({name}://) for the default, or see the docs (Engines)") from None
    asynchronous = dialect.get_async_dialect_cls(parsed)
    return Target(parsed, backend, dialect.driver, bool(getattr(dialect, "is_async", False)),
                  bool(getattr(asynchronous, "is_async", False)))


def existing_database(url: str | URL) -> URL:
    """`url` resolved, in the backend's form that opens the database only if it exists: what commands that read or
    maintain a store (stats, purge) connect with, so a mistyped path is an error rather than a new empty database."""
    resolved = target(url)
    return resolved.backend.existing_database_url(resolved.url)


def offline(url: str | URL, executor: Callable[..., object] = lambda *args, **kwargs: None) -> Backend:
    """The backend of `url` (or of a bare backend name: ``postgresql`` stands for ``postgresql://``) on a mock engine
    whose statements go to `executor`: DDL compiled by SQLAlchemy's own dialect, without a driver or a server."""
    text = url.render_as_string(hide_password=False) if isinstance(url, URL) else url
    parsed = parse(text if "://" in text else f"{text}://")
    backend = dialects.load(parsed.get_backend_name())
    return backend(create_mock_engine(backend.resolve_url(parsed), executor))  # type: ignore[arg-type]


def async_drivers_hint(backend: type[Backend]) -> str:
    names = [f"{backend.name}+{driver}" for driver in dialects.async_drivers(backend)]
    return " or ".join(names) if names else f"no async driver is declared for {backend.name}"


def async_url(url: str | URL, driver: str | None = None) -> URL:
    """The URL of the same database through an async driver: `url` itself if its driver is asyncio-only, else
    `driver` or the first async driver the backend declares that is installed here (MissingDriver if none is)."""
    resolved = target(url)
    if resolved.asyncio_only:
        return resolved.url
    chosen = driver or next(iter(dialects.usable_drivers(resolved.backend, asynchronous=True)), None)
    if chosen is None:
        raise MissingDriver(resolved.drivername, "pip install 'idem-dialects[async]'",
                            ModuleNotFoundError(f"no async driver for {resolved.backend.name} is installed"))
    return resolved.url.set(drivername=f"{resolved.backend.name}+{chosen}")
