"""pytest plugin: engine selection, provisioning, per-test isolation, observations.

Opt-in, never auto-loaded: a project enables it with ``pytest_plugins = ["idem_dialects.conformance.plugin"]`` in
its ``conftest.py`` (or ``-p idem_dialects.conformance.plugin``). Every fixture and marker it adds is prefixed
``idem_``, so it cannot shadow a project's own ``store`` or ``requires``.

Options: ``--idem-engine NAME`` (repeatable, or ``all``; default all; a family name such as ``mssql`` means every
``mssql-*`` engine), ``--idem-url NAME=URL`` (repeatable; a name not in the catalogue defines an ad-hoc engine,
e.g. a third-party backend), ``--idem-require NAME`` (repeatable, or ``all``): a required engine that cannot be
provisioned fails its checks instead of skipping. A required engine is run even if ``--idem-engine`` omits it.
``--idem-api sync|async|both`` (default sync) picks the store: ``async`` runs every check on AsyncIdempotencyStore
once per installed async driver of the engine (columns ``<engine>-<driver>``, e.g. ``postgresql-18-asyncpg``).
An HA or pooling stack run beside the engine whose server it runs (`CatalogueEntry.stacked_on`: Patroni and PgBouncer
beside ``postgresql``, Galera beside ``mariadb``) runs only the checks marked ``idem_stack``: what it adds (nodes, a
pooler, faults on the wire, races through it) and the protocol's smoke; alone, it runs every check.

Each check is a ``test_<id>`` function; `check_id` and `check_statement` give its stable id and the one-line
guarantee it proves (the docstring's first sentence). Checks record measured facts with the `idem_observe`
fixture (through pytest's ``record_property``, so ``--junitxml`` carries them too).
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import secrets
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy.engine import URL

from idem_dialects import IdempotencyStore, UnsupportedEngine, dialects
from idem_dialects.engines import ENGINES, Server, Unavailable, expand, parse_named_urls, provisioning, resolve
from idem_dialects.errors import InvalidURL
from idem_dialects.features import Features

from .faultproxy import PROTOCOLS, FaultProxy, wire_protocol
from .naming import PROVISIONED, check_id, observation_property
from .support import Effects, effects_table, stores

_counter = itertools.count()


def async_url(url: URL, driver: str) -> URL:
    """`url` with its driver replaced by the async `driver` (the bridge, and so greenlet, is loaded only if used)."""
    return url.set(drivername=f"{url.get_backend_name()}+{driver}")


@dataclass
class EngineUnderTest:
    name: str  # the matrix column: the engine, plus "-<driver>" for the async store (e.g. postgresql-18-asyncpg)
    server: Server
    driver: str | None = None  # the async driver the checks run AsyncIdempotencyStore on; None: the sync store

    @property
    def url(self) -> URL:
        return self.server.url if self.driver is None else async_url(self.server.url, self.driver)

    @property
    def backend(self) -> str:
        return self.url.get_backend_name()

    @functools.cached_property
    def features(self) -> Features:
        """The backend's features on this database, refined from the live server (one connection, once)."""
        with IdempotencyStore.from_url(self.server.url) as store:
            with store.transaction():  # the store's first transaction refines its features from the server
                pass
            return store.features


def declared_isolation_levels(name: str, url: URL | None) -> tuple[str, ...]:
    """The isolation levels the backend of engine `name` declares, known without provisioning it (the isolation
    race is parametrized from them at collection; a level the live server turns out not to offer is skipped)."""
    spec = ENGINES.get(name)
    backend = url.get_backend_name() if url is not None else spec.backend if spec is not None else None
    try:
        cls = dialects.load(backend or "")
    except UnsupportedEngine:  # reported when the engine is used; collection still names its checks
        return Features().isolation_levels
    return (cls.url_features(url) if url is not None else cls.base_features).isolation_levels


def check_feature_names(metafunc: pytest.Metafunc) -> None:
    """An unknown name in ``idem_requires`` is a collection error (a typo must not skip a check everywhere)."""
    known = Features.flags()
    for marker in metafunc.definition.iter_markers("idem_requires"):
        unknown = [name for name in marker.args if name not in known]
        if unknown:
            pytest.fail(f"{metafunc.definition.nodeid}: @pytest.mark.idem_requires names unknown feature(s)"
                        f" {', '.join(map(repr, unknown))}; known features: {', '.join(sorted(known))}",
                        pytrace=False)


