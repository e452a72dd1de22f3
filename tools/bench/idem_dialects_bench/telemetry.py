"""What metrics and traces cost per replay (`idem-dialects bench URL --measure telemetry`).

The same replays through `IdempotencyStore.run`, timed under each telemetry below swapped on the store's Core
between slices, interleaved per repetition so drift hits them alike (the report takes medians):

- ``off``: no telemetry, as without opentelemetry-api;
- ``api``: the API's no-op providers, as with opentelemetry-api installed and no SDK;
- ``sdk``: the SDK recording every metric and span (a batch span processor whose exporter drops the spans, and an
  in-memory metric reader, so what is timed is recording, not a collector's network);
- ``traces only`` and ``metrics only``: the same SDK for one signal, the API's no-op provider for the other: how
  ``sdk``'s cost splits between the run span and the measurements;
- ``sampled``: the same SDK keeping one trace in ten (``ParentBased(TraceIdRatioBased(0.1))``), as deployments that
  sample do; metrics are still recorded for every replay;
- ``dropped``: the SDK's tracer with a sampler that keeps nothing (``ALWAYS_OFF``), metrics off: what a run span the
  sampler drops costs;
- ``one span``: no telemetry from the library, but each replay inside one SDK span the caller makes (as a request's
  server span would be): what a single span costs in this process, the reference for the library's share;
- ``cursor events`` and ``sqlalchemy``: no telemetry from the library; the store's statements through SQLAlchemy's
  `Connection.execute` (``cursor_events=True``), the second with OpenTelemetry's SQLAlchemy instrumentation recording
  a span per statement on the SDK: the instrumentation's cost on the same replays is their difference, the yardstick
  for ``sdk`` (needs opentelemetry-instrumentation-sqlalchemy; without it both are left out).

Client CPU counts every thread of the process (the span processor's too). Needs the SDK (opentelemetry-sdk).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy.engine import URL

from idem_dialects.cli.output import Log
from idem_dialects.dialects.base import Backend
from idem_dialects.store import IdempotencyStore
from idem_dialects.telemetry import Telemetry

from .runner import BenchFailed, CannotMeasure, ExactlyOnceViolation, pool_options, scratch_store
from .targets import check

SCHEMA = "idem-dialects-bench-telemetry/3"
CONDITIONS = ("off", "api", "sdk", "traces only", "metrics only", "sampled", "dropped", "one span", "cursor events",
              "sqlalchemy")
SQLALCHEMY = ("cursor events", "sqlalchemy")  # conditions that run the statements through SQLAlchemy's cursor
KEYS = 100


class TelemetryBenchmark:
    """The `Benchmark` (runner.py) of telemetry's cost: replays on one store under each telemetry."""

    def __init__(self, requests: int = 1000, repetitions: int = 5, warmup: int = 100) -> None:
        self.requests, self.repetitions, self.warmup = requests, repetitions, warmup

    def refuse(self, backend: type[Backend]) -> str | None:
        return None

    def measure(self, url: URL, log: Log) -> dict[str, Any]:
        with scratch_store(url, 2) as (store, info):
            sdk = Sdk(store)
            with cursor_stores(url, store, sdk.tracer_provider) as through_cursor:
                report = measure(store, sdk, through_cursor, self.requests, self.repetitions, self.warmup, log) | {
                    "engine": info}
        return report | {"targets": check(report)}


@contextmanager
def cursor_stores(url: URL, store: IdempotencyStore, tracer_provider: Any) -> Iterator[dict[str, IdempotencyStore]]:
    """Stores on `store`'s tables whose statements go through SQLAlchemy's cursor, each on an engine of its own: for
    "cursor events" as they are, for "sqlalchemy" under OpenTelemetry's SQLAlchemy instrumentation (which listens on
    the engine and its pool, so the other conditions' engine stays untouched). None without the instrumentation."""
    try:
        from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
    except ImportError:
        yield {}
        return
    made = {kind: IdempotencyStore.from_url(url, table_prefix=store.table_prefix, cursor_events=True,
                                            **pool_options(url, 2, 2)) for kind in SQLALCHEMY}
    instrumentor = SQLAlchemyInstrumentor()
    # Its declared range stops before SQLAlchemy 2.1, whose engine events it uses are unchanged.
    instrumentor.instrument(engine=made["sqlalchemy"].engine, tracer_provider=tracer_provider, skip_dep_check=True)
    try:
        yield made
    finally:
        instrumentor.uninstrument()
        for made_store in made.values():
            made_store.close()


