"""Litestar under the ASGI middleware (issue 47): Litestar answers a request that fails its validation with 400 before
the handler runs; that answer is the framework's, not stored, so the corrected request with the same key runs.
Uvicorn serves it, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import pytest

from idem_dialects.http import IdempotencyPolicy

httpx = pytest.importorskip("httpx", reason="the [http] extra (httpx) is not installed")
litestar = pytest.importorskip("litestar", reason="litestar (the [dev] extra) is not installed")
from litestar.params import JSONBody  # noqa: E402  # at module level: Litestar resolves the handler's annotations here

Database = Any  # conftest.Database
Serve = Callable[[str, Any], AbstractContextManager[str]]


@dataclass
class Order:
    amount: int


def test_litestars_validation_400_is_not_stored_and_the_corrected_request_runs(database: Database,
                                                                                serve_app: Serve) -> None:
    from http_common import async_store
    from litestar.middleware import DefineMiddleware

    from idem_dialects.http.asgi import IdempotencyMiddleware

    store, lifespan = async_store(database)
    calls: Counter[str] = Counter()

    @litestar.post("/orders", status_code=201)
    async def create(data: JSONBody[Order]) -> dict[str, int]:
        calls["create"] += 1
        return {"amount": data.amount}

    policy = IdempotencyPolicy(scope=lambda r: r.header("x-account"))
    app = litestar.Litestar([create], lifespan=[lifespan],
                            middleware=[DefineMiddleware(IdempotencyMiddleware, store=store, policy=policy)])
    headers = {"x-account": "a1", "idempotency-key": '"order-1"'}
    with serve_app("asgi-middleware", app) as url, httpx.Client(base_url=url, timeout=30) as client:
        invalid = client.post("/orders", json={"amount": "lots"}, headers=headers)
        ran_for_invalid = calls["create"]
        corrected = client.post("/orders", json={"amount": 5}, headers=headers)
        again = client.post("/orders", json={"amount": 5}, headers=headers)
    assert invalid.status_code == 400 and ran_for_invalid == 0, invalid.text
    assert corrected.status_code == 201 and "idempotent-replayed" not in corrected.headers, corrected.text
    assert again.headers["idempotent-replayed"] == "true" and again.content == corrected.content
    assert calls["create"] == 1 and database.count("idem_records") == 1
