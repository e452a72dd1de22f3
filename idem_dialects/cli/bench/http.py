"""`idem-dialects bench --api http`: requests per second through the ASGI middleware beside the bare endpoint.

Each database gets a real uvicorn server (in a thread of this process) and keep-alive HTTP/1.1 connections. Two
workloads:

- **throughput**: a debit endpoint (`UPDATE accounts SET balance = balance - amount`), bare (its own transaction),
  then through the middleware in atomic mode (the debit in the record's transaction) with first-time keys, then the
  same keys again (replays). Per path: requests/s, latency percentiles, and the server's CPU per request (the
  process's CPU less the client's thread: uvicorn's event loop and any driver threads), each beside the bare
  endpoint's. After the run, the balance must have moved by exactly one debit per distinct key and there must be one
  record per key, or the run fails.
- **latency hiding**: 20 concurrent requests with distinct keys to a handler that waits 200 ms (an external call), in
  external-call mode (leased claim, no transaction held during the call) and bare; the wall time of the 20 is
  compared with the handler's 200 ms.

Needs the [http] extra and an async driver for the engine (the [async] extra).
"""

from __future__ import annotations

import asyncio
import random
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import uvicorn
from sqlalchemy import text
from sqlalchemy.engine import URL
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ...aio import AsyncIdempotencyStore
from ...dialects.base import Backend
from ...http.asgi import STATE_KEY, IdempotencyMiddleware
from ...http.core import IdempotencyPolicy
from .aio import async_url
from .report import engine_info, machine_info, percentiles
from .runner import BenchFailed, ExactlyOnceViolation, Log, backend_of, pool_options, reaching

SCHEMA = "idem-dialects-bench-http/2"
HANDLER_SECONDS = 0.2
CONCURRENT_CALLS = 20  # the latency workload: this many requests at once, each waiting HANDLER_SECONDS
# The middleware's server CPU per request against the bare endpoint's (issue: under 1.6x first-time, at most 1x replay).
CPU_TARGETS = {"middleware first-time": 1.6, "middleware replay": 1.0}


@contextmanager
def uvicorn_server(app: Any) -> Iterator[str]:
    """A real uvicorn server on a free loopback port, in a thread of this process; yields its base URL."""
    # IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and accepted
    # sockets inherit it. Without it uvicorn's separate writes of head and body wait on the client's delayed ACK
    # (40 ms a request on Linux), which measured the kernel, not the layer.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_keep_alive=300))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            thread.join(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def build_app(store: Any, accounts: str) -> Any:
    debit = text(f"UPDATE {accounts} SET balance = balance - :amount WHERE id = 1")

    async def bare(request: Request) -> JSONResponse:
        amount = (await request.json())["amount"]
        async with store.engine.begin() as conn:
            await conn.execute(debit, {"amount": amount})
        return JSONResponse({"debited": amount}, status_code=201)

    async def atomic(request: Request) -> JSONResponse:
        amount = (await request.json())["amount"]
        await getattr(request.state, STATE_KEY).execute(debit, {"amount": amount})
        return JSONResponse({"debited": amount}, status_code=201)

    async def slow(request: Request) -> JSONResponse:
        await asyncio.sleep(HANDLER_SECONDS)  # the external call
        return JSONResponse({"called": True}, status_code=201)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await store.engine.dispose()  # its connections belong to the server's event loop

    routes = [Route("/bare/debit", bare, methods=["POST"]), Route("/idem/debit", atomic, methods=["POST"]),
              Route("/bare/slow", slow, methods=["POST"]), Route("/ext/slow", slow, methods=["POST"])]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.add_middleware(IdempotencyMiddleware, store=store, policy=IdempotencyPolicy(
        scope=lambda r: "bench", paths={"/ext/slow"}, lease=timedelta(seconds=30)))
    app.add_middleware(IdempotencyMiddleware, store=store, policy=IdempotencyPolicy(
        scope=lambda r: "bench", paths={"/idem/debit"}))
    return app