class Sessions:
    """The servers of one pytest session, started on first use and stopped at its end."""

    def __init__(self, config: pytest.Config) -> None:
        try:
            self.urls: dict[str, URL] = parse_named_urls(config.getoption("idem_url") or [], "--idem-url")
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
        except InvalidURL as exc:  # never repeats the URL: it may hold a password
            raise pytest.UsageError(f"--idem-url: {exc}") from None
        adhoc = [n for n in self.urls if n not in ENGINES]
        try:
            chosen = expand(config.getoption("idem_engine") or ["all"], adhoc)
            required_names = config.getoption("idem_require") or []
            required = expand(required_names, adhoc)
        except KeyError as exc:
            hint = "an engine outside the catalogue needs --idem-url NAME=URL"
            raise pytest.UsageError(f"{exc.args[0]}; {hint}") from None
        self.names = list(dict.fromkeys(chosen + required))
        # Matrix columns: engine -> (engine, None) for the sync store, engine-driver -> (engine, driver) for the async.
        api = config.getoption("idem_api") or "sync"
        self.columns: dict[str, tuple[str, str | None]] = {}
        for name in self.names:
            if api in ("sync", "both"):
                self.columns[name] = (name, None)
            if api in ("async", "both"):
                backend = ENGINES[name].backend if name in ENGINES else self.urls[name].get_backend_name()
                drivers = dialects.usable_drivers(dialects.load(backend), asynchronous=True)
                self.columns.update({f"{name}-{driver}": (name, driver) for driver in drivers})
        self.required = set(self.names) if "all" in required_names else set(required)
        # Stacks run beside their base engine (Patroni or PgBouncer beside PostgreSQL, Galera beside MariaDB): there
        # they run only the `idem_stack` checks; the others would prove the same server software twice.
        self.beside_base = {n for n in self.names if n in ENGINES and ENGINES[n].stacked_on in self.names}
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
        owned, self._owned = self._owned, set()
        for name in owned:
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
    group.addoption("--idem-api", choices=("sync", "async", "both"), default=None,
                    help="run the checks on IdempotencyStore (sync, the default), on AsyncIdempotencyStore with each"
                         " installed async driver of the engine (async), or both")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "idem_requires(*features): the backend features a check needs")
    config.addinivalue_line("markers", "idem_api(name): a check of one API only (its columns only: 'sync'/'async')")
    config.addinivalue_line("markers", "idem_disruptive: a check that breaks its server for good (kills a node or"
                                       " the primary); runs after every other check")
    config.addinivalue_line("markers", "idem_stack: a check of what an HA or pooling stack adds to the engine it runs"
                                       " (nodes, a pooler, the wire, races through them) or of the protocol's smoke;"
                                       " beside its base engine a stack runs only these")
    config.stash[_SESSIONS] = Sessions(config)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the servers this session started before it reports its end: a pytest-xdist worker is ended 10 s after it
    reports, and a stop cut off there left processes behind (a Patroni cluster's etcd members, stopped after its
    nodes). Only this session's: a session run inside another (`check` in-process) leaves the outer one's alone."""
    if _SESSIONS in session.config.stash:
        session.config.stash[_SESSIONS].close()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _SESSIONS in config.stash:  # a run that ended before its session finished
        config.stash[_SESSIONS].close()


@pytest.hookimpl(tryfirst=True)  # the engine is the first part of every check's parameter id (see naming.check_id)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    check_feature_names(metafunc)
    if "idem_engine" not in metafunc.fixturenames:
        return
    sessions = metafunc.config.stash[_SESSIONS]
    marker = metafunc.definition.get_closest_marker("idem_api")
    only = marker.args[0] if marker is not None else None
    stack_check = metafunc.definition.get_closest_marker("idem_stack") is not None
    names = [c for c, (engine, driver) in sessions.columns.items()
             if (only is None or (driver is None) == (only == "sync"))
             and (stack_check or engine not in sessions.beside_base)]
    if "idem_isolation_level" in metafunc.fixturenames:  # one variant per level each engine's backend declares
        engine_of = {column: engine for column, (engine, _) in sessions.columns.items()}
        pairs = [(name, level) for name in names
                 for level in declared_isolation_levels(engine_of[name], sessions.urls.get(engine_of[name]))]
        metafunc.parametrize(("idem_engine", "idem_isolation_level"), pairs, indirect=["idem_engine"],
                             ids=[f"{name}-{level}" for name, level in pairs], scope="session")
    else:
        metafunc.parametrize("idem_engine", names, indirect=True, ids=names, scope="session")


@pytest.hookimpl(trylast=True)  # after pytest grouped the checks by engine column
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect a check of one API (``idem_api``) when no column of this run uses that API, rather than leave an
    empty-parameter skip in the report; run checks that break their server (``idem_disruptive``) last."""
    unused = [item for item in items if not isinstance(_engine_param(item), str | type(None))]
    if unused:
        config.hook.pytest_deselected(items=unused)
        items[:] = [item for item in items if item not in unused]
    # Servers are shared by every column of an engine (sync and async stores): a check that kills a node or the
    # primary must come after all the others, whatever the column or module order (a stable sort keeps the rest).
    items.sort(key=lambda item: item.get_closest_marker("idem_disruptive") is not None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport,
                                                                                          pytest.TestReport]:
    """A failed check says whether a process of its server exited meanwhile (how, and its log's last lines): a pooler
    or a node that died fails every later check on that server, and its log goes with its temp dir."""
    report = yield
    engine = getattr(item, "funcargs", {}).get("idem_engine")
    if report.failed and isinstance(engine, EngineUnderTest):
        why = engine.server.gone()
        if why:
            report.sections.append(("idem-dialects: the server", why))
    return report


