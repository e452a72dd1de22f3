"""A chunked request body (no Content-Length; gunicorn sets wsgi.input_terminated) under real gunicorn: the WSGI
middleware reads it to its end under the same size limit, fingerprints all of it, and hands the handler all of it."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from http_common import gunicorn, server

httpx = pytest.importorskip("httpx", reason="httpx (the [dev] extra) is not installed")
Database = Any  # conftest.Database
HERE = Path(__file__).resolve().parent
LIMIT = 256 * 1024


def chunks(body: bytes, size: int = 8192) -> Iterator[bytes]:
    """An iterator without a length: httpx sends it with Transfer-Encoding: chunked."""
    for i in range(0, len(body), size):
        yield body[i:i + size]


def test_chunked_bodies_reach_the_handler_whole_and_are_compared_whole(database: Database, tmp_path: Path) -> None:
    pytest.importorskip("gunicorn", reason="gunicorn (the [dev] extra) is not installed")
    env = {"DATABASE_URL": database.sync_url, "TABLE_PREFIX": database.prefix, "MAX_REQUEST_BYTES": str(LIMIT),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    log = tmp_path / "gunicorn.log"
    command = gunicorn("wsgi_chunked_app:create_app()", HERE, env, log, workers=2)
    body = os.urandom(200 * 1024)
    other = body[:-1] + bytes([body[-1] ^ 1])  # the same length, the last byte differs
    headers = {"idempotency-key": "3f2a-chunked", "content-type": "application/octet-stream"}
    with server(command, HERE, env, log, lambda t: t.count("Booting worker") >= 2) as url, \
            httpx.Client(base_url=url, timeout=60) as client:
        first = client.post("/upload", content=chunks(body), headers=headers)
        assert first.request.headers.get("transfer-encoding") == "chunked"
        assert "content-length" not in first.request.headers
        assert first.status_code == 201, first.text
        assert first.json() == {"received": len(body), "sha256": hashlib.sha256(body).hexdigest()}
        replay = client.post("/upload", content=chunks(body), headers=headers)
        assert replay.status_code == 201 and replay.headers["idempotent-replayed"] == "true"
        mismatch = client.post("/upload", content=chunks(other), headers=headers)
        assert mismatch.status_code == 422
        assert mismatch.json()["type"].endswith("#request-mismatch")
        too_big = client.post("/upload", content=chunks(os.urandom(LIMIT + 1)),
                              headers={**headers, "idempotency-key": "3f2a-too-big"})
        assert too_big.status_code == 413 and too_big.json()["type"].endswith("#request-too-large")
    assert database.count("payments") == 1  # one run, with the whole body
    assert database.count("idem_records") == 1
