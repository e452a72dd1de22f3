"""The OpenTelemetry SDK as an application installs it, once per test process (the API allows one global provider of
each kind): spans to an in-memory exporter, metrics to an in-memory reader. Tests tell their data apart by a unique
operation name (metrics) or by the spans they started after `exporter.clear()`."""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace", reason="the OpenTelemetry SDK (the [dev] extra)")

from opentelemetry import metrics, trace  # noqa: E402
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402


@dataclass(frozen=True)
class Sdk:
    tracer_provider: Any
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader

    def spans(self) -> list[Any]:
        return list(self.exporter.get_finished_spans())

    def points(self) -> list[tuple[str, dict[str, Any], Any]]:
        """(metric name, attributes, data point) of every point recorded in this process so far."""
        found = []
        data = self.reader.get_metrics_data()
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    found += [(metric.name, dict(p.attributes or {}), p) for p in metric.data.data_points]
        return found

    def tally(self, metric: str, operation: str, by: str = "idempotency.outcome") -> Counter[str]:
        """A counter's sums (or a histogram's counts) for one operation, by the attribute `by`."""
        counts: Counter[str] = Counter()
        for name, attrs, point in self.points():
            if name == metric and attrs.get("idempotency.operation") == operation:
                counts[str(attrs.get(by))] += getattr(point, "value", None) or point.count
        return counts


@functools.cache
def sdk() -> Sdk:
    made, meter_provider = private_sdk()
    trace.set_tracer_provider(made.tracer_provider)
    metrics.set_meter_provider(meter_provider)
    return made


def private_sdk() -> tuple[Sdk, MeterProvider]:
    """An SDK of a test's own, installed nowhere (`sdk()` installs one): also returns its meter provider."""
    exporter = InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    return Sdk(provider, exporter, reader), MeterProvider(metric_readers=[reader])


def every_attribute(sdk: Sdk) -> list[tuple[str, str]]:
    """(where, text) for every span name, attribute, event and status text, and every metric point's attributes."""
    found: list[tuple[str, str]] = []
    for span in sdk.spans():
        found.append((f"span {span.name!r}", span.name))
        found += [(f"span {span.name!r} {k}", repr(v)) for k, v in (span.attributes or {}).items()]
        found.append((f"span {span.name!r} status", repr(span.status.description)))
        for event in span.events:
            found.append((f"span {span.name!r} event", event.name))
            found += [(f"span {span.name!r} event {event.name} {k}", repr(v))
                      for k, v in (event.attributes or {}).items()]
    for name, attrs, _ in sdk.points():
        found += [(f"metric {name} {k}", repr(v)) for k, v in attrs.items()]
    return found
