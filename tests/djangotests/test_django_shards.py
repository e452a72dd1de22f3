"""IDEMPOTENCY['SHARDS']: the store spans several database aliases and Django's own database routers choose each
key's alias (`db_for_write(IdempotencyRecord, scope=...)`); the effect runs on that alias's connection, inside the
atomic block the record commits in."""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from django.db import connections
from django.test import override_settings
from django_site.routers import shard_of

from idem_dialects import ShardedStore
from idem_dialects.django import get_store


@pytest.mark.django_db(databases=["default", "shard_b"], transaction=True)
def test_django_routers_choose_each_keys_database() -> None:
    with override_settings(DATABASE_ROUTERS=["django_site.routers.TenantRouter"],
                           IDEMPOTENCY={"SHARDS": ["default", "shard_b"]}):
        store = get_store()
        assert isinstance(store, ShardedStore) and set(store.shards) == {"default", "shard_b"}
        run = secrets.token_hex(3)  # the records tables outlive Django's flush: this test's own tenants only
        tenants = [f"tenant-{run}:{i}" for i in range(8)]
        assert {shard_of(t) for t in tenants} == {"default", "shard_b"}
        for tenant in tenants:
            def effect(conn: Any, tenant: str = tenant) -> str:
                # The effect's connection is the routed alias's own, inside its atomic block.
                assert connections[shard_of(tenant)].in_atomic_block
                return tenant

            for _ in range(2):
                assert store.run(scope=tenant, operation="op", key="k", request={}, effect=effect).response == tenant
        for alias in ("default", "shard_b"):
            table = store.shards[alias].tables.records.name
            with connections[alias].cursor() as cursor:
                cursor.execute(f"SELECT scope FROM {table}")
                mine = sorted(r[0] for r in cursor.fetchall() if r[0] in tenants)
                assert mine == sorted(t for t in tenants if shard_of(t) == alias)