class HttpConnection:
    """One keep-alive HTTP/1.1 connection speaking just enough of the protocol for this bench: a full client library
    costs about as much CPU per request as the server does, which on two busy cores would be measured as the layer's."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> HttpConnection:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def post(self, path: str, key: str, body: bytes) -> tuple[int, bytes]:
        self.writer.write(f"POST {path} HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
                          f"content-length: {len(body)}\r\nidempotency-key: \"{key}\"\r\n\r\n".encode() + body)
        await self.writer.drain()
        status = int((await self.reader.readline()).split()[1])
        length = None
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
        if length is None:
            raise RuntimeError(f"{path}: response without content-length")
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


class RequestsFailed(BenchFailed):
    """A request that should have succeeded (201) did not: the run cannot vouch for exactly-once."""


@dataclass(frozen=True)
class Driven:
    """One path driven: its wall time, each request's latency, and the server's CPU seconds meanwhile."""

    seconds: float
    latencies: list[float]
    server_cpu: float


async def drive(connections: list[HttpConnection], path: str, keys: list[str]) -> Driven:
    """Send one request per key, one in flight per connection (exit on any non-201). The server's CPU is the process's
    less this thread's: the client runs on this thread's event loop, the server on uvicorn's thread (and the driver's
    threads, where it has some)."""
    queue = list(reversed(keys))
    failures: list[str] = []
    latencies: list[float] = []

    async def worker(conn: HttpConnection) -> None:
        while queue:
            key = queue.pop()
            sent = time.perf_counter()
            status, body = await conn.post(path, key, b'{"amount": 1}')
            latencies.append(time.perf_counter() - sent)
            if status != 201:
                failures.append(f"{status} {body[:200]!r}")

    cpu, client, started = time.process_time(), time.thread_time(), time.perf_counter()
    await asyncio.gather(*(worker(conn) for conn in connections))
    elapsed = time.perf_counter() - started
    server_cpu = (time.process_time() - cpu) - (time.thread_time() - client)
    if failures:
        raise RequestsFailed(f"{path}: {len(failures)} requests failed, e.g. {failures[0]}")
    return Driven(elapsed, latencies, server_cpu)


@dataclass(frozen=True)
class HttpBenchmark:
    """The ASGI middleware on a real server, beside the bare endpoint (module docstring)."""

    requests: int = 400
    concurrency: int = 8
    driver: str | None = None

    def __post_init__(self) -> None:
        if self.requests < 1 or self.concurrency < 1:
            raise ValueError("--requests and --concurrency must be at least 1")

    def refuse(self, backend: type[Backend]) -> str | None:
        return None

    def measure(self, url: URL, log: Log) -> dict[str, Any]:
        return asyncio.run(self._measure(async_url(url, self.driver), log))

    async def _measure(self, url: URL, log: Log) -> dict[str, Any]:
        prefix = f"hb{secrets.token_hex(3)}_"
        accounts = f"{prefix}accounts"
        # A pool as large as the concurrent requests, so the latency workload measures the layer, not pool waits;
        # where writers take turns on one lock, more connections would only queue for it (the default pool is kept).
        sized = backend_of(url).url_features(url).writers is None
        with reaching(url):
            store = AsyncIdempotencyStore.from_url(url, table_prefix=prefix + "idem_",
                                                   **(pool_options(url, CONCURRENT_CALLS + 5, 10) if sized else {}))
            await store.create_tables()
        try:
            async with store.engine.begin() as conn:
                await conn.execute(text(f"CREATE TABLE {accounts} (id INTEGER PRIMARY KEY, balance BIGINT NOT NULL)"))
                await conn.execute(text(f"INSERT INTO {accounts} (id, balance) VALUES (1, 0)"))
                info = engine_info(store.engine.url, store.engine.dialect, store.backend.name,
                                   conn.dialect.server_version_info)
            await store.engine.dispose()  # the server's event loop opens its own connections
            log(f"{info['backend']} {info['server_version']} via {info['driver']}, tables {prefix}*")
            started = time.perf_counter()
            paths = await self._drive(store, accounts, log)
            async with store.engine.connect() as conn:
                balance = (await conn.execute(text(f"SELECT balance FROM {accounts} WHERE id = 1"))).scalar_one()
                records = (await conn.execute(text(f"SELECT count(*) FROM {prefix}idem_records"))).scalar_one()
            # Debits: 2 x 20 warm-up, the bare ones, one per first-time key (its replays debit nothing); records:
            # warm-up 2 x 20, one per key, 20 slow.
            expected, expected_records = -(40 + 2 * self.requests), 40 + self.requests + CONCURRENT_CALLS
            if balance != expected or records != expected_records:
                raise ExactlyOnceViolation(f"balance {balance} (expected {expected}), {records} records (expected"
                                           f" {expected_records})")
        finally:
            await store.drop_tables()
            async with store.engine.begin() as conn:
                await conn.execute(text(f"DROP TABLE IF EXISTS {accounts}"))
            await store.engine.dispose()
        once = {"verified": True, "effects": -expected, "records": expected_records}
        return self.report(info, paths, once, time.perf_counter() - started)

    async def _drive(self, store: Any, accounts: str, log: Log) -> list[dict[str, Any]]:
        keys = [f"k{i}" for i in range(self.requests)]
        retries = random.Random(7).sample(keys, len(keys))  # the same keys again, in another order
        paths: list[dict[str, Any]] = []
        with uvicorn_server(build_app(store, accounts)) as base:
            port = int(base.rsplit(":", 1)[1])
            conns = [await HttpConnection.open(port) for _ in range(max(self.concurrency, CONCURRENT_CALLS))]
            few, many = conns[:self.concurrency], conns[:CONCURRENT_CALLS]
            try:
                for path in ("/bare/debit", "/idem/debit", "/bare/slow", "/ext/slow"):  # warm pools and caches
                    await drive(many, path, [f"warm{path}{i}" for i in range(CONCURRENT_CALLS)])
                for workload, title, http_path, conns_, sent in (
                    ("throughput", "bare", "/bare/debit", few, [f"b{i}" for i in range(self.requests)]),
                    ("throughput", "middleware first-time", "/idem/debit", few, keys),
                    ("throughput", "middleware replay", "/idem/debit", few, retries),
                    ("latency", "bare", "/bare/slow", many, [f"s{i}" for i in range(CONCURRENT_CALLS)]),
                    ("latency", "middleware (external call)", "/ext/slow", many,
                     [f"e{i}" for i in range(CONCURRENT_CALLS)]),
                ):
                    done = await drive(conns_, http_path, sent)
                    paths.append({"workload": workload, "path": title, "requests": len(sent),
                                  "seconds": round(done.seconds, 4),
                                  "throughput_per_s": round(len(sent) / done.seconds, 1),
                                  "latency_ms": percentiles(done.latencies),
                                  "server_cpu_us_per_request": round(done.server_cpu / len(sent) * 1e6, 1),
                                  "x_handler": round(done.seconds / HANDLER_SECONDS, 2) if workload == "latency"
                                  else None})
                    log(f"{workload} {title}: {len(sent)} requests in {done.seconds:.3f} s")
            finally:
                for http in conns:
                    http.close()
        bare = paths[0]
        for row in paths[1:3]:
            row["ratio_to_bare"] = round(row["throughput_per_s"] / bare["throughput_per_s"], 3)
            row["cpu_ratio_to_bare"] = round(row["server_cpu_us_per_request"] / bare["server_cpu_us_per_request"], 3)
        return paths

    def report(self, info: dict[str, Any], paths: list[dict[str, Any]], once: dict[str, Any],
               elapsed: float) -> dict[str, Any]:
        hidden = next(p["x_handler"] for p in paths if p["path"] == "middleware (external call)")
        return {"schema": SCHEMA, "engine": info, "machine": machine_info(), "elapsed_s": round(elapsed, 2),
                "config": {"requests": self.requests, "concurrency": self.concurrency,
                           "concurrent_calls": CONCURRENT_CALLS, "handler_ms": round(HANDLER_SECONDS * 1000)},
                "paths": paths,
                "targets": [*({"target": f"server CPU per request, {path['path']} <= {limit}x the bare endpoint's",
                               "met": path["cpu_ratio_to_bare"] <= limit, "value": path["cpu_ratio_to_bare"]}
                              for path in paths if (limit := CPU_TARGETS.get(path["path"])) is not None),
                            {"target": f"{CONCURRENT_CALLS} concurrent {HANDLER_SECONDS * 1000:.0f} ms requests"
                                       " through the middleware (external call) < 2x the handler time",
                             "met": hidden < 2, "value": hidden}],
                "exactly_once": once}
