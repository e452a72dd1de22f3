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
- ``one span``: no telemetry from the library, but each replay inside one SDK span the caller makes (as a request's
  server span would be): what a single span costs in this process, the reference for the library's share.

Client CPU counts every thread of the process (the span processor's too). Needs the SDK (opentelemetry-sdk).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.engine import URL

from ...dialects.base import Backend
from ...store import IdempotencyStore
from ...telemetry import Telemetry
from .runner import BenchFailed, CannotMeasure, ExactlyOnceViolation, Log, scratch_store

SCHEMA = "idem-dialects-bench-telemetry/2"
CONDITIONS = ("off", "api", "sdk", "traces only", "metrics only", "sampled", "one span")
KEYS = 100


class TelemetryBenchmark:
    """The `Benchmark` (runner.py) of telemetry's cost: replays on one store under each telemetry."""

    def __init__(self, requests: int = 1000, repetitions: int = 5, warmup: int = 100) -> None:
        self.requests, self.repetitions, self.warmup = requests, repetitions, warmup

    def refuse(self, backend: type[Backend]) -> str | None:
        return None

    def measure(self, url: URL, log: Log) -> dict[str, Any]:
        with scratch_store(url, 2) as (store, info):
            return measure(store, self.requests, self.repetitions, self.warmup, log) | {"engine": info}


def telemetries(store: IdempotencyStore) -> tuple[dict[str, Telemetry], Callable[[], int]]:
    """The library telemetries for `store` (every condition but "one span"), and a function counting the spans the
    SDK exported so far."""
    try:
        from opentelemetry.metrics import NoOpMeterProvider
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace import NoOpTracerProvider
    except ImportError as exc:
        raise CannotMeasure(f"the OpenTelemetry SDK is not installed ({exc.name}): pip install opentelemetry-sdk"
                            ) from None

    exported = [0]

    class Dropped(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            exported[0] += len(spans)
            return SpanExportResult.SUCCESS

    tracer_provider, sampled_provider = TracerProvider(), TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.1)))
    for provider in (tracer_provider, sampled_provider):
        provider.add_span_processor(BatchSpanProcessor(Dropped()))
    system, namespace = store.backend.db_system_name, store.backend.db_namespace()
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])

    def count() -> int:
        tracer_provider.force_flush()
        sampled_provider.force_flush()
        return exported[0]

    return {
        "off": Telemetry(system, namespace, enabled=False),
        "api": Telemetry(system, namespace, meter_provider=NoOpMeterProvider(), tracer_provider=NoOpTracerProvider()),
        "sdk": Telemetry(system, namespace, meter_provider=meter_provider, tracer_provider=tracer_provider),
        "traces only": Telemetry(system, namespace, meter_provider=NoOpMeterProvider(),
                                 tracer_provider=tracer_provider),
        "metrics only": Telemetry(system, namespace, meter_provider=meter_provider,
                                  tracer_provider=NoOpTracerProvider()),
        "sampled": Telemetry(system, namespace, meter_provider=meter_provider, tracer_provider=sampled_provider),
    }, count


def measure(store: IdempotencyStore, requests: int, repetitions: int, warmup: int,
            log: Callable[[str], None]) -> dict[str, Any]:
    """Median wall and client CPU time per replay under each telemetry, and the overheads against ``off``."""
    kinds, exported = telemetries(store)
    kinds["one span"] = kinds["off"]
    tracer = kinds["sdk"].tracer
    store.create_tables()

    def never(conn: Any) -> Any:
        raise ExactlyOnceViolation("a replay ran the effect")

    def replay(i: int) -> None:
        store.run(scope="bench", operation="replay:v1", key=f"k{i % KEYS}", request={"n": i % KEYS}, effect=never)

    def replays(n: int, kind: str) -> tuple[float, float]:
        store.core.telemetry = kinds[kind]
        wall, cpu = time.perf_counter(), time.process_time()
        if kind == "one span":
            for i in range(n):
                with tracer.start_as_current_span("request"):
                    replay(i)
        else:
            for i in range(n):
                replay(i)
        return (time.perf_counter() - wall) / n * 1e6, (time.process_time() - cpu) / n * 1e6

    for i in range(KEYS):
        store.run(scope="bench", operation="replay:v1", key=f"k{i}", request={"n": i}, effect=lambda conn: {"ok": 1})
    samples: dict[str, list[tuple[float, float]]] = {kind: [] for kind in CONDITIONS}
    for kind in CONDITIONS:
        replays(warmup, kind)
    for rep in range(repetitions):
        for kind in CONDITIONS[rep % len(CONDITIONS):] + CONDITIONS[:rep % len(CONDITIONS)]:
            samples[kind].append(replays(requests, kind))
        log(f"repetition {rep + 1}/{repetitions}: " + ", ".join(
            f"{kind} {samples[kind][-1][0]:.0f} us" for kind in CONDITIONS))
    spans = exported()
    if spans < requests * repetitions:
        raise BenchFailed(f"the SDK exported {spans} spans for {requests * repetitions} measured replays")
    medians = {kind: {"wall_us": statistics.median(w for w, _ in samples[kind]),
                      "cpu_us": statistics.median(c for _, c in samples[kind])} for kind in CONDITIONS}
    off = medians["off"]
    return {
        "schema": SCHEMA,
        "requests": requests,
        "repetitions": repetitions,
        "replay": medians,
        "overhead": {kind: {"wall_us": medians[kind]["wall_us"] - off["wall_us"],
                            "wall_pct": 100 * (medians[kind]["wall_us"] / off["wall_us"] - 1),
                            "cpu_us": medians[kind]["cpu_us"] - off["cpu_us"]} for kind in CONDITIONS[1:]},
        "spans_exported": spans,
        # The SDK samples exemplars of measurements made under a sampled span unless told otherwise: a cost.
        "exemplar_filter": os.environ.get("OTEL_METRICS_EXEMPLAR_FILTER", "trace_based"),
    }


def render(report: dict[str, Any]) -> str:
    engine = report.get("engine", {})
    lines = [f"telemetry overhead per replay: {engine.get('backend', '?')} {engine.get('server_version', '')}"
             f" ({report['requests']} replays x {report['repetitions']} repetitions, medians; SDK exemplar filter"
             f" {report['exemplar_filter']})",
             f"{'telemetry':<12} {'wall us':>9} {'client CPU us':>14} {'overhead':>18}"]
    for kind in CONDITIONS:
        row = report["replay"][kind]
        extra = report["overhead"].get(kind)
        over = "" if extra is None else f"{extra['wall_us']:+.1f} us ({extra['wall_pct']:+.1f} %)"
        lines.append(f"{kind:<12} {row['wall_us']:>9.1f} {row['cpu_us']:>14.1f} {over:>18}")
    return "\n".join(lines) + "\n"
