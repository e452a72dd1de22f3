"""What the Django tests share (tests/djangotests): the live site on one database alias, and what they count there."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import httpx
from sqlalchemy import func, select


@dataclass
class Site:
    """The live server, one database alias, and what the tests count there."""

    url: str
    alias: str

    def client(self, user: str | None = "alice") -> Any:
        auth = (user, f"{user}-password") if user else None
        return httpx.Client(base_url=self.url, auth=auth, timeout=60)

    def post(self, path: str, key: str | None, body: Any = None, user: str | None = "alice",
             headers: dict[str, str] | None = None) -> Any:
        sent = dict(headers or {})
        if key is not None:
            sent["Idempotency-Key"] = f'"{key}"'
        with self.client(user) as client:
            return client.post(f"/{self.alias}/{path}" if not path.startswith("/") else path,
                               json={"amount": 100} if body is None else body, headers=sent)

    def rows(self, account: str | None = None) -> int:
        from django_site.models import Payment

        found = Payment.objects.using(self.alias)
        return (found.filter(account=account) if account else found).count()

    def records(self, key: str) -> int:
        from idem_dialects.django import get_store

        store = get_store(self.alias)
        t = store.tables.records
        with store.transaction() as conn:
            return int(conn.execute(select(func.count()).select_from(t).where(t.c.idem_key == key)).scalar_one())


def new_key() -> str:
    return f"key-{secrets.token_hex(6)}"