def _engine_param(item: pytest.Item) -> object:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("idem_engine") if callspec is not None else None


@pytest.fixture(scope="session")
def idem_engine(request: pytest.FixtureRequest) -> EngineUnderTest:
    sessions = request.config.stash[_SESSIONS]
    column: str = request.param
    name, driver = sessions.columns[column]
    try:
        return EngineUnderTest(column, sessions.server(name), driver)
    except Unavailable as exc:
        if name in sessions.required:
            pytest.fail(f"required engine {name} is unavailable: {exc}", pytrace=False)
        pytest.skip(f"{name} unavailable: {exc}")


@pytest.fixture(autouse=True)
def _idem_requires(request: pytest.FixtureRequest) -> None:
    """Skip a check whose features the engine lacks (with the reason); mark one the backend expects to fail."""
    if "idem_engine" not in request.fixturenames:
        return
    engine: EngineUnderTest = request.getfixturevalue("idem_engine")
    expected = engine.features.expected_failure(check_id(request.node)[0])
    if expected:
        request.applymarker(pytest.mark.xfail(reason=expected, strict=True))
    marker = request.node.get_closest_marker("idem_requires")
    if marker is None:
        return
    missing = [name for name in marker.args if not engine.features.has(name)]
    if missing:
        # The reason names what is missing, not the engine or its URL (the check's id has the engine): the matrix
        # report prints each distinct reason once, whatever the engines that share it.
        pytest.skip(f"needs {' and '.join(missing)}, which this engine lacks")


def unique_prefix() -> str:
    """A table prefix no other test (or process) uses: isolation by prefix works on every engine."""
    return f"c{os.getpid() % 10000}{next(_counter)}{secrets.token_hex(2)}_"


@pytest.fixture
def idem_make_store(idem_engine: EngineUnderTest) -> Iterator[Callable[..., IdempotencyStore]]:
    """Stores on one set of fresh tables; extra keyword arguments go to create_engine (e.g. isolation_level)."""
    sync_url = None if idem_engine.driver is None else idem_engine.server.url
    with stores(idem_engine.url, unique_prefix(), sync_url) as make:
        yield make


@pytest.fixture
def idem_store(idem_make_store: Callable[..., IdempotencyStore]) -> IdempotencyStore:
    return idem_make_store()


@pytest.fixture
def idem_observe(record_property: Callable[[str, object], None]) -> Callable[[str, object], None]:
    """Record a measured fact for the matrix's behaviour table: idem_observe("duplicate resolved by", "waiting")."""

    def record(name: str, value: object) -> None:
        try:  # plain types, as the JSON report holds it (pytest-xdist's workers send the properties on)
            value = json.loads(json.dumps(value))
        except (TypeError, ValueError):
            value = repr(value)
        record_property(observation_property(name), value)

    return record


@pytest.fixture
def idem_effects(idem_store: IdempotencyStore) -> Iterator[Effects]:
    """The business table effects write to, on the same database and prefix as `idem_store`."""
    with effects_table(idem_store) as fx:
        yield fx


@pytest.fixture
def idem_fault_proxy(idem_engine: EngineUnderTest) -> Iterator[FaultProxy]:
    """A fault proxy in front of the engine's server (wire protocols it reads only; others skip, saying why)."""
    if wire_protocol(idem_engine.url) is None:
        reason = ("it is embedded: there is no connection to cut" if provisioning(idem_engine.backend).embedded else
                  f"the fault proxy reads the {' and '.join(PROTOCOLS)} wire protocols, not {idem_engine.backend}'s")
        pytest.skip(f"no wire faults: {reason}")
    with FaultProxy(idem_engine.url) as started:
        yield started
