"""HTTP benchmark: requests per second through the ASGI middleware beside the bare endpoint, exactly-once checked.

    python -m idem_dialects.http.bench [--engine sqlite|postgresql|URL ...] [--requests 400] [--concurrency 8]

Each engine gets a real uvicorn server (in a thread of this process) and keep-alive HTTP/1.1 connections. Two workloads:

- **throughput**: a debit endpoint (`UPDATE accounts SET balance = balance - amount`), bare (its own transaction) and
  through the middleware in atomic mode (the debit in the record's transaction); one request in four is a client
  retry of an earlier key (a replay). After the run, the balance must have moved by exactly one debit per distinct
  key and there must be one record per key, or the run fails.
- **latency hiding**: 20 concurrent requests with distinct keys to a handler that waits 200 ms (an external call), in
  external-call mode (leased claim, no transaction held during the call) and bare; the wall time of the 20 is
  compared with the handler's 200 ms.

Needs the [http] extra and an async driver for the engine (aiosqlite, asyncpg).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import secrets
import socket
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import uvicorn
from sqlalchemy import text
from sqlalchemy.engine import make_url
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ...aio import AsyncIdempotencyStore
from ...http.asgi import STATE_KEY, IdempotencyMiddleware
from ...http.core import IdempotencyPolicy

HANDLER_SECONDS = 0.2
ASYNC_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+asyncpg"}


@dataclass
class Row:
    engine: str
    workload: str
    path: str
    requests: int
    seconds: float

    def line(self) -> str:
        rate = self.requests / self.seconds if self.seconds else 0.0
        extra = f"{self.seconds / HANDLER_SECONDS:.2f}x handler" if self.workload == "latency" else ""
        return (f"| {self.engine} | {self.workload} | {self.path} | {self.requests} | {self.seconds:.3f} |"
                f" {rate:.0f} | {extra} |")


@contextmanager
def uvicorn_server(app: Any) -> Iterator[str]:
    """A real uvicorn server on a free loopback port, in a thread of this process; yields its base URL."""
    sock = socket.socket()
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


async def drive(connections: list[HttpConnection], path: str, keys: list[str]) -> float:
    """Send one request per key, one in flight per connection; seconds for all of them (exit on any non-201)."""
    queue = list(reversed(keys))
    failures: list[str] = []

    async def worker(conn: HttpConnection) -> None:
        while queue:
            key = queue.pop()
            status, body = await conn.post(path, key, b'{"amount": 1}')
            if status != 201:
                failures.append(f"{status} {body[:200]!r}")

    started = time.perf_counter()
    await asyncio.gather(*(worker(conn) for conn in connections))
    elapsed = time.perf_counter() - started
    if failures:
        raise SystemExit(f"{path}: {len(failures)} requests failed, e.g. {failures[0]}")
    return elapsed


async def bench_engine(name: str, url: str, requests: int, concurrency: int) -> list[Row]:
    prefix = f"hb{secrets.token_hex(3)}_"
    # A pool as large as the 20 concurrent requests, so the latency workload measures the layer, not pool waits.
    options: dict[str, Any] = {} if name == "sqlite" else {"pool_size": 25}
    store = AsyncIdempotencyStore.from_url(url, table_prefix=prefix + "idem_", **options)
    accounts = f"{prefix}accounts"
    await store.create_tables()
    async with store.engine.begin() as conn:
        await conn.execute(text(f"CREATE TABLE {accounts} (id INTEGER PRIMARY KEY, balance BIGINT NOT NULL)"))
        await conn.execute(text(f"INSERT INTO {accounts} (id, balance) VALUES (1, 0)"))
    await store.engine.dispose()  # the server's event loop opens its own connections
    rows: list[Row] = []
    try:
        distinct = [f"k{i}" for i in range(requests * 3 // 4)]
        with_retries = distinct + random.Random(7).sample(distinct, requests - len(distinct))
        random.Random(8).shuffle(with_retries)
        with uvicorn_server(build_app(store, accounts)) as base:
            port = int(base.rsplit(":", 1)[1])
            conns = [await HttpConnection.open(port) for _ in range(max(concurrency, 20))]
            few, twenty = conns[:concurrency], conns[:20]
            try:
                for path in ("/bare/debit", "/idem/debit", "/bare/slow", "/ext/slow"):  # warm pools and caches
                    await drive(twenty, path, [f"warm{path}{i}" for i in range(20)])
                rows.append(Row(name, "throughput", "bare", requests,
                                await drive(few, "/bare/debit", [f"b{i}" for i in range(requests)])))
                rows.append(Row(name, "throughput", "middleware (atomic)", requests,
                                await drive(few, "/idem/debit", with_retries)))
                rows.append(Row(name, "latency", "bare", 20,
                                await drive(twenty, "/bare/slow", [f"s{i}" for i in range(20)])))
                rows.append(Row(name, "latency", "middleware (external call)", 20,
                                await drive(twenty, "/ext/slow", [f"e{i}" for i in range(20)])))
            finally:
                for http in conns:
                    http.close()
        async with store.engine.connect() as conn:
            balance = (await conn.execute(text(f"SELECT balance FROM {accounts} WHERE id = 1"))).scalar_one()
            records = (await conn.execute(text(f"SELECT count(*) FROM {prefix}idem_records"))).scalar_one()
        # Debits: 20 + 20 warm-up, the bare ones, one per distinct key; records: warm-up 2 x 20, distinct, 20 slow.
        expected, expected_records = -(40 + requests + len(distinct)), 40 + len(distinct) + 20
        if balance != expected or records != expected_records:
            raise SystemExit(f"{name}: exactly-once violated: balance {balance} (expected {expected}),"
                             f" {records} records (expected {expected_records})")
    finally:
        await store.drop_tables()
        async with store.engine.begin() as conn:
            await conn.execute(text(f"DROP TABLE {accounts}"))
        await store.engine.dispose()
    return rows


def resolve(engine: str, workdir: Path) -> tuple[str, str]:
    if engine == "sqlite":
        return engine, f"{ASYNC_DRIVERS['sqlite']}:///{workdir / 'bench.db'}"
    if engine in ("postgresql", "postgresql-18"):
        from ...engines import get

        url = make_url(get(engine).provide().url)
        return engine, url.set(drivername=ASYNC_DRIVERS["postgresql"]).render_as_string(hide_password=False)
    return make_url(engine).get_backend_name(), engine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m idem_dialects.http.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--engine", action="append", help="sqlite, postgresql, postgresql-18 or an async URL")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args(argv)
    print("| engine | workload | path | requests | seconds | requests/s | 20 x 200 ms |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for engine in args.engine or ["sqlite", "postgresql"]:
            name, url = resolve(engine, Path(tmp))
            for row in asyncio.run(bench_engine(name, url, args.requests, args.concurrency)):
                print(row.line(), flush=True)
    print("exactly-once: balance and record count checked after each engine's run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
