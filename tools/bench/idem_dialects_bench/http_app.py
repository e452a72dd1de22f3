"""What `bench --api http` serves and how it is reached: the app (Starlette here, FastAPI in `http_fastapi`), a real
uvicorn server in a thread of this process, and a minimal keep-alive HTTP/1.1 client.

The app's routes, whatever the framework:

- ``/bare/debit``: the debit in its own transaction (no idempotency);
- ``/idem/debit``: the debit in the record's transaction, through the ASGI middleware in atomic mode;
- ``/count/bare`` and ``/count/debit``: the bare debit and the middleware's through a second store object on the same
  tables, built with a `statement_hook` and reaching the database through the counting proxy (`wire`), for the
  unmeasured pass that counts statements and round trips (nothing is added to the measured store's path);
- ``/bare/slow`` and ``/ext/slow``: a handler waiting `HANDLER_SECONDS` (an external call), bare and through the
  middleware in external-call mode.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from idem_dialects.aio import AsyncIdempotencyStore
from idem_dialects.http.asgi import STATE_KEY, IdempotencyMiddleware
from idem_dialects.http.policy import IdempotencyPolicy

from .accounts import Accounts, scope

HANDLER_SECONDS = 0.2
ACCOUNT = 1  # every debit route debits this account of the workload's table, under its scope
SCOPE = scope(ACCOUNT)


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


def add_layers(app: Any, store: AsyncIdempotencyStore, counting: AsyncIdempotencyStore) -> None:
    """The ASGI middleware as the docs show it, one policy per route family (the same on every framework)."""
    app.add_middleware(IdempotencyMiddleware, store=store, policy=IdempotencyPolicy(
        scope=lambda r: SCOPE, paths={"/ext/slow"}, lease=timedelta(seconds=30)))
    app.add_middleware(IdempotencyMiddleware, store=counting, policy=IdempotencyPolicy(
        scope=lambda r: SCOPE, paths={"/count/debit"}))
    app.add_middleware(IdempotencyMiddleware, store=store, policy=IdempotencyPolicy(
        scope=lambda r: SCOPE, paths={"/idem/debit"}))


def debit(accounts: Accounts, amount: int) -> tuple[Any, dict[str, int]]:
    """The workload's debit of ACCOUNT, `amount` units (the request body's): the statement and its parameters."""
    return accounts.debit, {"acct": ACCOUNT, "amount": amount}


def build_starlette(store: AsyncIdempotencyStore, counting: AsyncIdempotencyStore, accounts: Accounts,
                    freeze: bool) -> Any:
    """The bench's app on Starlette (module docstring)."""

    def bare_on(on: AsyncIdempotencyStore) -> Any:
        async def bare(request: Request) -> JSONResponse:
            amount = (await request.json())["amount"]
            async with on.engine.begin() as conn:
                await conn.execute(*debit(accounts, amount))
            return JSONResponse({"debited": amount}, status_code=201)

        return bare

    async def atomic(request: Request) -> JSONResponse:
        amount = (await request.json())["amount"]
        await getattr(request.state, STATE_KEY).execute(*debit(accounts, amount))
        return JSONResponse({"debited": amount}, status_code=201)

    async def slow(request: Request) -> JSONResponse:
        await asyncio.sleep(HANDLER_SECONDS)  # the external call
        return JSONResponse({"called": True}, status_code=201)

    routes = [Route(path, handler, methods=["POST"]) for path, handler in (
        ("/bare/debit", bare_on(store)), ("/idem/debit", atomic), ("/count/bare", bare_on(counting)),
        ("/count/debit", atomic), ("/bare/slow", slow), ("/ext/slow", slow))]
    app = Starlette(routes=routes, lifespan=lifespan(freeze, store, counting))
    add_layers(app, store, counting)
    return app


def lifespan(freeze: bool, *stores: AsyncIdempotencyStore) -> Any:
    """The app's lifespan: with `freeze`, the end of its startup freezes the heap, as docs/http.md advises services
    (before any request: what requests make later, pools and caches included, stays the collector's)."""

    @asynccontextmanager
    async def span(app: Any) -> AsyncIterator[None]:
        if freeze:
            gc.collect()
            gc.freeze()
        yield
        if freeze:
            gc.unfreeze()  # the bench's process goes on (the next engine or level)
        for store in stores:
            await store.engine.dispose()  # its connections belong to the server's event loop

    return span


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
