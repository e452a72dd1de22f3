"""pytest plugin (entry point ``pytest11``): engine selection, provisioning, per-test isolation, observations.

Options: ``--idem-engine NAME`` (repeatable, or ``all``; default all; a family name such as ``mssql`` means every
``mssql-*`` engine), ``--idem-url NAME=URL`` (repeatable; a name not in the catalogue defines an ad-hoc engine,
e.g. a third-party backend), ``--idem-require NAME`` (repeatable, or ``all``): a required engine that cannot be
provisioned fails its checks instead of skipping. A required engine is run even if ``--idem-engine`` omits it.

Each check is a ``test_<id>`` function; `check_id` and `check_statement` give its stable id and the one-line
guarantee it proves (the docstring's first sentence). Checks record measured facts with the `observe` fixture.
"""

from __future__ import annotations

import itertools
import os
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from idem_dialects.engines import ENGINES, Server, Unavailable, expand, resolve
from sqlalchemy import make_url
from sqlalchemy.engine import URL

from idem_dialects import IdempotencyStore, dialects
from idem_dialects.features import Features

from .naming import OBSERVATION, PROVISIONED
from .support import Effects, stores

_counter = itertools.count()


@dataclass
class EngineUnderTest:
    name: str
    server: Server
    _features: Features | None = None

    @property
    def url(self) -> URL:
        return self.server.url

    @property
    def backend(self) -> str:
        return self.url.get_backend_name()

    @property
    def features(self) -> Features:
        """The backend's features for this database, refined from the live server where the server decides (a
        Galera node's claims are not exclusive); the URL's features if the server cannot be reached."""
        if self._features is None:
            self._features = dialects.load(self.backend).url_features(self.url)
            try:
                probe = IdempotencyStore.from_url(self.url, table_prefix="idem_probe_")
                try:
                    with probe.engine.connect() as conn:
                        self._features = probe.backend.live_features(conn)
                finally:
                    probe.engine.dispose()
            except Exception:  # unreachable: the checks themselves then fail with the real error
                pass
        return self._features

    @property
    def capabilities(self) -> frozenset[str]:
        features = self.features
        flags = {name for name in features.flags() if features.has(name)}
        # Clusters the catalogue runs itself can be driven (kill a node, promote a standby) by the cluster checks.
        controls = self.server.controls
        cluster = set() if controls is None else {"cluster", f"cluster:{controls.kind}"}
        return frozenset(flags | cluster | {f"isolation:{lvl}" for lvl in features.isolation_levels})


class Sessions:
    """The servers of one pytest session, started on first use and stopped at its end."""

    def __init__(self, config: pytest.Config) -> None:
        self.urls: dict[str, URL] = {}
        for item in config.getoption("idem_url") or []:
            name, sep, url = item.partition("=")
            if not sep or not name or not url:
                raise pytest.UsageError(f"--idem-url wants NAME=URL, got {item!r}")
            self.urls[name] = make_url(url)
        adhoc = [n for n in self.urls if n not in ENGINES]
        try:
            chosen = expand(config.getoption("idem_engine") or ["all"], adhoc)
            required_names = config.getoption("idem_require") or []
            required = expand(required_names, adhoc)
        except KeyError as exc:
            hint = "an engine outside the catalogue needs --idem-url NAME=URL"
            raise pytest.UsageError(f"{exc.args[0]}; {hint}") from None
        self.names = list(dict.fromkeys(chosen + required))
        self.required = set(self.names) if "all" in required_names else set(required)
        self._servers: dict[str, Server | Unavailable] = {}
        self._owned: set[str] = set()  # servers this session started, and so stops
        for plugin in config.pluginmanager.get_plugins():
            provisioned = getattr(plugin, PROVISIONED, None)
            if isinstance(provisioned, dict):
                self._servers.update(provisioned)

    def server(self, name: str) -> Server:
        if name not in self._servers:
            try:
                if name in self.urls:
                    self._servers[name] = Server(name, self.urls[name], "URL from --idem-url")
                else:
                    self._servers[name] = resolve([name])[0].provide()
                    self._owned.add(name)
            except Unavailable as exc:
                self._servers[name] = exc
        found = self._servers[name]
        if isinstance(found, Unavailable):
            raise found
        return found

    def close(self) -> None:
        for name in self._owned:
            server = self._servers[name]
            if isinstance(server, Server):
                server.stop()


_SESSIONS = pytest.StashKey[Sessions]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("idem-dialects", "idem-dialects conformance")
    group.addoption("--idem-engine", action="append", metavar="NAME",
                    help="engine to run the checks on (repeatable; 'all'; a family such as 'mssql')")
    group.addoption("--idem-url", action="append", metavar="NAME=URL", help="database URL for an engine (repeatable)")
    group.addoption("--idem-require", action="append", metavar="NAME",
                    help="fail instead of skipping if this engine cannot be provisioned (repeatable; 'all')")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "requires(*capabilities): the backend capabilities a check needs")
    config.stash[_SESSIONS] = Sessions(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _SESSIONS in config.stash:
        config.stash[_SESSIONS].close()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "idem_engine" in metafunc.fixturenames:
        names = metafunc.config.stash[_SESSIONS].names
        metafunc.parametrize("idem_engine", names, indirect=True, ids=names, scope="session")


@pytest.fixture(scope="session")
def idem_engine(request: pytest.FixtureRequest) -> EngineUnderTest:
    sessions = request.config.stash[_SESSIONS]
    name: str = request.param
    try:
        return EngineUnderTest(name, sessions.server(name))
    except Unavailable as exc:
        if name in sessions.required:
            pytest.fail(f"required engine {name} is unavailable: {exc}", pytrace=False)
        pytest.skip(f"{name} unavailable: {exc}")


@pytest.fixture(autouse=True)
def _idem_requires(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("requires")
    if marker is None or "idem_engine" not in request.fixturenames:
        return
    engine: EngineUnderTest = request.getfixturevalue("idem_engine")
    missing = [cap for cap in marker.args if cap not in engine.capabilities]
    if missing:
        pytest.skip(f"{engine.backend} backend at {engine.url.render_as_string()} lacks {', '.join(missing)}")


def unique_prefix() -> str:
    """A table prefix no other test (or process) uses: isolation by prefix works on every engine."""
    return f"c{os.getpid() % 10000}{next(_counter)}{secrets.token_hex(2)}_"


@pytest.fixture
def make_store(idem_engine: EngineUnderTest) -> Iterator[Callable[..., IdempotencyStore]]:
    """Stores on one set of fresh tables; extra keyword arguments go to create_engine (e.g. isolation_level)."""
    with stores(idem_engine.url, unique_prefix()) as make:
        yield make


@pytest.fixture
def store(make_store: Callable[..., IdempotencyStore]) -> IdempotencyStore:
    return make_store()


@pytest.fixture
def observe(request: pytest.FixtureRequest) -> Callable[[str, object], None]:
    """Record a measured fact for the matrix's behaviour table: observe("duplicate resolved by", "waiting")."""

    def record(name: str, value: object) -> None:
        request.node.user_properties.append((OBSERVATION, (name, value)))

    return record


@pytest.fixture
def effects(store: IdempotencyStore) -> Iterator[Effects]:
    """The business table effects write to, on the same database and prefix as `store`."""
    fx = Effects(store)
    fx.create()
    yield fx
    fx.drop()
