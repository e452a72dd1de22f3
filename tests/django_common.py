"""What the Django tests share (tests/djangotests): the live site on one database alias, and what they count there;
a database alias added for a server of a test module's own (`database_alias`)."""

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
from http_common import free_port
from sqlalchemy import func, select

from idem_dialects.engines.local import ports_free, stop_process
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
def database_alias(alias: str, entry: dict[str, Any], blocker: Any) -> Iterator[None]:
    """`alias` in DATABASES for the block, as if in the settings: Django's connections know it, its database (`entry`:
    used as it is, no test database made for it) is migrated as pytest-django migrates the others', and the test
    project's views for it are routed under /<alias>/ (django_site.urls); all undone after but its tables. Entered
    after pytest-django's database setup (`django_db_setup`, which would otherwise make a test database for it);
    `blocker` (pytest-django's `django_db_blocker`) lets the migration reach the database. Tests name it in their
    django_db mark's `databases`."""
    from django.conf import settings
    from django.core.management import call_command
    from django.core.signals import setting_changed
    from django.db import connections
    from django.urls import clear_url_caches
    from django_site import urls

    databases = settings.DATABASES  # the dict Django's connections read
    assert alias not in databases and connections.settings is databases
    routes = urls.alias_patterns(alias)  # urls imported first: its own loop over DATABASES never sees the alias
    databases[alias] = entry
    connections.configure_settings(databases)  # Django's defaults for the new entry, as at start-up
    urls.urlpatterns += routes
    clear_url_caches()
    try:
        with blocker.unblock():
            call_command("migrate", database=alias, interactive=False, verbosity=0)
        yield
    finally:
        connections[alias].close()
        del connections[alias]  # this thread's; the live server's request threads close theirs after each request
        del databases[alias]
        for route in routes:
            urls.urlpatterns.remove(route)
        clear_url_caches()
        # As override_settings says it on leaving: the library makes its stores anew, this alias's too.
        setting_changed.send(sender=type(settings), setting="DATABASES", value=databases, enter=False)


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
    stopped = track(f"gunicorn on port {port}", lambda: stop_process(server), refusable=False)
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
