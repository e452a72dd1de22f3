"""Where the spans go: SQLAlchemy's own instrumentation nests under the run span (sync, async, concurrent tasks, none
leaking into another); the HTTP middleware's span is a child of the framework instrumentation's server span; and
without opentelemetry-api the library imports and runs unchanged."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from async_common import async_store_class
from otel_common import Sdk, sdk
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from idem_dialects import IdempotencyStore
from idem_dialects.engines import Unavailable, get
from idem_dialects.http import IdempotencyPolicy

ROOT = Path(__file__).resolve().parent.parent
SQLALCHEMY_SCOPE = "opentelemetry.instrumentation.sqlalchemy"


@pytest.fixture
def otel() -> Sdk:
    found = sdk()
    found.exporter.clear()
    return found


@pytest.fixture
def instrumented() -> Iterator[Any]:
    """SQLAlchemy's instrumentation, applied to the engines a test passes to the returned function."""
    instrumentation = pytest.importorskip("opentelemetry.instrumentation.sqlalchemy",
                                          reason="opentelemetry-instrumentation-sqlalchemy (the [dev] extra)")
    instrumentor = instrumentation.SQLAlchemyInstrumentor()

    def instrument(engine: Engine) -> None:
        # Its declared range stops before SQLAlchemy 2.1, whose engine events it uses are unchanged: checked here.
        instrumentor.instrument(engine=engine, tracer_provider=sdk().tracer_provider, skip_dep_check=True)

    yield instrument
    instrumentor.uninstrument()


def _children(spans: list[Any], parent: Any) -> list[Any]:
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


def test_sqlalchemy_spans_nest_under_the_run_span_and_nothing_leaks(otel: Sdk, instrumented: Any,
                                                                    tmp_path: Path) -> None:
    from opentelemetry import trace

    tracer = otel.tracer_provider.get_tracer("test")
    # Instrumentation listens to SQLAlchemy's cursor events, which the store's own statements raise only when asked.
    with IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'n.db'}", cursor_events=True) as store:
        store.create_tables()
        instrumented(store.engine)
        with tracer.start_as_current_span("caller") as caller:
            store.run(scope="s", operation="op", key="k", request={},
                      effect=lambda conn: conn.execute(text("SELECT 41 + 1")).scalar_one())
            assert trace.get_current_span() is caller  # the run span is current no longer
        assert trace.get_current_span() is trace.INVALID_SPAN
    spans = otel.spans()
    (run,) = [s for s in spans if s.name == "idempotency run"]
    assert run.parent.span_id == caller.get_span_context().span_id
    sql = [s for s in spans if s.instrumentation_scope.name == SQLALCHEMY_SCOPE]
    # BEGIN IMMEDIATE, the claim's statements, the effect's SELECT and the completing UPDATE: all under the run.
    assert len(sql) >= 4 and all(s.parent.span_id == run.context.span_id for s in sql), [s.name for s in sql]
    assert any("41 + 1" in str(s.attributes.get("db.statement", "")) for s in sql)


def test_concurrent_async_runs_nest_in_their_own_task(otel: Sdk, instrumented: Any) -> None:
    """Two tasks interleave their runs (both effects are running at once, on PostgreSQL's two connections): every SQL
    span sits under its own task's run span, and each task finds its own span current again afterwards."""
    from opentelemetry import trace

    try:
        server = get("postgresql").provide()
    except Unavailable as exc:
        pytest.skip(f"postgresql: {exc}")
    url = make_url(server.url).set(drivername="postgresql+asyncpg")
    tracer = otel.tracer_provider.get_tracer("test")

    async def main() -> dict[str, Any]:
        async with async_store_class().from_url(url, table_prefix=f"ots{uuid.uuid4().hex[:8]}_") as store:
            await store.create_tables()
            instrumented(store.engine.sync_engine)
            both = asyncio.Barrier(2)
            callers: dict[str, Any] = {}

            async def task(name: str) -> None:
                with tracer.start_as_current_span(name) as caller:
                    callers[name] = caller

                    async def effect(conn: Any) -> Any:
                        await both.wait()  # both runs are inside their effect at once
                        return (await conn.execute(text(f"SELECT '{name}'"))).scalar_one()

                    await store.run(scope="s", operation="op", key=name, request={}, effect=effect,
                                    lease=timedelta(seconds=30))
                    assert trace.get_current_span() is caller

            await asyncio.gather(task("one"), task("two"))
            await store.drop_tables()
            return callers

    try:
        callers = asyncio.run(main())
    finally:
        server.stop()
    spans = otel.spans()
    for name, caller in callers.items():
        (run,) = [s for s in spans if s.name == "idempotency run" and s.parent.span_id ==
                  caller.get_span_context().span_id]
        sql = _children(spans, run)
        assert any(f"'{name}'" in str(s.attributes.get("db.statement", "")) for s in sql)
        other = "two" if name == "one" else "one"
        assert not any(f"'{other}'" in str(s.attributes.get("db.statement", "")) for s in sql)
    runs = [s for s in spans if s.name == "idempotency run"]
    sql = [s for s in spans if s.instrumentation_scope.name == SQLALCHEMY_SCOPE and "SELECT '" in
           str(s.attributes.get("db.statement", ""))]
    assert len(runs) == 2 and len(sql) == 2
    assert {s.parent.span_id for s in sql} == {r.context.span_id for r in runs}


