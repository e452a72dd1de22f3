"""FastAPI on PostgreSQL: POST /payments runs once per Idempotency-Key; every retry gets the stored answer.

    DATABASE_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/test uvicorn --app-dir examples fastapi_postgres:app
    curl -X POST localhost:8000/payments -H 'X-Account: 1' -H 'Idempotency-Key: "pay-42"' \\
         -H 'Content-Type: application/json' -d '{"amount": 100}'

The lines marked `# idem` are all the idempotency code: the payment row and the idempotency record commit in one
transaction (`conn`). X-Account stands in for your authentication: the scope must come from who the caller is.
The route class also documents the Idempotency-Key header and the 400/409/422 problems in /openapi.json.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request, Response
from pydantic import BaseModel
from sqlalchemy import text

from idem_dialects import AsyncIdempotencyStore  # idem
from idem_dialects.http import IdempotencyPolicy  # idem
from idem_dialects.http.fastapi import IdemConnection, idempotent_route  # idem


class Payment(BaseModel):
    amount: int


def create_app(url: str, table_prefix: str = "") -> FastAPI:
    store = AsyncIdempotencyStore.from_url(url, table_prefix=table_prefix + "idem_")  # idem
    policy = IdempotencyPolicy(scope=lambda r: r.header("x-account"))  # idem
    payments = f"{table_prefix}payments"

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await store.create_tables()  # idem
        async with store.engine.begin() as conn:  # workers start together: one creates the table at a time
            await conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:name))"), {"name": payments})
            await conn.execute(text(f"CREATE TABLE IF NOT EXISTS {payments}"
                                    " (id SERIAL PRIMARY KEY, account TEXT NOT NULL, amount INTEGER NOT NULL)"))
        yield
        await store.close()  # idem

    app = FastAPI(lifespan=lifespan)
    router = APIRouter(route_class=idempotent_route(store, policy))  # idem

    @router.post("/payments", status_code=201)
    async def pay(payment: Payment, request: Request, response: Response,
                  conn: IdemConnection) -> dict[str, int]:  # idem
        row = await conn.execute(text(f"INSERT INTO {payments} (account, amount) VALUES (:a, :m) RETURNING id"),
                                 {"a": request.headers["x-account"], "m": payment.amount})
        payment_id = int(row.scalar_one())
        response.headers["Location"] = f"/payments/{payment_id}"
        return {"id": payment_id, "amount": payment.amount}

    app.include_router(router)
    return app


app = create_app(os.environ.get("DATABASE_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"),
                 os.environ.get("TABLE_PREFIX", ""))
