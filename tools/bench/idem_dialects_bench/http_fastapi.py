"""The bench's app on FastAPI (`bench --api http --framework fastapi`): the routes of `http_app`, written as the
docs show them: a pydantic body, the ASGI middleware, and the record's connection through the `IdemConnection`
dependency. Imported only for that framework (it needs the [fastapi] extra)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from idem_dialects.aio import AsyncIdempotencyStore
from idem_dialects.http.fastapi import IdemConnection

from .accounts import Accounts
from .http_app import HANDLER_SECONDS, add_layers, debit, lifespan


class Amount(BaseModel):
    amount: int


def build_fastapi(store: AsyncIdempotencyStore, counting: AsyncIdempotencyStore, accounts: Accounts,
                  freeze: bool) -> Any:
    app = FastAPI(lifespan=lifespan(freeze, store, counting))

    def bare_on(on: AsyncIdempotencyStore) -> Any:
        async def bare(body: Amount) -> dict[str, int]:
            async with on.engine.begin() as conn:
                await conn.execute(*debit(accounts, body.amount))
            return {"debited": body.amount}

        return bare

    app.post("/bare/debit", status_code=201)(bare_on(store))
    app.post("/count/bare", status_code=201)(bare_on(counting))

    async def atomic(body: Amount, conn: IdemConnection) -> dict[str, int]:
        await conn.execute(*debit(accounts, body.amount))
        return {"debited": body.amount}

    app.post("/idem/debit", status_code=201)(atomic)
    app.post("/count/debit", status_code=201)(atomic)

    async def slow() -> dict[str, bool]:
        await asyncio.sleep(HANDLER_SECONDS)  # the external call
        return {"called": True}

    app.post("/bare/slow", status_code=201)(slow)
    app.post("/ext/slow", status_code=201)(slow)
    add_layers(app, store, counting)
    return app
