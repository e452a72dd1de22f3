"""The twin check: every sync/async pair in the library is one API.

Pairs are found by name, not listed by hand — a class `AsyncX` beside a class `X` anywhere in the library, a function
`x_async` beside `x` in one module, a method `ax` beside `x` in one class — so a pair added later is checked without
anyone remembering to. Each pair has the same public names, parameters, kinds and defaults, and every call that
reaches the database or a broker is awaited on the async side. Then each pair is run on SQLite and must behave alike:
the stores (plain and sharded), the relays, the HTTP runners, the consumers' processing, the heartbeats.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import pkgutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The async store (SQLAlchemy's asyncio layer needs greenlet) on aiosqlite: the [async] and [aiosqlite] extras.
pytest.importorskip("greenlet", reason="greenlet is not installed (pip install 'idem-dialects[async]')")
pytest.importorskip("aiosqlite", reason="aiosqlite is not installed (pip install 'idem-dialects[aiosqlite]')")

from stores_common import DONE, EFFECTS, Side, effects, store_script

import idem_dialects
from idem_dialects import (
    AsyncIdempotencyStore,
    AsyncShardedStore,
    IdempotencyStore,
    ShardedStore,
    default_encoder,
)
from idem_dialects.consumers import ConsumerBase
from idem_dialects.heartbeat import beating, beating_async
from idem_dialects.http.policy import HttpRequest, IdempotencyPolicy
from idem_dialects.http.problems import HttpResponse
from idem_dialects.http.runner import AsyncIdempotency, Idempotency
from idem_dialects.outcomes import Disposition
from idem_dialects.relay import AsyncRelay, Relay
from idem_dialects.steps import Heartbeat

# Modules that need a client the library does not (a broker's, a framework's): imported where installed.
_SPELLING = {"__aenter__": "__enter__", "__aexit__": "__exit__"}  # `with` and `async with`, on purpose
# Calls that never reach the database on either side: plain on both.
NOT_AWAITED = {"__init__", "from_url", "from_urls", "retry_cause", "shard_for", "store_for", "check", "relay",
               "transaction", "begin",  # transaction/begin return a (async) context manager
               "begun"}  # a flow, which the store's loop (`drive`) runs
# Pairs that must be found: a floor under the search, so a renamed twin cannot drop out unnoticed.
EXPECTED = {
    "IdempotencyStore", "SyncStore|AsyncStore", "EngineExecutor", "ShardedStore", "StoreAPI", "Executor", "Relay",
    "Publisher", "Idempotency", "ConsumerBase.process", "beating",
}


# --- finding the pairs ----------------------------------------------------------------------------------------------


def _modules() -> Iterator[Any]:
    for info in pkgutil.walk_packages(idem_dialects.__path__, "idem_dialects."):
        if ".cli" in info.name or ".django" in info.name or ".conformance" in info.name or ".engines" in info.name:
            continue  # the command's workshop, Django's adapter (needs settings), the shipped suite and provisioning
        try:
            yield importlib.import_module(info.name)
        except ImportError:  # a client the library does not need (a broker's, a framework's), not installed
            continue


def _defined(module: Any) -> dict[str, Any]:
    return {name: value for name, value in vars(module).items() if not name.startswith("_")
            and (inspect.isclass(value) or inspect.isfunction(value))
            and getattr(value, "__module__", None) == module.__name__}


def twins() -> dict[str, tuple[Any, Any]]:
    """Every pair, by its sync name (a method's as Class.method)."""
    classes: dict[str, Any] = {}
    found: dict[str, tuple[Any, Any]] = {}
    for module in _modules():
        defined = _defined(module)
        for name, value in defined.items():
            if inspect.isclass(value):
                classes[name] = value
                for method in vars(value):
                    if method.startswith("a") and method[1:] in vars(value) and not method.startswith("_"):
                        found[f"{name}.{method[1:]}"] = (getattr(value, method[1:]), getattr(value, method))
            elif name.endswith("_async") and name[:-6] in defined:
                found[name[:-6]] = (defined[name[:-6]], value)
    for name, value in classes.items():
        if name.startswith("Async") and name[5:] in classes:
            found[name[5:]] = (classes[name[5:]], value)
        elif name.startswith("Async") and f"Sync{name[5:]}" in classes:
            found[f"Sync{name[5:]}|{name}"] = (classes[f"Sync{name[5:]}"], value)
    return found


def _public(cls: type) -> dict[str, Any]:
    """Public members by their sync name: everything not private, the constructor and the context manager."""
    members = {}
    for name, member in inspect.getmembers(cls):
        name = _SPELLING.get(name, name)
        if not name.startswith("_") or name in ("__init__", "__enter__", "__exit__"):
            members[name] = member
    return members


def _shape(member: Any) -> list[tuple[str, Any, Any]] | str:
    """Parameters (name, kind, default) of a callable, or what kind of attribute it is."""
    if isinstance(member, property):
        return "property (settable)" if member.fset is not None else "property"
    if not callable(member):
        return "attribute"
    return [(p.name, p.kind, p.default) for p in inspect.signature(member).parameters.values()]


def _awaited(member: Any) -> bool:
    """A coroutine function, or one returning an async context manager (`asynccontextmanager`, or declared so)."""
    if inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(getattr(member, "__wrapped__", None)):
        return True
    returns = inspect.signature(member).return_annotation
    return isinstance(returns, str) and returns.startswith(("AbstractAsyncContextManager", "Awaitable"))


def differences(sync: Any, aio: Any) -> list[str]:
    """How the async twin departs from the sync one (nothing: they are one API)."""
    if not inspect.isclass(sync):
        wrong = [] if _shape(sync) == _shape(aio) else [f"{aio.__qualname__}'s parameters differ"]
        return wrong + ([] if _awaited(aio) or aio.__name__ in NOT_AWAITED else [f"{aio.__qualname__} not awaited"])
    sync_api, async_api = _public(sync), _public(aio)
    found = [f"{name} only on {sync.__name__}" for name in sorted(set(sync_api) - set(async_api))]
    found += [f"{name} only on {aio.__name__}" for name in sorted(set(async_api) - set(sync_api))]
    for name in sorted(set(sync_api) & set(async_api)):
        member, twin = sync_api[name], async_api[name]
        if member is twin:  # written once, in a base both share
            continue
        if _shape(member) != _shape(twin):
            found.append(f"{aio.__name__}.{name} differs from {sync.__name__}.{name}")
        elif callable(member) and not isinstance(member, property) and name not in NOT_AWAITED:
            if not _awaited(twin) and not inspect.isclass(twin):
                found.append(f"{aio.__name__}.{name} is not awaited")
            if _awaited(member):
                found.append(f"{sync.__name__}.{name} is async")
    return found


PAIRS = twins()


def test_the_pairs_are_found() -> None:
    assert EXPECTED <= set(PAIRS), f"pairs not found: {EXPECTED - set(PAIRS)}"


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_sync_and_async_twins_are_one_api(name: str) -> None:
    sync, aio = PAIRS[name]
    assert differences(sync, aio) == []


def test_the_check_fails_when_one_side_gains_a_parameter() -> None:
    class Wider(AsyncRelay):
        async def run_once(self, limit: int = 0) -> int:  # a parameter the sync Relay lacks
            return 0

    class Plain(AsyncRelay):
        def run_once(self) -> int:  # type: ignore[override]  # forgot to await
            return 0

    assert differences(Relay, AsyncRelay) == []
    assert differences(Relay, Wider) == ["Wider.run_once differs from Relay.run_once"]
    assert differences(Relay, Plain) == ["Plain.run_once is not awaited"]


# --- behaving alike, on SQLite ---------------------------------------------------------------------------------------


def _url(path: Path, side: Side) -> str:
    return f"sqlite+aiosqlite:///{path}" if side.asynchronous else f"sqlite:///{path}"


def _effects(path: Path) -> dict[str, int]:
    with IdempotencyStore.from_url(f"sqlite:///{path}") as reader, reader.engine.connect() as conn:
        return effects(conn)


def _with_table(path: Path) -> None:
    with IdempotencyStore.from_url(f"sqlite:///{path}") as made:
        DONE.create(made.engine)


def test_the_stores_behave_alike(tmp_path: Path) -> None:
    outcomes, done = {}, {}
    for asynchronous in (False, True):
        side = Side(asynchronous)
        path = tmp_path / f"{asynchronous}.db"
        _with_table(path)
        store = (AsyncIdempotencyStore if asynchronous else IdempotencyStore).from_url(_url(path, side),
                                                                                          encoder=default_encoder)
        side.call(store.create_tables())
        try:
            outcomes[asynchronous] = store_script(store, side, lambda n: f"tenant{n}")
        finally:
            side.call(store.close())
            side.close()
        done[asynchronous] = _effects(path)
    assert outcomes[False] == outcomes[True]
    assert done[False] == done[True] == EFFECTS


def test_the_sharded_stores_behave_alike(tmp_path: Path) -> None:
    outcomes, done = {}, {}
    for asynchronous in (False, True):
        side = Side(asynchronous)
        paths = {s: tmp_path / f"{asynchronous}-{s}.db" for s in ("a", "b")}
        for p in paths.values():
            _with_table(p)
        kind = AsyncShardedStore if asynchronous else ShardedStore
        store = kind.from_urls({s: _url(p, side) for s, p in paths.items()}, encoder=default_encoder,
                               shard_chooser=lambda scope: "a" if scope.endswith(("0", "2")) else "b")
        side.call(store.create_tables())
        try:
            outcomes[asynchronous] = store_script(store, side, lambda n: f"tenant{n}")
        finally:
            side.call(store.close())
            side.close()
        done[asynchronous] = {s: _effects(p) for s, p in paths.items()}
    assert outcomes[False] == outcomes[True]
    assert done[False] == done[True]
    assert done[False] == {"a": {k: v for k, v in EFFECTS.items() if k in ("run0", "run2", "processed", "commanded")},
                           "b": {k: v for k, v in EFFECTS.items() if k in ("run1", "leased", "consumed")}}


def _http_answers(asynchronous: bool, path: Path) -> tuple[list[Any], int]:
    side = Side(asynchronous)
    store = (AsyncIdempotencyStore if asynchronous else IdempotencyStore).from_url(_url(path, side))
    side.call(store.create_tables())
    runner: Any = (AsyncIdempotency if asynchronous else Idempotency)(store, IdempotencyPolicy(scope=lambda r: "t"))
    ran: list[int] = []

    def handler_body() -> HttpResponse:
        ran.append(1)
        return HttpResponse(201, [("content-type", "application/json")], b'{"ok": true}')

    async def handler_async(conn: Any) -> HttpResponse:
        return handler_body()

    handler = handler_async if asynchronous else (lambda conn: handler_body())
    got = []
    for body in (b'{"a": 1}', b'{"a": 1}', b'{"a": 2}'):
        req = HttpRequest("POST", "/pay", [("idempotency-key", '"k1"'), ("content-type", "application/json")],
                          body=body)
        resp = side.call(runner.handle(req, handler))
        got.append((resp.status, resp.body, sorted((k.lower(), v) for k, v in resp.headers if k.lower() != "date")))
    side.call(store.close())
    side.close()
    return got, len(ran)


def test_the_http_runners_behave_alike(tmp_path: Path) -> None:
    answers = {asynchronous: _http_answers(asynchronous, tmp_path / f"http-{asynchronous}.db")
               for asynchronous in (False, True)}
    assert answers[False] == answers[True]
    assert answers[False][1] == 1  # the handler ran once: a replay, then a mismatch


def test_the_consumers_process_alike(tmp_path: Path) -> None:
    seen = {}
    for asynchronous in (False, True):
        side = Side(asynchronous)
        store: Any = (AsyncIdempotencyStore if asynchronous else IdempotencyStore).from_url(
            _url(tmp_path / f"c-{asynchronous}.db", side))
        side.call(store.create_tables())
        policy = ConsumerBase(subscriber="sub", on_mismatch=Disposition.DEAD_LETTER, max_deliveries=2,
                              retry_delay=0, compare_payload=True)
        process = policy.aprocess if asynchronous else policy.process

        def failing(conn: Any) -> None:
            raise ValueError("poison")

        got = [side.call(process(store, "m1", {"p": 1}, side.effect(lambda conn: 1), 1)),
               side.call(process(store, "m1", {"p": 1}, side.effect(lambda conn: 1), 2)),
               side.call(process(store, "m1", {"p": 2}, side.effect(lambda conn: 1), 3)),
               side.call(process(store, "m2", {}, side.effect(failing), 1)),
               side.call(process(store, "m2", {}, side.effect(failing), 2)),
               side.call(process(store, None, {}, side.effect(lambda conn: 1), 1))]
        seen[asynchronous] = (got, dict(policy.counts))
        side.call(store.close())
        side.close()
    assert seen[False] == seen[True]


def _beats(asynchronous: bool) -> tuple[int, int]:
    """How many beats ran before the block ended, and how many in all a while later."""
    beats: list[int] = []
    third = threading.Event()

    def beat() -> Any:
        beats.append(1)
        if len(beats) == 3:
            third.set()
        return len(beats) < 5
        yield  # a flow

    def drive(flow: Any) -> bool:
        try:
            next(flow)
        except StopIteration as done:
            return bool(done.value)
        raise AssertionError("a beat flow with steps")

    async def adrive(flow: Any) -> bool:
        return drive(flow)

    async def main() -> None:
        async with beating_async(heartbeat, adrive):
            while not third.is_set():
                await asyncio.sleep(0.001)

    heartbeat = Heartbeat(0.001, beat)
    if asynchronous:
        asyncio.run(main())
    else:
        with beating(heartbeat, drive):
            third.wait()
    ended = len(beats)
    time.sleep(0.05)  # fifty intervals: a beat running after the block would show here
    return ended, len(beats)


def test_the_heartbeats_beat_alike() -> None:
    """Each runs beats while its block runs (driven by the loop's `drive`) and none after the block ends. The order
    is made, not waited for: the block ends once the third beat has been seen."""
    for asynchronous in (False, True):
        ended, final = _beats(asynchronous)
        assert ended >= 3 and final == ended, f"{'async' if asynchronous else 'sync'}: {ended} beats, then {final}"
