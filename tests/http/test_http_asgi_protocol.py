"""ASGI protocol edges of the middleware, driven as the server would drive it (on a real SQLite database)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

pytest.importorskip("greenlet", reason="the [async] extra (greenlet) is not installed")
pytest.importorskip("aiosqlite", reason="the [aiosqlite] extra is not installed")

from idem_dialects import AsyncIdempotencyStore
from idem_dialects.http import IdempotencyPolicy
from idem_dialects.http.asgi import IdempotencyMiddleware


def test_a_client_gone_before_its_body_ends_claims_nothing_and_runs_nothing(tmp_path: Path) -> None:
    async def scenario() -> tuple[list[str], list[dict[str, Any]], int]:
        store = AsyncIdempotencyStore.from_url(f"sqlite+aiosqlite:///{tmp_path / 'a.db'}")
        await store.create_tables()
        ran: list[str] = []

        async def app(scope: Any, receive: Any, send: Any) -> None:
            ran.append(scope["path"])

        middleware = IdempotencyMiddleware(app, store, IdempotencyPolicy(global_scope=True))
        messages = iter([{"type": "http.request", "body": b'{"a"', "more_body": True}, {"type": "http.disconnect"}])
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return next(messages)

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/pay", "query_string": b"",
                 "headers": [(b"idempotency-key", b'"k1"'), (b"content-type", b"application/json")]}
        await middleware(scope, receive, send)
        async with store.engine.connect() as conn:
            records = (await conn.execute(text("SELECT count(*) FROM idem_records"))).scalar_one()
        await store.close()
        return ran, sent, int(records)

    assert asyncio.run(scenario()) == ([], [], 0)
