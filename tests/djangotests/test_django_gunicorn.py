"""A gunicorn worker killed with SIGKILL after the view's ORM write and before its response: the write and the claim
die with its transaction, and the client's retry runs the view once -- exactly one row, on every engine."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connections
from django_common import Site, gunicorn, new_key

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")
TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture
def served(site: Site, tmp_path: Path) -> Iterator[tuple[Site, Path]]:
    """The test site under gunicorn (2 workers) on this run's test databases."""
    keep = ("ENGINE", "NAME", "USER", "PASSWORD", "HOST", "PORT", "OPTIONS")
    databases = {alias: {k: connections[alias].settings_dict[k] for k in keep} for alias in connections}
    flag = tmp_path / "crash"
    env = {**os.environ, "PYTHONPATH": str(TESTS), "DJANGO_SETTINGS_MODULE": "django_site.settings",
           "IDEM_DJANGO_DATABASES": json.dumps(databases), "IDEM_CRASH_FLAG": str(flag)}
    with gunicorn("django_site.wsgi:application", TESTS, env, workers=2, log=tmp_path / "gunicorn.log") as url:
        yield Site(url, site.alias), flag


def test_kill_9_between_the_write_and_the_response_then_retry_one_row(served: tuple[Site, Path]) -> None:
    site, flag = served
    key = new_key()
    flag.touch()  # the next crash view's request writes, then waits to be killed
    outcome: list[Any] = []

    def first() -> None:
        try:
            outcome.append(site.post("crash", key))
        except httpx.HTTPError as exc:  # the worker died under the request
            outcome.append(exc)

    request = threading.Thread(target=first)
    request.start()
    pid_file = Path(f"{flag}.pid")
    deadline = time.monotonic() + 60
    while not pid_file.exists():
        assert time.monotonic() < deadline, "the crash view never reached its write"
        time.sleep(0.05)
    time.sleep(0.1)  # the pid is written after the ORM write, inside the open transaction
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    request.join(60)
    assert outcome and (isinstance(outcome[0], httpx.HTTPError) or outcome[0].status_code >= 500), outcome
    assert site.rows() == 0 and site.records(key) == 0  # the killed transaction took its row and its claim along

    retry = site.post("crash", key)
    assert retry.status_code == 201 and "idempotent-replayed" not in retry.headers
    replay = site.post("crash", key)
    assert replay.headers["idempotent-replayed"] == "true" and replay.content == retry.content
    assert site.rows() == 1 and site.records(key) == 1
