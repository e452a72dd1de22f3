"""docs/store-types.md's table of features by store type: every "yes" is a test that runs the feature through that
store type, and the table says no more and no less than those tests prove."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "store-types.md"
TYPES = ("IdempotencyStore", "AsyncIdempotencyStore", "ShardedStore", "AsyncShardedStore", "DjangoStore")

# The script every store type runs (tests/stores_common.py): run (atomic and leased), the step-by-step API,
# accept_message, consume and an adapter's processing, add_command and a relay, stats and purge.
SCRIPT = {
    "IdempotencyStore": "tests/test_parity.py::test_the_stores_behave_alike",
    "AsyncIdempotencyStore": "tests/test_parity.py::test_the_stores_behave_alike",
    "ShardedStore": "tests/test_parity.py::test_the_sharded_stores_behave_alike",
    "AsyncShardedStore": "tests/test_parity.py::test_the_sharded_stores_behave_alike",
    "DjangoStore": "tests/djangotests/test_django_store.py::"
                   "test_the_store_script_runs_through_django_as_through_an_idempotency_store",
}
SCRIPTED = ("`run` (atomic and leased)", "step by step: `transaction`, `claim`, `complete`, `release`",
            "`accept_message`", "`consume` and the broker adapters' processing",
            "`add_command` and a relay (`Relay`, `AsyncRelay`)", "`stats` and `purge`",
            "`create_tables`, `drop_tables`")
CELLS: dict[tuple[str, str], list[str]] = {(feature, kind): [SCRIPT[kind]] for feature in SCRIPTED for kind in TYPES}
# The same on live servers, beside the script on SQLite.
for kind, check in (("ShardedStore", "test_outbox_consume_stats_and_purge_through_shards"),
                    ("AsyncShardedStore", "test_async_outbox_consume_stats_and_purge_through_shards")):
    for feature in SCRIPTED[3:6]:
        CELLS[feature, kind].append(f"conformance/test_shards.py::{check}")
HTTP = "HTTP: the middleware and framework integrations"
CELLS.update({
    (HTTP, "IdempotencyStore"): ["tests/test_parity.py::test_the_http_runners_behave_alike",
                                 "tests/http/test_http_servers.py"],
    (HTTP, "AsyncIdempotencyStore"): ["tests/test_parity.py::test_the_http_runners_behave_alike",
                                      "tests/http/test_http_servers.py"],
    (HTTP, "ShardedStore"): ["tests/test_sharding.py::test_the_wsgi_middleware_routes_each_tenant_to_its_shard"],
    (HTTP, "AsyncShardedStore"): ["tests/test_sharding.py::test_the_asgi_middleware_and_the_async_store_route_alike"],
    (HTTP, "DjangoStore"): ["tests/djangotests/test_django_middleware.py"],
})


def table() -> dict[tuple[str, str], str]:
    text = PAGE.read_text(encoding="utf-8")
    block = text.split("<!-- store-types -->")[1].split("<!-- /store-types -->")[0]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in block.strip().splitlines()]
    header, body = rows[0], rows[2:]
    assert tuple(header[1:]) == TYPES, header
    return {(row[0], kind): value for row in body for kind, value in zip(TYPES, row[1:], strict=True)}


def test_every_yes_is_a_test_and_every_test_a_yes() -> None:
    cells = table()
    assert {cell for cell, value in cells.items() if value == "yes"} == set(CELLS)
    assert {value for value in cells.values()} <= {"yes", "—"}


def test_every_cells_test_exists() -> None:
    for cell, tests in CELLS.items():
        for node in tests:
            path, _, name = node.partition("::")
            tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
            defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
            assert not name or name in defined, f"{cell}: {node} does not exist"
            assert name or any(re.match(r"test_", d) for d in defined), f"{cell}: {path} has no test"
