"""Check: `create_tables()` from many processes at once (workers of a service starting together on a fresh database):
8 processes released by one barrier on a fresh table prefix, 3 rounds; every call succeeds and the tables exist once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
from sqlalchemy import inspect

from idem_dialects import IdempotencyStore
from idem_dialects.conformance import support

from .plugin import EngineUnderTest, unique_prefix

PROCESSES = 8
ROUNDS = 3


@pytest.mark.idem_stack
@pytest.mark.idem_requires("processes")
def test_create_tables_from_many_processes_at_once(idem_engine: EngineUnderTest,
                                                   idem_observe: Callable[[str, object], None]) -> None:
    """create_tables() called by 8 processes at once on a fresh table prefix succeeds in every one, and the tables
    and their index exist once, ready for use (3 rounds); the sync or async store as the column says."""
    prefixes = [unique_prefix() for _ in range(ROUNDS)]
    ctx = support.fresh_processes()
    barrier, out = ctx.Barrier(PROCESSES), ctx.Queue()
    url = idem_engine.url.render_as_string(hide_password=False)
    # The worker is named by its installed module path, which a fresh interpreter can always import.
    procs = [ctx.Process(target=support.create_tables_worker,
                         args=(url, idem_engine.driver is not None, prefixes, barrier, out))
             for _ in range(PROCESSES)]
    # A store's engine: it consumes the URL's own options (pooler, writers, ...) that a driver would refuse.
    engine = IdempotencyStore.from_url(idem_engine.server.url).engine
    try:
        seen = Counter(outcome for report in support.run_processes(procs, out) for outcome in report)
        assert seen == {"ok": PROCESSES * ROUNDS}, f"create_tables calls that failed: {dict(seen)}"
        idem_observe(f"{PROCESSES} processes x {ROUNDS} fresh prefixes: create_tables", "all succeeded")
        for prefix in prefixes:
            tables = [t for t in inspect(engine).get_table_names() if t.lower().startswith(prefix)]
            assert sorted(t.lower() for t in tables) == [f"{prefix}messages", f"{prefix}outbox", f"{prefix}records"]
            records = next(t for t in tables if t.lower() == f"{prefix}records")
            indexes = [i["name"].lower() for i in inspect(engine).get_indexes(records) if i["name"]]
            assert indexes.count(f"{prefix}records_done_ix") == 1
            with IdempotencyStore(engine, table_prefix=prefix) as store:  # and they work
                assert store.run(scope="s", operation="op", key="k", request={},
                                 effect=lambda conn: "done").response == "done"
    finally:
        try:
            for prefix in prefixes:
                IdempotencyStore(engine, table_prefix=prefix).drop_tables()
        finally:
            engine.dispose()
