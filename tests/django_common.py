"""What the Django tests share (tests/djangotests): the live site on one database alias, and what they count there."""

from __future__ import annotations

import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from http_common import free_port, stop
from sqlalchemy import func, select

from idem_dialects.engines.local import ports_free
from idem_dialects.engines.started import track

httpx = pytest.importorskip("httpx", reason="httpx (the [dev] extra) is not installed")


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

    def runs(self, view: str, key: str) -> int:
        """How many times `view` ran for `key`, counted where it records its runs (django_site.views.record_run)."""
        from django_site.models import Payment
        from django_site.views import RUNS, run_account

        return Payment.objects.using(RUNS).filter(account=run_account(view, key)).count()

    def past_the_lease(self, key: str, lease: timedelta) -> None:
        """Returns once the database's clock is `lease` past the key's record's locked_until: a claim of it still in
        flight has expired by then (a retry takes it over), and a completed record's locked_until is when it
        completed, after any renewal of its lease. The database's clock decides, never the test's."""
        from idem_dialects.django import get_store

        store = get_store(self.alias)
        t = store.tables.records
        held = select(t.c.locked_until, store.backend.now()).where(t.c.idem_key == key)
        while True:
            with store.transaction() as conn:
                locked_until, now = conn.execute(held).one()
            if now - locked_until > lease:
                return
            time.sleep(0.1)


def new_key() -> str:
    return f"key-{secrets.token_hex(6)}"


@contextmanager
def gunicorn(app: str, cwd: Path, env: dict[str, str], workers: int, log: Path) -> Iterator[str]:
    """gunicorn serving `app` from `cwd` on a free loopback port, with the environment `env` (all of it), its output
    in `log`, until the block ends (then stopped, by its pid)."""
    port = free_port()
    command = [str(Path(sys.executable).parent / "gunicorn"), app, "-w", str(workers), "-b", f"127.0.0.1:{port}",
               "--graceful-timeout", "5", "--timeout", "120"]
    ports_free([port])
    with open(log, "ab") as out:
        server = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=out)
    stopped = track(f"gunicorn on port {port}", lambda: stop(server), refusable=False)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"gunicorn did not start (exit {server.returncode}); see {log}") from None
                time.sleep(0.2)
        try:
            yield f"http://127.0.0.1:{port}"
        except BaseException as exc:
            exc.add_note(f"gunicorn's log ({log}):\n{log.read_text(errors='replace')[-3000:]}")
            raise
    finally:
        stopped()
