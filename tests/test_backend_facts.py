"""Each engine's facts live on its backend (and its provisioning module): the registry, install hints, the catalogue
and the conformance suite ask it. A new engine is its dialect module, its provisioning module and one catalogue
entry: a toy third-party backend gets hints, aliases and provisioning without touching anything else."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from datetime import datetime
from typing import Any, ClassVar

import pytest
from sqlalchemy import make_url
from sqlalchemy.engine import URL
from sqlalchemy.sql.elements import ColumnElement

from idem_dialects import dialects
from idem_dialects.dialects.base import Backend
from idem_dialects.dialects.postgresql import PostgreSQLBackend
from idem_dialects.dialects.postgresql_errors import PostgreSQLErrors
from idem_dialects.drivers import Driver
from idem_dialects.engines import ENGINES, Provision, Server, Unavailable, provisioning, require_driver
from idem_dialects.engines.entry import PROVISIONS, register_provision


def test_every_backend_states_its_facts() -> None:
    for name in dialects.names():
        backend = dialects.load(name)
        names = [d.name for d in backend.drivers]
        assert names and len(names) == len(set(names)), name
        assert dialects.async_drivers(backend) == tuple(d.name for d in backend.drivers if d.asynchronous), name
        assert any(d.sync for d in backend.drivers), f"{name} has no sync driver"
        assert provisioning(name) is Provision or issubclass(provisioning(name), Provision)
    assert [n for n in dialects.names() if provisioning(n).embedded] == ["sqlite"]
    assert [n for n in dialects.names() if provisioning(n).plpgsql_baseline] == ["postgresql"]
    # the preferred async driver first
    assert dialects.async_drivers(dialects.load("postgresql")) == ("asyncpg", "psycopg")


def test_aliases_suggest_their_backend() -> None:
    for name in dialects.names():
        for alias in dialects.load(name).aliases:
            assert dialects.did_you_mean(alias) == f"did you mean {name}://?"


def test_bench_hooks() -> None:
    """What the benchmarks ask of an engine instead of testing its name: whether it has a wire to count round trips
    on (not one inside the client's process)."""
    from idem_dialects_bench.wire import no_wire

    assert no_wire(make_url("sqlite:///x.db")) and no_wire(make_url("sqlite+aiosqlite://"))
    assert no_wire(make_url("postgresql+psycopg://u@h/db")) is None
    assert no_wire(make_url("mariadb+asyncmy://u@h/db")) is None


class ToyProvision(Provision):
    wire_protocol = "postgresql"
    default_port = 15432

    @classmethod
    def private_server(cls, backend: str) -> Server:
        return Server(f"{backend}-private", make_url(f"{backend}://u@127.0.0.1:{cls.default_port}/db"), "toy")


class ToyErrors(PostgreSQLErrors):
    """Its errors are PostgreSQL's SQLSTATEs."""


class ToyBackend(Backend):
    """A third-party engine that speaks PostgreSQL's wire protocol (as CockroachDB or YugabyteDB do)."""

    name: ClassVar[str] = "toydb"
    aliases = ("toy",)
    drivers = (Driver("toydriver", "toydb_driver_module", "toydb-driver"),)
    classifier = ToyErrors

    def now_plus(self, seconds: float) -> ColumnElement[datetime]:
        return PostgreSQLBackend.now_plus(self, seconds)


@pytest.fixture
def toy() -> Iterator[type[Backend]]:
    dialects.register("toydb", ToyBackend)
    register_provision("toydb", f"{__name__}:ToyProvision")
    try:
        yield ToyBackend
    finally:
        dialects._registry.pop("toydb", None)
        PROVISIONS.pop("toydb", None)


def test_a_new_engine_is_its_own_modules(toy: type[Backend]) -> None:
    assert dialects.install_hint("toydb", "toydriver") == "pip install 'toydb-driver'"
    assert dialects.install_hint("toydb", "other") == "install the Python driver for toydb+other"
    assert dialects.did_you_mean("toy") == "did you mean toydb://?"
    assert dialects.async_drivers(toy) == () and dialects.usable_drivers(toy) == ()
    with pytest.raises(Unavailable, match=r"toydriver driver is not installed \(pip install 'toydb-driver'\)"):
        require_driver("toydb", "toydriver")
    found = provisioning("toydb")
    assert found is ToyProvision and found.private_server("toydb").how == "toy"
    url: URL = make_url("toydb+toydriver://u@db.example:26257/x")
    assert found.server_address(url) == ("db.example", 26257)
    assert found.driver_url(url, "other").drivername == "toydb+other"


def test_listing_the_catalogue_starts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every entry says how it would be provided without starting a process or opening a socket."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"listing started something: {args[:1]}")

    import socket

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    for entry in ENGINES.values():
        assert entry.ways() and entry.how_to_enable() and entry.backend in dialects.names()
