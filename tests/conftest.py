"""The project's own tests opt in to the shipped conformance plugin, exactly as a third-party project would."""

from collections import Counter
from collections.abc import Callable, Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
import wheel_common
from consumer_common import Inbox
from wheel_common import Built

from idem_dialects import engines
from idem_dialects.engines import provisioning, started
from idem_dialects.engines.brokers import BROKERS

pytest_plugins = ["idem_dialects.conformance.plugin"]


@pytest.hookimpl(tryfirst=True)  # before the plugin's own pytest_configure reads the option
def pytest_configure(config: Any) -> None:
    """The project proves both stores: the conformance suite runs on the sync and the async store unless the command
    line picks one (``--idem-api sync``); a third party's suite keeps the plugin's default (sync). A run whose engines
    (``--idem-engine``, ``--idem-require``) all live in the client (``--idem-engine sqlite``) uses no database or
    broker server, running or not: a test that would start or reach one through the catalogue skips, saying so."""
    if getattr(config.option, "idem_api", "unset") is None:
        config.option.idem_api = "both"
    chosen = (config.getoption("idem_engine", None) or []) + (config.getoption("idem_require", None) or [])
    if chosen and "all" not in chosen and all(provisioning(engines.get(name).backend).embedded
                                              for name in engines.expand(chosen)):
        started.refuse(f"this run uses no server (--idem-engine {' '.join(chosen)})")


# Under pytest-xdist with --dist loadscope, what one worker runs together (the rest is one scope per module): each HA
# or pooling stack's tests (the stack starts once); the other conformance checks one by one (their servers are the
# session's); a documentation page's examples, on each engine in turn (a page may name a server's database of its
# own); the mistakes' tests function by function (minutes in all; a module's server starts once per function).
# (The wheel and the site are built once per run whichever workers need them: tests/wheel_common.py.)
STACKS = sorted((name for name, entry in engines.ENGINES.items() if entry.stacked_on), key=len, reverse=True)
SPLIT: dict[str, Callable[[str], str]] = {
    "tests/test_conformance.py": lambda nodeid: nodeid,
    "tests/test_examples.py": lambda nodeid: nodeid.rpartition("-")[0],  # [page-engine]
    "tests/test_mistakes.py": lambda nodeid: nodeid.partition("[")[0],
}
# What a scope weighs when the workers are handed scopes, heaviest first: a test marked slow is about a minute, most
# others under a second. Handed out in that order, the run ends on short scopes, not on one long test started last.
SLOW_WEIGHT = 60


def scope_of(nodeid: str) -> str:
    path, _, name = nodeid.partition("::")
    params = name.partition("[")[2]
    stack = next((s for s in STACKS if params.startswith(s) and params[len(s):][:1] in ("", "-", "]")), None)
    if stack is not None:
        return stack
    split = SPLIT.get(path)
    return path if split is None else split(nodeid)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist (the dev extra)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    config.option.loadscopereorder = False  # the workers' collection order is the order (below), not test counts
    return Scopes(config, log)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each pytest-xdist worker collects the scopes heaviest first (a stable sort: a scope's tests keep their order),
    and the scheduler hands them out in that order."""
    if not hasattr(config, "workerinput"):  # not a worker: the order written in the files
        return
    weight: Counter[str] = Counter()
    for item in items:
        weight[scope_of(item.nodeid)] += SLOW_WEIGHT if item.get_closest_marker("slow") else 1
    items.sort(key=lambda item: -weight[scope_of(item.nodeid)])


@pytest.fixture(scope="module", params=["sqlite", "postgresql-18", "postgresql", "mariadb"])
def live_engine(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Each engine this machine runs (a skip, with the reason, where one cannot be had)."""
    spec = engines.get(request.param)
    try:
        provided = spec.provide()
    except engines.Unavailable as exc:
        pytest.skip(f"{spec.name}: {exc}")
    yield provided
    provided.stop()


@pytest.fixture(scope="module", params=["postgresql", "mariadb"])
def db_server(request: pytest.FixtureRequest) -> Iterator[engines.Server]:
    """The machine's PostgreSQL and MariaDB servers: what keeps statistics and a catalog (a skip, with the reason,
    where one cannot be had)."""
    try:
        found = engines.get(request.param).provide()
    except engines.Unavailable as exc:
        pytest.skip(f"{request.param} unavailable: {exc}")
    yield found
    found.stop()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--idem-require-broker", action="append", default=[], metavar="NAME",
                     help="a broker (rabbitmq, nats, redis, or all) whose adapter tests must run: unavailable, they"
                          " fail instead of skipping (repeatable)")


@pytest.fixture(scope="session")
def broker(request: pytest.FixtureRequest) -> Callable[..., str]:
    """`broker(name, client=None)`: the URL of that broker's service (IDEM_BROKER_<NAME> or the standard local
    port); a skip with the reason where it or the client package (default: the adapter's) is missing, or a failure
    where the command line requires the broker."""
    required = set(request.config.getoption("idem_require_broker"))

    def need(name: str, client: str | None = None) -> str:
        spec = BROKERS[name]
        why = spec.unavailable()
        if why is None and client is not None and find_spec(client) is None:
            why = f"{client} is not installed (pip install 'idem-dialects[{client}]')"
        if why is not None:
            if name in required or "all" in required:
                pytest.fail(f"required broker {name} is unavailable: {why}", pytrace=False)
            pytest.skip(f"{spec.title}: {why}")
        return spec.url()

    return need


@pytest.fixture
def inbox(tmp_path: Path) -> Iterator[Inbox]:
    """A store on an SQLite file in `tmp_path` with a table counting committed handler runs (the adapters' tests)."""
    made = Inbox(tmp_path)
    yield made
    made.close()


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The wheel and sdist, built once for the run (tests/wheel_common.py)."""
    return wheel_common.built(wheel_common.run_dir(tmp_path_factory))


@pytest.fixture(scope="session")
def site(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The documentation site, built once for the run the way it is published (.readthedocs.yaml): every test that
    reads a built page shares it."""
    return wheel_common.site(built, wheel_common.run_dir(tmp_path_factory))
