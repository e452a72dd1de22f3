"""The sync and async APIs are one API: the same public names, parameters and defaults, and the same behaviour where
the async store once drifted (encoder, purge progress, the identity limit)."""

from __future__ import annotations

import asyncio
import inspect
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

# The async store (SQLAlchemy's asyncio layer needs greenlet) on aiosqlite: the [async] and [aiosqlite] extras.
pytest.importorskip("greenlet", reason="greenlet is not installed (pip install 'idem-dialects[async]')")
pytest.importorskip("aiosqlite", reason="aiosqlite is not installed (pip install 'idem-dialects[aiosqlite]')")

from sqlalchemy.ext.asyncio import AsyncConnection

from idem_dialects import AsyncIdempotencyStore, IdempotencyStore, InvalidKey, default_encoder
from idem_dialects.http.runner import AsyncIdempotency, Idempotency

# The context-manager protocol is spelled differently on purpose (`with` vs `async with`).
_ASYNC_SPELLING = {"__aenter__": "__enter__", "__aexit__": "__exit__"}


def _public(cls: type) -> dict[str, Any]:
    """Public members by their sync name: everything not private, the constructor and the context manager."""
    members = {}
    for name, member in inspect.getmembers(cls):
        name = _ASYNC_SPELLING.get(name, name)
        if not name.startswith("_") or name in ("__init__", "__enter__", "__exit__"):
            members[name] = member
    return members


def _shape(member: Any) -> list[tuple[str, Any, Any]] | str:
    """Parameters (name, kind, default) of a callable, or what kind of attribute it is."""
    if isinstance(member, property):
        return "property"
    if not callable(member):
        return type(member).__name__
    return [(p.name, p.kind, p.default) for p in inspect.signature(member).parameters.values()]


@pytest.mark.parametrize(("sync", "aio"), [(IdempotencyStore, AsyncIdempotencyStore), (Idempotency, AsyncIdempotency)])
def test_sync_and_async_public_signatures_are_identical(sync: type, aio: type) -> None:
    """Same names, parameters, kinds and defaults; every method that does I/O is awaited on the async side."""
    sync_api, async_api = _public(sync), _public(aio)
    assert sorted(sync_api) == sorted(async_api)
    for name, member in sync_api.items():
        twin = async_api[name]
        assert _shape(member) == _shape(twin), f"{sync.__name__}.{name} and {aio.__name__}.{name} differ"
        does_io = callable(member) and not isinstance(member, property) and name not in (
            "__init__", "from_url", "retry_cause", "transaction")  # transaction returns an (async) context manager
        assert not does_io or inspect.iscoroutinefunction(twin), f"{aio.__name__}.{name} is not awaited"


def test_async_from_url_takes_an_encoder_and_replays_a_decimal(tmp_path: Path) -> None:
    async def main() -> None:
        url = f"sqlite+aiosqlite:///{tmp_path / 'enc.db'}"
        async with AsyncIdempotencyStore.from_url(url, encoder=default_encoder) as store:
            await store.create_tables()
            calls: list[int] = []

            async def effect(conn: AsyncConnection) -> Any:
                calls.append(1)
                return {"total": Decimal("10.50")}

            request = {"amount": Decimal("10.50")}
            first = await store.run(scope="s", operation="op", key="k", request=request, effect=effect)
            again = await store.run(scope="s", operation="op", key="k", request=request, effect=effect)
        assert first.response == {"total": Decimal("10.50")} and not first.replayed
        assert again.replayed and again.response == {"total": "10.50"} and calls == [1]

    asyncio.run(main())


def test_async_purge_reports_progress_and_honours_the_identity_limit(tmp_path: Path) -> None:
    async def main() -> None:
        async with AsyncIdempotencyStore.from_url(f"sqlite+aiosqlite:///{tmp_path / 'p.db'}") as store:
            await store.create_tables()

            async def effect(conn: AsyncConnection) -> int:
                return 1

            for n in range(3):
                await store.run(scope="s", operation="op", key=f"k{n}", request={}, effect=effect)
            seen: list[tuple[str, int]] = []
            deleted = await store.purge(older_than=timedelta(0), batch_size=2,
                                        progress=lambda table, count: seen.append((table, count)))
            assert deleted == 3
            assert seen == [("idem_records", 2), ("idem_records", 1), ("idem_messages", 0), ("idem_outbox", 0)]
            wide = "\U0001f600" * 255  # 1,020 bytes: three of them exceed the 1,700-byte identity limit
            with pytest.raises(InvalidKey, match="1700 bytes"):
                await store.run(scope=wide, operation=wide, key=wide, request={}, effect=effect)

    asyncio.run(main())
