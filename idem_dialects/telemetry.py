"""Metrics and traces through OpenTelemetry's API, recorded once: the protocol's flows (`claims.py`, `inbox.py`) call
this module, so the sync store, the async store, the HTTP runners and every other adapter report alike.

A no-op without `opentelemetry-api` (the [otel] extra), and costs next to nothing until the application installs the
SDK (the API's no-op providers). The API is imported when the first store is made, not by `import idem_dialects`.

Attributes follow OpenTelemetry's database conventions where they apply (`db.system.name`, `db.namespace`,
`db.collection.name`, `error.type`); the protocol's own are `idempotency.*`. The key, the scope, the request and the
response are never attributes, span names or event fields: an operation (`debit:v1`) and a subscriber name are the
application's vocabulary, bounded like a route, so they are.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from .errors import LeaseLost, RequestInFlight, RequestMismatch
from .outcomes import Claimed, InFlight, Mismatch, Outcome, Replayed
from .version import __version__

if TYPE_CHECKING:
    import opentelemetry.metrics
    import opentelemetry.trace

    from .steps import Flow

# The providers a store may be given (OpenTelemetry's own types when the API is installed; typing only, so the
# library imports without it).
TracerProvider: TypeAlias = "opentelemetry.trace.TracerProvider"
MeterProvider: TypeAlias = "opentelemetry.metrics.MeterProvider"

T = TypeVar("T")
Attributes = dict[str, Any]

SCOPE = "idem_dialects"  # the instrumentation scope: the meter's and the tracer's name
SYSTEM, NAMESPACE, TABLE, ERROR = "db.system.name", "db.namespace", "db.collection.name", "error.type"
OPERATION, OUTCOME, CAUSE = "idempotency.operation", "idempotency.outcome", "idempotency.retry.cause"
SUBSCRIBER, ATTEMPTS = "idempotency.subscriber", "idempotency.attempts"
DESTINATION = "idempotency.outbox.destination"
RUN_SPAN, REQUEST_SPAN, EVENT = "idempotency run", "idempotency request", "idempotency.claim"
# Seconds: a replay takes a fraction of a millisecond, a claim that waits on a holder or a retried run seconds.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_ATTRIBUTE_SETS = 4096  # per store; past it attribute dicts are built per call instead of kept


def outcome_name(outcome: Outcome) -> str | None:
    """The `idempotency.outcome` of a claim; None for a retry that found its own committed claim (counted once)."""
    if isinstance(outcome, Claimed):
        return "takeover" if outcome.taken_over else "claimed"
    if isinstance(outcome, Replayed):
        return None if outcome.own else "replayed"
    if isinstance(outcome, Mismatch):
        return "mismatch"
    assert isinstance(outcome, InFlight)
    return "in_flight"


def failure(exc: BaseException) -> tuple[str, str | None]:
    """(outcome, error.type) of a flow that raised: a mismatch or an in-flight answer is the protocol working, not an
    error; anything else is, by its class name only (an exception's message may repeat the key or stored values)."""
    if isinstance(exc, RequestMismatch):
        return "mismatch", None
    if isinstance(exc, RequestInFlight):
        return "in_flight", None
    return ("lease_lost" if isinstance(exc, LeaseLost) else "error"), error_type(exc)


def error_type(exc: BaseException) -> str:
    """`error.type`: the exception's fully qualified class name."""
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


class _Totals:
    """A counter summed here and reported through an asynchronous (observable) counter when the SDK collects: a count
    costs a dict update under a lock, where a synchronous counter hashes its attributes and offers an exemplar on
    every call (a large share of what telemetry cost per replay). Totals are cumulative, as a counter's are."""

    def __init__(self, meter: Any, name: str, unit: str, description: str) -> None:
        self._counts: dict[tuple[tuple[str, Any], ...], int] = {}
        self._lock = threading.Lock()
        meter.create_observable_counter(name, callbacks=[self._observe], unit=unit, description=description)

    def add(self, amount: int, attributes: Attributes) -> None:
        key = tuple(attributes.items())
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + amount

    def _observe(self, options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        with self._lock:
            counts = list(self._counts.items())
        return [Observation(total, dict(key)) for key, total in counts]


class _Levels:
    """A gauge: the last value set per attribute set, reported through an observable gauge (the outbox backlog a
    relay samples)."""

    def __init__(self, meter: Any, name: str, unit: str, description: str) -> None:
        self._values: dict[tuple[tuple[str, Any], ...], float] = {}
        self._lock = threading.Lock()
        meter.create_observable_gauge(name, callbacks=[self._observe], unit=unit, description=description)

    def set(self, value: float, attributes: Attributes) -> None:
        with self._lock:
            self._values[tuple(attributes.items())] = value

    def _observe(self, options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        with self._lock:
            values = list(self._values.items())
        return [Observation(value, dict(key)) for key, value in values]


class _Instruments:
    """The metrics, made once per meter provider (the SDK warns about an instrument made twice)."""

    def __init__(self, meter: Any) -> None:
        def histogram(name: str, description: str) -> Any:
            return meter.create_histogram(name, unit="s", description=description,
                                          explicit_bucket_boundaries_advisory=BUCKETS)

        self.outcomes = _Totals(
            meter, "idempotency.outcomes", "{outcome}",
            "Claim decisions by outcome: claimed, takeover, replayed, mismatch, in_flight; and lease_lost when"
            " completing finds the claim taken over")
        self.retries = _Totals(meter, "idempotency.retries", "{retry}",
                               "Attempts retried after a transient error, by cause")
        self.messages = _Totals(meter, "idempotency.messages", "{message}",
                                "Consumed messages: accepted, duplicate or mismatch")
        self.purged = _Totals(meter, "idempotency.purge.rows", "{row}", "Rows deleted by purge, by table")
        self.relayed = _Totals(meter, "idempotency.outbox.commands", "{command}",
                               "Outbox commands a relay handled, by outcome (published, retried, dead_lettered,"
                               " released) and destination; published/s is this counter's rate")
        self.pending = _Levels(meter, "idempotency.outbox.pending", "{command}",
                               "Outbox commands waiting to be published, as a relay last sampled")
        self.oldest = _Levels(meter, "idempotency.outbox.oldest_age", "s",
                              "Age of the oldest outbox command waiting to be published, as a relay last sampled")
        self.claim_wait = histogram("idempotency.claim.wait",
                                    "Time from a claim's first statement to its outcome, waiting on a holder included")
        self.effect = histogram("idempotency.effect.duration", "Time the caller's effect ran")
        self.run = histogram("idempotency.run.duration", "Time of a whole run, retries and waits between them included")


_global_instruments: list[_Instruments] = []  # made at most once, on the global provider
_given_instruments: weakref.WeakKeyDictionary[Any, _Instruments] = weakref.WeakKeyDictionary()
_made = threading.Lock()


def _instruments_for(provider: MeterProvider | None) -> _Instruments:
    """The instruments of `provider`; None stands for the global provider, made once for the process whether the
    application installs the SDK before or after the first store: made on the API's proxy, they reach the SDK once
    it is installed. (Made again on the SDK's provider, the observable counters would register twice and the SDK
    would keep only the first one's callback.) A provider given to a store keeps its instruments only as long as it
    lives itself."""
    from opentelemetry import metrics

    with _made:
        if provider is None:
            if not _global_instruments:
                _global_instruments.append(_Instruments(metrics.get_meter(SCOPE, __version__)))
            return _global_instruments[0]
        kept = _given_instruments.get(provider)
        if kept is None:
            kept = _given_instruments[provider] = _Instruments(provider.get_meter(SCOPE, __version__))
        return kept


class Telemetry:
    """What one store records. `enabled` is False without opentelemetry-api: then every method returns at once and
    the flow wrappers hand back the flow itself. Providers default to the global ones the application installs.

    Counters are summed from the first claim whatever is installed (a dict update each; an SDK installed later reports
    them whole). Spans and histograms need an SDK to record anything: with the API's no-op or proxy providers they are
    skipped, the run's flow left unwrapped; a global SDK installed later is seen within a second (`live`)."""

    def __init__(self, system: str, namespace: str | None, *, meter_provider: MeterProvider | None = None,
                 tracer_provider: TracerProvider | None = None, enabled: bool | None = None) -> None:
        self.base: Attributes = {SYSTEM: system} | ({NAMESPACE: namespace} if namespace else {})
        self._sets: dict[tuple[str, ...], Attributes] = {}
        self.enabled = _api_installed() if enabled is None else enabled
        self._live = False
        self._next_look = 0.0
        if not self.enabled:
            return
        from opentelemetry import context, metrics, trace

        self._context, self._trace, self._global_metrics = context, trace, metrics
        self.tracer = trace.get_tracer(SCOPE, __version__, tracer_provider)
        self._metrics = _instruments_for(meter_provider)
        # None: the global provider, looked at until it is an SDK's; True/False: a provider the store was given.
        self._tracing: bool | None = None if tracer_provider is None else not _no_op(tracer_provider)
        self._metering: bool | None = None if meter_provider is None else not _no_op(meter_provider)

    @property
    def live(self) -> bool:
        """Whether a signal would be recorded: an SDK's provider (given, or installed globally, now or since)."""
        if self._live or not self.enabled:
            return self._live
        now = time.monotonic()
        if now < self._next_look:  # the API's getters read the environment each call: looked at once a second
            return False
        self._next_look = now + 1.0
        tracing = self._tracing if self._tracing is not None else not _no_op(self._trace.get_tracer_provider())
        metering = self._metering if self._metering is not None else not _no_op(
            self._global_metrics.get_meter_provider())
        self._live = tracing or metering
        return self._live

    def _attributes(self, *pairs: str) -> Attributes:
        """The base attributes plus name/value `pairs`, one dict per distinct set (the SDK hashes them per call)."""
        found = self._sets.get(pairs)
        if found is None:
            found = self.base | dict(zip(pairs[::2], pairs[1::2], strict=True))
            if len(self._sets) < _ATTRIBUTE_SETS:
                self._sets[pairs] = found
        return found

    # --- events the flows report -------------------------------------------------------------------------------

    def claim(self, operation: str, flow: Flow[Outcome]) -> Flow[Outcome]:
        """`flow` (a claim), counted by outcome and timed."""
        return self._claim(operation, flow) if self.enabled else flow

    def _claim(self, operation: str, flow: Flow[Outcome]) -> Flow[Outcome]:
        started = time.perf_counter()
        outcome = yield from flow
        name = outcome_name(outcome)
        if name is not None:
            attributes = self._attributes(OPERATION, operation, OUTCOME, name)
            self._metrics.outcomes.add(1, attributes)
            if self.live:
                self._metrics.claim_wait.record(time.perf_counter() - started, attributes)
                if name == "takeover":
                    self._event(name)
        return outcome

    def lease_lost(self, operation: str) -> None:
        if self.enabled:
            self._metrics.outcomes.add(1, self._attributes(OPERATION, operation, OUTCOME, "lease_lost"))
            if self.live:
                self._event("lease_lost")

    def _event(self, outcome: str) -> None:
        """A rare outcome (a takeover, a lost lease) as an event on the current span: the run's, the HTTP request's,
        or the caller's own around the step-by-step API. Common outcomes are the run span's attribute instead: an
        event on every replay is work the SDK would do per request for what the attribute already says."""
        span = self._trace.get_current_span()
        if span.is_recording():
            span.add_event(EVENT, {OUTCOME: outcome})

    def effect(self, operation: str, seconds: float, error: BaseException | None) -> None:
        if self.live:
            pairs = (OPERATION, operation) if error is None else (OPERATION, operation, ERROR, error_type(error))
            self._metrics.effect.record(seconds, self._attributes(*pairs))

    def retry(self, cause: str) -> None:
        if self.enabled:
            self._metrics.retries.add(1, self._attributes(CAUSE, cause))

    def purged(self, table: str, rows: int) -> None:
        if self.enabled and rows:
            self._metrics.purged.add(rows, self._attributes(TABLE, table))

    def relayed(self, destination: str, outcome: str, count: int = 1) -> None:
        """Outbox commands a relay handled: published, retried, dead_lettered, released."""
        if self.enabled and count:
            self._metrics.relayed.add(count, self._attributes(DESTINATION, destination, OUTCOME, outcome))

    def backlog(self, table: str, pending: int, oldest_age: float) -> None:
        if self.enabled:
            attributes = self._attributes(TABLE, table)
            self._metrics.pending.set(pending, attributes)
            self._metrics.oldest.set(oldest_age, attributes)

    def message(self, subscriber: str, flow: Flow[bool]) -> Flow[bool]:
        """`flow` (accepting a message: True the first time) counted as accepted, duplicate or mismatch. The hook for
        every consumer form: wrap the flow that decides whether a message is new."""
        return self._message(subscriber, flow) if self.enabled else flow

    def _message(self, subscriber: str, flow: Flow[bool]) -> Flow[bool]:
        outcome = "mismatch"
        try:
            accepted = yield from flow
            outcome = "accepted" if accepted else "duplicate"
            return accepted
        except RequestMismatch:
            raise
        except BaseException:
            outcome = ""  # not a decision about the message (an error, a cancellation): not counted
            raise
        finally:
            if outcome:
                self._metrics.messages.add(1, self._attributes(SUBSCRIBER, subscriber, OUTCOME, outcome))

    # --- spans ---------------------------------------------------------------------------------------------------

    def run(self, operation: str, attempt: Callable[[], Flow[T]],
            retrying: Callable[[Callable[[], Flow[T]]], Flow[T]]) -> Flow[T]:
        """`retrying(attempt)` (a run) under a span, timed, its attempts counted; it returns a `Result`."""
        if not self.live:
            return retrying(attempt)
        attempts = [0]

        def counted() -> Flow[T]:
            attempts[0] += 1
            return attempt()

        def outcome(result: Any) -> Attributes:
            return {OUTCOME: "replayed" if result.replayed else "claimed"}

        return self.span(RUN_SPAN, operation, retrying(counted), outcome, attempts, self._metrics.run)

    def span(self, name: str, operation: str, flow: Flow[T], describe: Callable[[T], Attributes],
             attempts: list[int] | None = None, duration: Any = None) -> Flow[T]:
        """`flow` under a span `name`, current while the flow runs; `describe(result)` gives its closing attributes.
        The hook for adapters (the HTTP request, a consumer's message)."""
        return self._span(name, operation, flow, describe, attempts, duration) if self.live else flow

    def _span(self, name: str, operation: str, flow: Flow[T], describe: Callable[[T], Attributes],
              attempts: list[int] | None, duration: Any) -> Flow[T]:
        # The span is made current by attaching it to the OpenTelemetry context when the flow starts and detaching it
        # when the flow ends, both inside this generator. A generator runs in the context of whoever resumes it, and
        # both stores resume a flow only from the one thread (sync) or the one task (async) that called `drive`, and
        # always run it to its end (every error is thrown into the flow, never left pending): so the attach and its
        # detach happen in the same context, and the span is current exactly while the store executes this flow's
        # steps. That is what makes SQLAlchemy's instrumentation and the effect's own spans nest under it: the SQL
        # steps run in that same context (a plain call, or `run_sync`, whose greenlet shares the task's context), and
        # a shielded release runs in a task that starts from a copy of it. Nothing leaks: other threads and tasks have
        # contexts of their own, and the caller's context is as it was once the flow has ended. Making it current per
        # step instead would miss the effect and the transactions' BEGIN, which the stores run, not the flow.
        span = self.tracer.start_span(name, kind=self._trace.SpanKind.INTERNAL,
                                       attributes=self._attributes(OPERATION, operation),
                                       record_exception=False, set_status_on_exception=False)
        # A span of the API's no-op tracer (no SDK installed) carries no context worth propagating: not attached.
        token = self._context.attach(self._trace.set_span_in_context(span)) if span.get_span_context().is_valid \
            else None
        started = time.perf_counter()
        closing: Attributes = {}
        try:
            result = yield from flow
            closing = describe(result)
            return result
        except BaseException as exc:
            outcome, error = failure(exc)
            closing = {OUTCOME: outcome}
            if error is not None:
                closing[ERROR] = error
                span.set_status(self._trace.StatusCode.ERROR)
            raise
        finally:
            if token is not None:
                self._context.detach(token)
            if attempts is not None:
                closing[ATTEMPTS] = attempts[0]
            span.set_attributes(closing)
            span.end()
            if duration is not None:
                pairs: tuple[str, ...] = (OPERATION, operation, OUTCOME, closing.get(OUTCOME, "error"))
                if ERROR in closing:
                    pairs += (ERROR, closing[ERROR])
                duration.record(time.perf_counter() - started, self._attributes(*pairs))


def _no_op(provider: Any) -> bool:
    """A provider that records nothing: the API's no-op ones, and its proxies until an SDK is installed behind them
    (the proxies live in the API's own modules; an SDK's providers never do)."""
    return type(provider).__module__.startswith(("opentelemetry.trace", "opentelemetry.metrics"))


def _api_installed() -> bool:
    try:
        import opentelemetry.metrics
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        return False
    return True
