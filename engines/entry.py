"""The ground floor of the engine catalogue: what an entry is (`CatalogueEntry`), what a provider returns (a live
`Server`) or raises (`Unavailable`), and each backend's test provisioning (`Provision`, found through the backend's
``provision`` reference). Providers build on this module; the catalogue sits on top of them."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import import_module
from importlib.metadata import entry_points
from typing import Any, ClassVar, TypeVar

from sqlalchemy import make_url
from sqlalchemy.engine import URL

from idem_dialects import dialects

from .controls import ClusterControls


class Unavailable(Exception):
    """An engine (or one way of providing it) cannot be had here; the message says why and what would help."""


@dataclass
class Server:
    """A live database for a test session. `url` reaches it; `how` says where it came from; `stop` ends it;
    `restart(pause)` (only for a server this process started) stops it cleanly, waits `pause` seconds and starts it
    again, returning once it answers; `controls` (clusters only) reach single nodes, kill a node or the leader,
    await the failover, rejoin the node; `gone()` says which of its processes exited unasked and how (its exit
    status, its log's last lines), None while they all run: what a failed check reports beside its own error."""

    engine: str
    url: URL
    how: str
    stop: Callable[[], None] = lambda: None
    restart: Callable[[float], None] | None = None
    controls: ClusterControls | None = None
    gone: Callable[[], str | None] = lambda: None


Provider = Callable[["CatalogueEntry"], Server]
P = TypeVar("P", bound=Callable[..., Server])


def described(text: str, *, on_request: bool = False) -> Callable[[P], P]:
    """Mark a provider with what it would do, so a listing can say it without running it. `on_request`: it starts
    servers of its own beyond an embedded one (a cluster, a container), so `idem-dialects matrix` tries it only for
    an engine asked for by name (or with --engine all), never by default."""

    def mark(provider: P) -> P:
        provider.description = text  # type: ignore[attr-defined]
        provider.on_request = on_request  # type: ignore[attr-defined]
        return provider

    return mark


def describe(provider: Provider) -> str:
    """What `provider` would do to provide an engine, said without running it (nothing starts, nothing connects)."""
    return str(getattr(provider, "description", provider.__name__.replace("_", " ")))


def on_request(provider: Provider) -> bool:
    """Whether `provider` starts a cluster or a container: tried only when its engine is asked for."""
    return bool(getattr(provider, "on_request", False))


def env_var(name: str) -> str:
    """The environment variable that gives an engine's URL: IDEM_URL_ + the name upper-cased, '-'/'.' -> '_'."""
    return "IDEM_URL_" + name.upper().replace("-", "_").replace(".", "_")


def from_env(entry: CatalogueEntry) -> Server:
    value = os.environ.get(env_var(entry.name))
    if not value:
        raise Unavailable(f"{env_var(entry.name)} is not set")
    return Server(entry.name, make_url(value), f"URL from {env_var(entry.name)}")


class EntryUnavailable(Unavailable):
    """Every provider of an entry failed: `reasons` (one per provider, in order) and `hint` (how to enable);
    `held_back`: the providers not tried because they start servers and the engine was not asked for."""

    def __init__(self, engine: str, reasons: Sequence[str], hint: str, held_back: Sequence[str] = ()) -> None:
        self.engine = engine
        self.reasons = list(reasons)
        self.hint = hint
        self.held_back = list(held_back)
        super().__init__("; ".join(self.reasons) + f"; to enable: {hint}")


@dataclass(frozen=True)
class CatalogueEntry:
    """One engine of the matrix: its backend and the ways to provide it, tried in order (after the env URL).
    Reading an entry starts nothing; `provide` does."""

    name: str
    backend: str
    title: str
    providers: Sequence[Provider] = field(default_factory=tuple)
    enable_hint: str = ""
    url_example: str = ""
    # HA stacks: the longest failover measured here, in seconds (RetryPolicy.total must exceed it).
    failover_window: float | None = None
    # HA and pooling stacks: the engine whose server software they run (the same PostgreSQL, the same MariaDB). Run
    # beside it, a stack runs only the checks of what it adds (conformance's `idem_stack` checks).
    stacked_on: str | None = None

    def how_to_enable(self) -> str:
        """One line: the env var and URL shape, then whatever else would provide this engine."""
        parts = [f"set {env_var(self.name)}={self.url_example or '<SQLAlchemy URL>'}"]
        if self.enable_hint:
            parts.append(self.enable_hint)
        images = [p.image for p in self.providers if hasattr(p, "image")]
        if images:
            parts.append(f"or start a Docker engine so testcontainers can run {images[0]}")
        return ", ".join(parts[:1]) + "".join(f"; {p}" for p in parts[1:])

    def ways(self) -> list[str]:
        """How this entry would be provided here, in order, said without trying any way."""
        from_url = [f"the URL in {env_var(self.name)}"] if os.environ.get(env_var(self.name)) else []
        return from_url + [describe(p) for p in self.providers]

    def provide(self, start_on_request: bool = True) -> Server:
        """A live server from the first provider that has one. `start_on_request=False` skips the providers that
        start a cluster or a container (what `matrix` does for the engines it was not asked for by name)."""
        reasons, held_back = [], []
        for provider in (from_env, *self.providers):
            if not start_on_request and on_request(provider):
                held_back.append(describe(provider))
                continue
            try:
                return provider(self)
            except Unavailable as exc:
                reasons.append(str(exc))
        raise EntryUnavailable(self.name, reasons, self.how_to_enable(), held_back)


class Provision:
    """One backend's test provisioning, as SQLAlchemy's ``dialects/<engine>/provision.py``: what the catalogue, the
    conformance suite and the benchmark need of an engine and the library never does. Registered by backend name
    (`PROVISIONS`, or the ``idem_dialects.provisions`` entry-point group); this base is what a backend without one
    gets (nothing can be started or cut)."""

    # The database lives in the client's process: there is no server to restart and no connection to cut.
    embedded: ClassVar[bool] = False
    # The benchmark's baseline written as a PL/pgSQL function (the same debit, once per key) runs on this engine.
    plpgsql_baseline: ClassVar[bool] = False

    # The wire protocol of this engine's servers, for the conformance fault proxy ("postgresql", "mysql").
    wire_protocol: ClassVar[str | None] = None
    default_port: ClassVar[int | None] = None
    # How a check ends another session: SQL run on that session for its id, SQL that ends session {id}.
    session_id_sql: ClassVar[str | None] = None
    end_session_sql: ClassVar[str | None] = None
    # How a check makes a database of its own on the same server, and drops it ({name}: a plain identifier).
    create_database_sql: ClassVar[str | None] = None
    drop_database_sql: ClassVar[str | None] = None

    @classmethod
    def container(cls, image: str, backend: str) -> tuple[Any, URL]:
        """Start a testcontainers container of `image`: (the started container, a URL reaching it)."""
        raise Unavailable(f"no container recipe for {backend}")

    @classmethod
    def database_files(cls, url: URL) -> tuple[str, ...]:
        """The files the database at `url` is kept in on this machine, which connecting creates when they are
        missing (so a command that made them for a trial, `check`, can remove them); none for a server's."""
        return ()

    @classmethod
    def private_server(cls, backend: str) -> Server:
        """A server of `backend` this process starts (and so may restart and stop), never the machine's own."""
        raise Unavailable(f"no way to start a private {backend} server here")

    @classmethod
    def driver_url(cls, url: URL, driver: str) -> URL:
        """`url` (of this backend's default driver) for another of its drivers, which may spell the same place
        differently."""
        return url.set(drivername=f"{url.get_backend_name()}+{driver}")

    @classmethod
    def server_address(cls, url: URL) -> tuple[str, int] | str:
        """Where the server of `url` listens: (host, port), or a Unix socket path."""
        port = url.port or cls.default_port
        if port is None:
            raise NotImplementedError(f"{url.get_backend_name()} has no default port to reach")
        return url.host or "127.0.0.1", port

    @classmethod
    def plaintext_url(cls, url: URL, host: str, port: int) -> URL:
        """`url` pointed at `host`:`port` without TLS (a proxy in between must read the protocol)."""
        return url.set(host=host, port=port)


PROVISIONS: dict[str, str] = {
    "sqlite": "idem_dialects.engines.provisions.sqlite:SQLiteProvision",
    "postgresql": "idem_dialects.engines.provisions.postgresql:PostgreSQLProvision",
    "mysql": "idem_dialects.engines.provisions.mysql:MySQLProvision",
    "mariadb": "idem_dialects.engines.provisions.mysql:MariaDBProvision",
    "mssql": "idem_dialects.engines.provisions.mssql:MSSQLProvision",
    "oracle": "idem_dialects.engines.provisions.oracle:OracleProvision",
}
PROVISIONS_GROUP = "idem_dialects.provisions"


def register_provision(backend: str, reference: str) -> None:
    """Register a backend's `Provision` ("module:Class"), as `idem_dialects.dialects.register` registers the backend;
    a distribution may instead name it under the ``idem_dialects.provisions`` entry-point group."""
    PROVISIONS[backend] = reference


def provisioning(backend: str) -> type[Provision]:
    """The `Provision` of a backend (by dialect name), imported only now."""
    reference = PROVISIONS.get(backend) or next(
        (ep.value for ep in entry_points(group=PROVISIONS_GROUP) if ep.name == backend), None)
    if reference is None:
        return Provision
    module, _, attr = reference.partition(":")
    found = getattr(import_module(module), attr)
    if not (isinstance(found, type) and issubclass(found, Provision)):
        raise TypeError(f"{reference!r}, the provision of {backend!r}, is not a Provision subclass")
    return found


def require_driver(backend: str, driver: str) -> None:
    """Unavailable, saying what to install, unless `backend+driver` can be imported here."""
    known = dialects.driver(dialects.load(backend), driver)
    problem = known.problem() if known is not None else f"{backend}+{driver} is not a driver idem-dialects knows"
    if problem is not None:
        raise Unavailable(problem)
