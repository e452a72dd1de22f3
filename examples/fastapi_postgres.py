"""FastAPI on PostgreSQL: POST /payments runs once per Idempotency-Key; every retry gets the stored answer.

    DATABASE_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/test uvicorn examples.fastapi_postgres:app
    curl -X POST localhost:8000/payments -H 'X-Account: 1' -H 'Idempotency-Key: "pay-42"' \\
         -H 'Content-Type: application/json' -d '{"amount": 100}'

The lines marked `# idem` are all the idempotency code: the payment row and the idempotency record commit in one
transaction (`conn`). X-Account stands in for your authentication: the scope must come from who the caller is.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from pydantic import BaseModel
from sqlalchemy import text

from idem_dialects import AsyncIdempotencyStore  # idem
from idem_dialects.http import IdempotencyPolicy  # idem
from idem_dialects.http.asgi import IdempotencyMiddleware  # idem
from idem_dialects.http.fastapi import IdemConnection  # idem


class Payment(BaseModel):
    amount: int


def create_app(url: str, table_prefix: str = "") -> FastAPI:
    store = AsyncIdempotencyStore.from_url(url, table_prefix=table_prefix + "idem_")  # idem
    payments = f"{table_prefix}payments"

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await store.create_tables()  # idem
        async with store.engine.begin() as conn:
            await conn.execute(text(f"CREATE TABLE IF NOT EXISTS {payments}"
                                    " (id SERIAL PRIMARY KEY, account TEXT NOT NULL, amount INTEGER NOT NULL)"))
        yield
        await store.close()  # idem

    app = FastAPI(lifespan=lifespan)
    app.add_middleware(IdempotencyMiddleware, store=store,  # idem
                       policy=IdempotencyPolicy(scope=lambda r: r.header("x-account")))  # idem

    @app.post("/payments", status_code=201)
    async def pay(payment: Payment, request: Request, response: Response,
                  conn: IdemConnection) -> dict[str, int]:  # idem
        row = await conn.execute(text(f"INSERT INTO {payments} (account, amount) VALUES (:a, :m) RETURNING id"),
                                 {"a": request.headers["x-account"], "m": payment.amount})
        payment_id = int(row.scalar_one())
        response.headers["Location"] = f"/payments/{payment_id}"
        return {"id": payment_id, "amount": payment.amount}

    return app


app = create_app(os.environ.get("DATABASE_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"))