class Sdk:
    """The OpenTelemetry SDK's providers the conditions record to, and the library telemetries on them for `store`
    (`kinds`: every condition the store's own telemetry makes)."""

    def __init__(self, store: IdempotencyStore) -> None:
        try:
            from opentelemetry.metrics import NoOpMeterProvider
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import InMemoryMetricReader
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
            from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased
            from opentelemetry.trace import NoOpTracerProvider
        except ImportError as exc:
            raise CannotMeasure(f"the OpenTelemetry SDK is not installed ({exc.name}): pip install opentelemetry-sdk"
                                ) from None
        exported = self._exported = [0]

        class Dropped(SpanExporter):
            def export(self, spans: Sequence[Any]) -> SpanExportResult:
                exported[0] += len(spans)
                return SpanExportResult.SUCCESS

        self.tracer_provider = TracerProvider()
        self._sampled = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.1)))
        for provider in (self.tracer_provider, self._sampled):
            provider.add_span_processor(BatchSpanProcessor(Dropped()))
        system, namespace = store.backend.db_system_name, store.backend.db_namespace()
        meters, no_meters, no_tracer = MeterProvider(metric_readers=[InMemoryMetricReader()]), NoOpMeterProvider(), \
            NoOpTracerProvider()
        self.kinds = {
            "off": Telemetry(system, namespace, enabled=False),
            "api": Telemetry(system, namespace, meter_provider=no_meters, tracer_provider=no_tracer),
            "sdk": Telemetry(system, namespace, meter_provider=meters, tracer_provider=self.tracer_provider),
            "traces only": Telemetry(system, namespace, meter_provider=no_meters, tracer_provider=self.tracer_provider),
            "metrics only": Telemetry(system, namespace, meter_provider=meters, tracer_provider=no_tracer),
            "sampled": Telemetry(system, namespace, meter_provider=meters, tracer_provider=self._sampled),
            "dropped": Telemetry(system, namespace, meter_provider=no_meters,
                                 tracer_provider=TracerProvider(sampler=ALWAYS_OFF)),
        }

    def exported(self) -> int:
        """The spans the SDK exported so far."""
        self.tracer_provider.force_flush()
        self._sampled.force_flush()
        return self._exported[0]


def measure(store: IdempotencyStore, sdk: Sdk, through_cursor: dict[str, IdempotencyStore], requests: int,
            repetitions: int, warmup: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Median wall and client CPU time per replay under each telemetry, and the overheads against ``off``
    ("sqlalchemy"'s against "cursor events", the same statements without the instrumentation)."""
    kinds = sdk.kinds | {"one span": sdk.kinds["off"]} | {kind: sdk.kinds["off"] for kind in through_cursor}
    conditions = [kind for kind in CONDITIONS if kind in kinds]
    stores = {kind: through_cursor.get(kind, store) for kind in conditions}
    tracer = kinds["sdk"].tracer
    store.create_tables()

    def never(conn: Any) -> Any:
        raise ExactlyOnceViolation("a replay ran the effect")

    def replays(n: int, kind: str) -> tuple[float, float]:
        runner = stores[kind]
        runner._core.telemetry = kinds[kind]  # the bench's own stores: their telemetry swapped per run
        wall, cpu = time.perf_counter(), time.process_time()
        for i in range(n):
            if kind == "one span":
                with tracer.start_as_current_span("request"):
                    runner.run(scope="bench", operation="replay:v1", key=f"k{i % KEYS}", request={"n": i % KEYS},
                               effect=never)
            else:
                runner.run(scope="bench", operation="replay:v1", key=f"k{i % KEYS}", request={"n": i % KEYS},
                           effect=never)
        return (time.perf_counter() - wall) / n * 1e6, (time.process_time() - cpu) / n * 1e6

    for i in range(KEYS):
        store.run(scope="bench", operation="replay:v1", key=f"k{i}", request={"n": i}, effect=lambda conn: {"ok": 1})
    samples: dict[str, list[tuple[float, float]]] = {kind: [] for kind in conditions}
    for kind in conditions:
        replays(warmup, kind)
    for rep in range(repetitions):
        for kind in conditions[rep % len(conditions):] + conditions[:rep % len(conditions)]:
            samples[kind].append(replays(requests, kind))
        log(f"repetition {rep + 1}/{repetitions}: " + ", ".join(
            f"{kind} {samples[kind][-1][0]:.0f} us" for kind in conditions))
    spans = sdk.exported()
    if spans < requests * repetitions:
        raise BenchFailed(f"the SDK exported {spans} spans for {requests * repetitions} measured replays")
    medians = {kind: {"wall_us": statistics.median(w for w, _ in samples[kind]),
                      "cpu_us": statistics.median(c for _, c in samples[kind])} for kind in conditions}

    def overhead(kind: str) -> dict[str, float]:
        base = medians["cursor events" if kind == "sqlalchemy" else "off"]
        return {"wall_us": medians[kind]["wall_us"] - base["wall_us"],
                "wall_pct": 100 * (medians[kind]["wall_us"] / base["wall_us"] - 1),
                "cpu_us": medians[kind]["cpu_us"] - base["cpu_us"],
                "cpu_pct": 100 * (medians[kind]["cpu_us"] / base["cpu_us"] - 1)}

    return {
        "schema": SCHEMA,
        "requests": requests,
        "repetitions": repetitions,
        "replay": medians,
        "overhead": {kind: overhead(kind) for kind in conditions[1:]},
        "baseline": {kind: "cursor events" if kind == "sqlalchemy" else "off" for kind in conditions[1:]},
        "not_measured": {kind: "opentelemetry-instrumentation-sqlalchemy is not installed"
                         for kind in SQLALCHEMY if kind not in kinds},
        "spans_exported": spans,
        # The SDK samples exemplars of measurements made under a sampled span unless told otherwise: a cost.
        "exemplar_filter": os.environ.get("OTEL_METRICS_EXEMPLAR_FILTER", "trace_based"),
    }
