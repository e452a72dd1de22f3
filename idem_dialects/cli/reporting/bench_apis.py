"""The async store's, the HTTP middleware's and the consumer's bench reports (idem-dialects-bench-async/1, -http/3,
-consumer/1) as a terminal table or markdown."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .text import heading, table, wrap


def _targets(run: Mapping[str, Any]) -> list[str]:
    marks = {True: "met   ", False: "MISSED"}
    return ["targets:", *(f"  {marks[t['met']]} {t['target']}: {t['value']}" for t in run["targets"])]


def render_async(run: Mapping[str, Any], markdown: bool = False) -> str:
    e, c = run["engine"], run["config"]
    title = f"idem-dialects bench --api async -- {e.get('name') or e['backend']} {e['server_version']}"
    rows = [[name, f"{m['throughput_per_s']:,.0f}", f"{m['ratio_to_bare']:.2f}", f"{m['latency_ms']['p50']:.2f}",
             f"{m['latency_ms']['p95']:.2f}", f"{m['latency_ms']['p99']:.2f}", f"{m['heartbeat_worst_lag_ms']:.1f}",
             str(m["replayed"]), f"{m['cpu_ms_per_request']:.3f}", f"{m['round_trips_per_request']:.2f}"]
            for name, m in run["modes"].items() if not name.startswith("sleep_")]
    lines = [heading(title, markdown), "",
             f"database: {e['url']} via {e['driver']} (the sync store via {e['sync_driver']})",
             f"{c['concurrency']} concurrent tasks, {c['requests']} requests per mode",
             "", *table(["mode", "req/s", "x bare", "p50 ms", "p95 ms", "p99 ms", "lag ms", "replayed", "cpu ms",
                         "trips"], rows, markdown),
             "", f"{c['concurrency']} requests at once, effect awaits {c['sleep_s'] * 1000:.0f} ms:"]
    for name, f in run["sleep_figure"].items():
        lines.append(f"  {name:<22} wall {f['wall_s']:.3f} s = {f['x_effect_time']:.2f}x the effect time,"
                     f" heartbeat worst lag {f['heartbeat_worst_lag_ms']:.1f} ms")
    lines += ["cpu ms = this process's CPU per request; trips = round trips per request (averages)", *_targets(run),
              f"exactly-once: verified in the database ({run['exactly_once']['distinct_keys']} distinct keys)",
              f"elapsed {run['elapsed_s']} s"]
    return "\n".join(lines) + "\n"


def render_http(run: Mapping[str, Any], markdown: bool = False) -> str:
    e, c = run["engine"], run["config"]
    name = e.get("name") or e["backend"]
    calls = f"{c['concurrent_calls']} x {c['handler_ms']} ms"

    def ratio(p: Mapping[str, Any], key: str) -> str:
        return f"{p[key]:.2f}" if key in p else ("1.00" if p["path"] == "bare" and not p["x_handler"] else "")

    def trips(p: Mapping[str, Any]) -> str:
        return f"{p['round_trips_per_request']:.2f}" if "round_trips_per_request" in p else ""

    rows = [[name, p["workload"], p["path"], str(p["requests"]), f"{p['throughput_per_s']:.0f}",
             ratio(p, "ratio_to_bare"), f"{p['latency_ms']['p50']:.2f}", f"{p['latency_ms']['p99']:.2f}",
             f"{p['server_cpu_us_per_request']:.0f}", ratio(p, "cpu_ratio_to_bare"), trips(p),
             "" if p["x_handler"] is None else f"{p['x_handler']:.2f}x handler"] for p in run["paths"]]
    x = run["exactly_once"]
    lines = [heading(f"idem-dialects bench --api http -- {name} {e['server_version']}", markdown), "",
             f"database: {e['url']} via {e['driver']}, app on {c.get('framework', 'starlette')}",
             *wrap(f"{c['concurrency']} connections for the throughput workload, {c['requests']} requests per path"
                   f" x {c.get('repetitions', 1)} interleaved repetitions (the replays resend the first-time keys);"
                   f" {calls} for the latency workload", "    ", first=""),
             "", *table(["engine", "workload", "path", "requests", "req/s", "x bare", "p50 ms", "p99 ms",
                         "server CPU us", "CPU x bare", "trips", calls], rows, markdown), "",
             "server CPU = the process's CPU less the client's thread, per request (uvicorn's loop, driver threads);",
             "x bare = the median of each repetition's ratio; trips = round trips per request (an unmeasured pass)",
             *_collections(run), *_targets(run),
             f"exactly-once: balance and record count checked in the database ({x['effects']} effects,"
             f" {x['records']} records)", f"elapsed {run['elapsed_s']} s"]
    return "\n".join(lines) + "\n"


def _collections(run: Mapping[str, Any]) -> list[str]:
    """The full garbage collections during each throughput path: each pauses every request in flight (the p99)."""
    rows = [p for p in run["paths"] if "full_collections" in p]
    if not rows:
        return []
    frozen = " (startup heap frozen: --gc-freeze)" if run["config"].get("gc_freeze") else ""
    return ["full garbage collections" + frozen + ": " + ", ".join(
        f"{p['path']} {p['full_collections']} ({p['full_collections_ms']:.0f} ms)" for p in rows)]


def render_consumer(run: Mapping[str, Any], markdown: bool = False) -> str:
    e, c = run["engine"], run["config"]
    name = e.get("name") or e["backend"]
    rows = [[name, broker, f"{r['bare']['per_s']:,.0f}", f"{r['idempotent']['per_s']:,.0f}",
             f"{r['ratio_to_bare']:.2f}"] for broker, r in run["brokers"].items()]
    lines = [heading(f"idem-dialects bench --api consumer -- {name} {e['server_version']}", markdown), "",
             f"database: {e['url']} via {e['driver']} (the async store via {e.get('async_driver', '?')})",
             f"{c['messages']} messages per mode x {c['repetitions']} alternating repetitions (medians),"
             f" {c['in_flight']} in flight at once", "",
             *table(["engine", "broker", "bare msg/s", "idempotent msg/s", "x bare"], rows, markdown), "",
             "bare = the same consumer loop, the handler in its own transaction, then the ack",
             "idempotent = the broker's adapter: handler and inbox record in one transaction, then the ack"]
    lines += [f"broker not reachable here, skipped: {b} ({why})" for b, why in run["skipped_brokers"].items()]
    lines += [f"exactly-once: {run['exactly_once']['effects']} effects for as many distinct messages, checked in the"
              " database", f"elapsed {run['elapsed_s']} s"]
    return "\n".join(lines) + "\n"


OTHERS = {"async/1": render_async, "http/3": render_http, "consumer/1": render_consumer}
