"""A provider that needs neither Docker nor a binary of ours: a server already listening on its standard local
port. (Engine-specific providers, such as the embedded PostgreSQL or an SQLite file, live in each backend's
provisioning module beside its dialect.)"""

from __future__ import annotations

import socket

from sqlalchemy import make_url

from .entry import CatalogueEntry, Provider, Server, Unavailable, described
from .started import refused


def local_service(url: str) -> Provider:
    """A server on this machine's standard port, if something listens there (checked without a driver)."""
    parsed = make_url(url)

    def provide(entry: CatalogueEntry) -> Server:
        refused()
        host, port = parsed.host or "127.0.0.1", parsed.port
        assert port is not None
        try:
            socket.create_connection((host, port), timeout=0.5).close()
        except OSError as exc:
            raise Unavailable(f"nothing listening on {host}:{port} ({exc.strerror or exc})") from None
        return Server(entry.name, parsed, f"local service at {host}:{port}")

    return described(f"a server already listening on {parsed.host or '127.0.0.1'}:{parsed.port}")(provide)