def test_asgi_request_span_is_a_child_of_the_server_span(otel: Sdk, tmp_path: Path) -> None:
    asgi = pytest.importorskip("opentelemetry.instrumentation.asgi",
                               reason="opentelemetry-instrumentation-asgi (the [dev] extra)")
    httpx = pytest.importorskip("httpx", reason="httpx (the [dev] extra)")
    from idem_dialects.http.asgi import IdempotencyMiddleware

    async def main() -> list[int]:
        async with async_store_class().from_url(f"sqlite+aiosqlite:///{tmp_path / 'h.db'}") as store:
            await store.create_tables()

            async def app(scope: Any, receive: Any, send: Any) -> None:
                await send({"type": "http.response.start", "status": 201, "headers": []})
                await send({"type": "http.response.body", "body": b"made"})

            stack = asgi.OpenTelemetryMiddleware(
                IdempotencyMiddleware(app, store, IdempotencyPolicy(global_scope=True, operation="pay")),
                tracer_provider=otel.tracer_provider)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(stack), base_url="http://t") as client:
                return [(await client.post("/pay", headers={"Idempotency-Key": '"k1"'}, json={})).status_code
                        for _ in range(2)]

    assert asyncio.run(main()) == [201, 201]
    spans = otel.spans()
    servers = [s for s in spans if s.kind.name == "SERVER"]
    requests = [s for s in spans if s.name == "idempotency request"]
    assert len(servers) == len(requests) == 2
    for server, request in zip(servers, requests, strict=True):
        assert request.parent.span_id == server.context.span_id
        assert request.attributes["http.response.status_code"] == 201
        (run,) = _children(spans, request)
        assert run.name == "idempotency run"
    assert [r.attributes["idempotency.outcome"] for r in spans if r.name == "idempotency run"] == ["claimed",
                                                                                                   "replayed"]


def test_wsgi_request_span_is_a_child_of_the_server_span(otel: Sdk, tmp_path: Path) -> None:
    wsgi = pytest.importorskip("opentelemetry.instrumentation.wsgi",
                               reason="opentelemetry-instrumentation-wsgi (the [dev] extra)")
    from werkzeug.test import Client

    from idem_dialects.http.wsgi import IdempotencyMiddleware

    def app(environ: Any, start_response: Any) -> list[bytes]:
        start_response("202 Accepted", [("Content-Type", "text/plain")])
        return [b"queued"]

    with IdempotencyStore.from_url(f"sqlite:///{tmp_path / 'w.db'}") as store:
        store.create_tables()
        policy = IdempotencyPolicy(global_scope=True, operation="send", lease=timedelta(seconds=30))
        client = Client(wsgi.OpenTelemetryMiddleware(IdempotencyMiddleware(app, store, policy),
                                                     tracer_provider=otel.tracer_provider))
        assert client.post("/send", headers={"Idempotency-Key": '"k"'}).status_code == 202
    spans = otel.spans()
    (server,) = [s for s in spans if s.kind.name == "SERVER"]
    (request,) = [s for s in spans if s.name == "idempotency request"]
    assert request.parent.span_id == server.context.span_id
    # External-call mode claims and completes outside a run: the request span is the only one.
    assert request.attributes["http.response.status_code"] == 202
    assert request.attributes["idempotency.operation"] == "send"
    assert not [s for s in spans if s.name == "idempotency run"]


