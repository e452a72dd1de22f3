"""The async store for tests that need it: imported on use, so a module without the [async] extra still collects
and its other tests run; the test that needs it skips, naming what to install."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from idem_dialects import AsyncIdempotencyStore


def async_store_class(*drivers: str) -> type[AsyncIdempotencyStore]:
    """AsyncIdempotencyStore, after skipping the test unless greenlet and `drivers` (e.g. "aiosqlite") import."""
    for module in ("greenlet", *drivers):
        extra = "async" if module == "greenlet" else module  # each async driver is an extra of its own name
        pytest.importorskip(module, reason=f"{module} is not installed (pip install 'idem-dialects[{extra}]')")
    from idem_dialects import AsyncIdempotencyStore

    return AsyncIdempotencyStore
