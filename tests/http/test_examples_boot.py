"""Both examples as deployed: four worker processes starting at once on a fresh database, ten boots each — every
worker boots — then 20 concurrent requests with one key make one payment row. The FastAPI example also documents
the key header and the layer's problems in its /openapi.json."""

from __future__ import annotations

import secrets
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from http_common import gunicorn, server, uvicorn
from sqlalchemy import create_engine, inspect, text

from idem_dialects import IdempotencyStore
from idem_dialects.engines import Unavailable, get

httpx = pytest.importorskip("httpx", reason="httpx (the [dev] extra) is not installed")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BOOTS = 10
WORKERS = 4
REQUESTS = 20
BOOT_FAILED = ("Traceback", "Worker failed to boot", "Application startup failed", "Exception in worker")


def one_key_twenty_times(url: str) -> Counter[int]:
    """20 concurrent POSTs with one key; the statuses; each answer the same bytes."""
    headers = {"x-account": "1", "idempotency-key": '"boot-pay"', "content-type": "application/json"}

    def post(_: int) -> Any:
        with httpx.Client(base_url=url, timeout=60) as client:
            return client.post("/payments", content=b'{"amount": 100}', headers=headers)

    with ThreadPoolExecutor(REQUESTS) as pool:
        answers = list(pool.map(post, range(REQUESTS)))
    assert len({a.content for a in answers if a.status_code == 201}) == 1
    return Counter(a.status_code for a in answers)


def booted(log: Path) -> str:
    text = log.read_text(errors="replace")
    assert not any(sign in text for sign in BOOT_FAILED), text[-3000:]
    return text


@pytest.mark.slow  # ten gunicorn boots
def test_flask_example_boots_10_times_under_gunicorn_4_workers_on_a_fresh_sqlite(tmp_path: Path) -> None:
    pytest.importorskip("gunicorn", reason="gunicorn (the [dev] extra) is not installed")
    pytest.importorskip("flask", reason="the [flask] extra is not installed")
    boots = 0
    for n in range(BOOTS):
        db = tmp_path / f"boot{n}.db"
        env = {"DATABASE_URL": f"sqlite:///{db}"}
        log = tmp_path / f"gunicorn{n}.log"
        command = gunicorn("flask_sqlite:create_app()", EXAMPLES, env, log, WORKERS)
        with server(command, EXAMPLES, env, log, lambda t: t.count("Booting worker") >= WORKERS) as url:
            statuses = one_key_twenty_times(url)
        booted(log)
        assert statuses == Counter({201: REQUESTS}), statuses
        engine = create_engine(f"sqlite:///{db}")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM payments")).scalar_one() == 1
        engine.dispose()
        boots += 1
    assert boots == BOOTS


def test_fastapi_example_boots_10_times_under_uvicorn_4_workers_on_a_fresh_postgresql(tmp_path: Path) -> None:
    pytest.importorskip("uvicorn", reason="uvicorn (the [dev] extra) is not installed")
    pytest.importorskip("fastapi", reason="the [fastapi] extra is not installed")
    try:
        sync_url = get("postgresql").provide().url
    except Unavailable as exc:
        pytest.skip(f"postgresql unavailable: {exc}")
    engine = create_engine(sync_url)
    async_url = engine.url.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)
    boots = 0
    try:
        for n in range(BOOTS):
            prefix = f"b{secrets.token_hex(3)}_"  # a fresh database: none of the example's tables exist yet
            env = {"DATABASE_URL": async_url, "TABLE_PREFIX": prefix}
            log = tmp_path / f"uvicorn{n}.log"
            command = uvicorn("fastapi_postgres:app", EXAMPLES, env, WORKERS)
            try:
                with server(command, EXAMPLES, env, log,
                            lambda t: t.count("Application startup complete") >= WORKERS) as url:
                    statuses = one_key_twenty_times(url)
                booted(log)
                assert statuses == Counter({201: REQUESTS}), statuses
                with engine.connect() as conn:
                    assert conn.execute(text(f"SELECT count(*) FROM {prefix}payments")).scalar_one() == 1
                boots += 1
            finally:
                IdempotencyStore(engine, table_prefix=prefix + "idem_").drop_tables()
                if inspect(engine).has_table(f"{prefix}payments"):
                    with engine.begin() as conn:
                        conn.execute(text(f"DROP TABLE {prefix}payments"))
        assert boots == BOOTS
    finally:
        engine.dispose()


def test_fastapi_example_openapi_documents_the_key_header_and_the_problems(tmp_path: Path) -> None:
    testclient = pytest.importorskip("fastapi.testclient", reason="fastapi or httpx is not installed")
    import importlib.util

    spec = importlib.util.spec_from_file_location("example_fastapi_openapi", EXAMPLES / "fastapi_postgres.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # builds the app; nothing connects until a request needs the database
    schema = testclient.TestClient(module.app).get("/openapi.json").json()
    operation = schema["paths"]["/payments"]["post"]
    header = [p for p in operation["parameters"] if p["in"] == "header"]
    assert [(p["name"], p["required"]) for p in header] == [("Idempotency-Key", True)]
    for status in ("400", "409", "422"):
        assert "application/problem+json" in operation["responses"][status]["content"], status
    assert "201" in operation["responses"]