BLOCKED = textwrap.dedent("""
    import sys
    sys.modules["opentelemetry"] = None  # as if opentelemetry-api were not installed: every import of it fails
""")

WITHOUT_OTEL = BLOCKED + textwrap.dedent("""
    import asyncio
    from datetime import timedelta
    from idem_dialects import AsyncIdempotencyStore, IdempotencyStore, RequestMismatch
    from idem_dialects.http import IdempotencyPolicy
    from idem_dialects.http.policy import HttpRequest
    from idem_dialects.http.problems import HttpResponse
    from idem_dialects.http.runner import Idempotency

    with IdempotencyStore.from_url(f"sqlite:///{sys.argv[1]}/s.db") as store:
        assert not store._core.telemetry.enabled
        store.create_tables()
        first = store.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: {"n": 1})
        again = store.run(scope="s", operation="op", key="k", request={}, effect=lambda conn: {"n": 2})
        assert not first.replayed and again.replayed and again.response == {"n": 1}
        try:
            store.run(scope="s", operation="op", key="k", request={"x": 1}, effect=lambda conn: None)
        except RequestMismatch:
            pass
        with store.transaction() as conn:
            assert store.accept_message(conn, subscriber="p", message_id="m")
        http = Idempotency(store, IdempotencyPolicy(global_scope=True))
        req = HttpRequest("POST", "/pay", [("idempotency-key", '"h"')])
        assert http.handle(req, lambda conn: HttpResponse(201, [], b"ok")).status == 201
        assert store.stats().completed == 2
        assert store.purge(timedelta(0)) >= 0

    async def main():
        async with AsyncIdempotencyStore.from_url(f"sqlite+aiosqlite:///{sys.argv[1]}/a.db") as store:
            await store.create_tables()
            async def effect(conn):
                return 7
            assert (await store.run(scope="s", operation="op", key="k", request={}, effect=effect)).response == 7
            assert (await store.stats()).completed == 1

    asyncio.run(main())
    loaded = [m for m in sys.modules if m.startswith("opentelemetry") and sys.modules[m] is not None]
    assert not loaded, loaded
    print("ran without opentelemetry")
""")


def test_the_library_runs_unchanged_without_opentelemetry(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", WITHOUT_OTEL, str(tmp_path)], capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ran without opentelemetry"
    assert "Traceback" not in done.stderr


def test_importing_the_library_loads_no_opentelemetry_module() -> None:
    code = ("import sys, idem_dialects, idem_dialects.http;"
            " print(sorted(m for m in sys.modules if 'opentelemetry' in m))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"


SDK_LATER = textwrap.dedent("""
    import sys
    from idem_dialects import IdempotencyStore

    # The application's store exists before its telemetry is configured (made at import, the SDK set up in main).
    store = IdempotencyStore.from_url(f"sqlite:///{sys.argv[1]}/late.db")
    store.create_tables()
    store.run(scope="s", operation="op", key="before", request={}, effect=lambda conn: 1)

    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    store.run(scope="s", operation="op", key="after", request={}, effect=lambda conn: 1)
    IdempotencyStore.from_url(f"sqlite:///{sys.argv[1]}/late.db").run(
        scope="s", operation="op", key="after", request={}, effect=lambda conn: 1)  # a store made after: a replay
    found = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in metric.data.data_points:
                    if metric.name == "idempotency.outcomes":
                        found[point.attributes["idempotency.outcome"]] = point.value
    print(sorted(found.items()))
""")


def test_stores_made_before_the_sdk_is_installed_report_to_it(tmp_path: Path) -> None:
    """Counters are cumulative from the store's first claim; stores made before and after the SDK share them."""
    done = subprocess.run([sys.executable, "-c", SDK_LATER, str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[('claimed', 2), ('replayed', 1)]", done.stdout + done.stderr[-2000:]
    assert "has been created already" not in done.stderr  # no instrument registered twice
