"""What the commands that talk to one database share: its store, reached once before any work.

A server that refuses the connection, or a host name that does not resolve, is told at once (two lines, exit 2):
one server not answering a command is not a failover. The store's retry budget, sized for a failover (docs:
Clusters), stays for what the command does once connected, and for the long-running `relay`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..store import IdempotencyStore


@contextmanager
def reached(url: str, *, existing: bool = False, **options: Any) -> Iterator[IdempotencyStore]:
    """The store at `url` (`options` go to `IdempotencyStore.from_url`), once one connection opened without retries.
    `existing`: never create the database (a mistyped SQLite path is an error, not a new empty file)."""
    from ..store import IdempotencyStore
    from ..storebase import connect
    from ..url import existing_database

    with IdempotencyStore.from_url(existing_database(url) if existing else url, **options) as store:
        with connect(store.engine, store.backend):
            pass
        yield store
