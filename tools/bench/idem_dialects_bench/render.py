"""Every bench report as a terminal table or markdown, the one renderer of them all (`idem-dialects bench` and
`idem-dialects report`, which finds it through the idem_dialects.reports entry point): the sync store's
(idem-dialects-bench/2, or /1 saved before round trips were counted on the wire), one engine alone or several side by
side; the async store's, the HTTP middleware's, the
consumer's and the operations' (purge, outbox, telemetry) each in turn; -set/1 holds several. The HTML page's section
is `html`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from idem_dialects.cli.reporting.text import WIDTH, heading, table, wrap

SYNC = ("idem-dialects-bench/2", "idem-dialects-bench/1")  # the sync store's schemas, newest first
NO_WIRE = "\N{EM DASH}"  # round trips where there is no wire to count them on (the report says why)
WIRE_NOTE = ("round trips = counted on the wire by a proxy between the driver and the server (a burst the client sends"
             " answered by one from the server), in a pass of every mode after the measured ones; "
             + NO_WIRE + ": no wire (the database runs in the client's process)")

MODE_TITLES = {
    "bare": "bare effect (no idempotency)",
    "first": "first-time via run",
    "replay": "replay via run",
    "contention": "contention via run",
    "plpgsql_first": "PL/pgSQL debit_once, first",
    "plpgsql_replay": "PL/pgSQL debit_once, replay",
}


def runs(report: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The single-engine reports inside a bench report (one, or each of a set)."""
    return list(report["runs"]) if "runs" in report else [report]


def engine_label(run: Mapping[str, Any]) -> str:
    e = run["engine"]
    return str(e.get("name") or f"{e['backend']} {e['server_version']}")


def render_bench(report: Mapping[str, Any], fmt: str = "table") -> str:
    items, markdown = runs(report), fmt == "markdown"
    skipped: Mapping[str, str] = report.get("skipped") or {}
    if any(run["schema"] not in SYNC for run in items):  # the other APIs' and operations' reports: one after another
        text = "\n".join(OTHERS[run["schema"].removeprefix("idem-dialects-bench-")](run, markdown) for run in items)
        return text + (f"\nnot available here: {', '.join(skipped)}\n" if skipped else "")
    if len(items) == 1 and fmt == "table" and not skipped:
        return render_one(items[0]) + "\n"
    return render_side_by_side(items, skipped, markdown=markdown)


def modes_of(items: Sequence[Mapping[str, Any]]) -> list[str]:
    modes: list[str] = []
    for run in items:
        modes += [m for m in run["modes"] if m not in modes]
    return modes


def render_side_by_side(items: Sequence[Mapping[str, Any]], skipped: Mapping[str, str], markdown: bool) -> str:
    names = [engine_label(r) for r in items]
    modes = modes_of(items)
    c = items[0]["config"]
    out = [heading(f"idem-dialects bench: {len(items)} engine{'s' * (len(items) > 1)}, one run", markdown), ""]
    machine = items[0].get("machine")
    if machine:
        out.append(f"machine: {machine['platform']}, {machine['cpus']} CPUs, Python {machine['python']},"
                   f" idem-dialects {machine['idem_dialects']}")
    out.append(f"workers {c['workers']}, {c['requests']} requests per mode x {c['repetitions']} interleaved"
               f" repetitions (+{c['warmup']} warm-up), duplicates {c['duplicates']:.0%} in the contention mode")
    out.append("engines: " + "; ".join(f"{n} = {r['engine']['backend']} {r['engine']['server_version']}"
                                      f" ({r['engine']['dialect']}+{r['engine']['driver']})" for n, r in zip(
                                          names, items, strict=True)))
    if skipped:
        out.append("not available here: " + ", ".join(skipped))

    def section(title: str, cell: Any) -> None:
        rows = []
        for mode in modes:
            row = [MODE_TITLES.get(mode, mode)]
            for run in items:
                m = run["modes"].get(mode)
                row.append("-" if m is None else cell(m))
            rows.append(row)
        out.extend(["", *table([title, *names], rows, markdown)])

    section("requests/s (x bare)", lambda m: f"{m['throughput_per_s']['median']:,.0f} ({m['ratio_to_bare']:.2f})")
    section("latency p50 / p99 ms", lambda m: f"{m['latency_ms']['p50']:.2f} / {m['latency_ms']['p99']:.2f}")
    if any("cpu_ms_per_request" in m for r in items for m in r["modes"].values()):
        section("client CPU ms/request", lambda m: _opt(m.get("cpu_ms_per_request"), "{:.3f}"))
    section("round trips/request", lambda m: trips(m.get("round_trips_per_request")))
    added = added_ms(items)
    if added:
        section(f"requests/s, +{added:g} ms a round trip (x loopback)", at_latency)
    if any(m["retries"] for r in items for m in r["modes"].values()):
        section("retries", lambda m: ", ".join(f"{k} {v}" for k, v in m["retries"].items()) or "-")
    else:
        out += ["", "retries: none in any mode on any engine"]
    out += [""]
    notes = [WIRE_NOTE, "client CPU = this process's CPU time per request (SQLite runs inside it)"]
    for name, run in zip(names, items, strict=True):
        x = run["exactly_once"]
        missed = [t["target"] for t in run["targets"] if not t["met"]]
        notes.append(f"{name}: exactly-once verified after {x['checks']} slices ({x['effects']} effects =="
                     f" {x['distinct_keys']} keys); targets missed: {', '.join(missed) or 'none'}")
    return "\n".join(_wrapped(out) + _wrapped(notes)) + "\n"


def _wrapped(lines: Sequence[str], indent: str = "    ") -> list[str]:
    """Prose lines wrapped to the terminal width (tables are already narrower)."""
    out: list[str] = []
    for line in lines:
        out += [line] if len(line) <= WIDTH else wrap(line, indent, first="")
    return out


def _opt(value: Any, spec: str) -> str:
    return "-" if value is None else spec.format(value)


def trips(value: float | None) -> str:
    """Round trips per request on the wire: 4, 4.5, 4.25; NO_WIRE where they were not counted."""
    return NO_WIRE if value is None else f"{value:.2f}".rstrip("0").rstrip(".")


def added_ms(items: Sequence[Mapping[str, Any]]) -> float:
    """The latency a pass through the counting proxy added to each round trip (0: none, or no wire)."""
    return max((m["added_latency"]["ms"] for r in items for m in r["modes"].values() if m.get("added_latency")),
               default=0.0)


def at_latency(m: Mapping[str, Any]) -> str:
    at = m.get("added_latency")
    if not at:
        return NO_WIRE
    ratio = "" if at["ratio_to_loopback"] is None else f" ({at['ratio_to_loopback']:.2f})"
    return f"{at['throughput_per_s']:,.0f}{ratio}"


def render_one(report: Mapping[str, Any]) -> str:
    e, c = report["engine"], report["config"]
    lines = [
        f"idem-dialects bench -- {e['backend']} {e['server_version']} ({e['dialect']}+{e['driver']}), {e['url']}",
        f"workers {c['workers']}, {c['requests']} requests per mode x {c['repetitions']} interleaved repetitions"
        f" (+{c['warmup']} warm-up), duplicates {c['duplicates']:.0%} in the contention mode",
        f"bare effect: {report['bare_effect']}",
        "",
        f"{'mode':<30} {'req/s':>9} {'x bare':>7} {'paired':>7} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}"
        f" {'cpu ms':>7} {'stmts':>5} {'trips':>5}  retries",
    ]
    for mode, m in report["modes"].items():
        lat, st = m["latency_ms"], m["statements"]
        retries = ", ".join(f"{k} {v}" for k, v in m["retries"].items()) or "-"
        stmts = "-" if st is None else f"{st['count']}+{st['commits']}c"
        lines.append(
            f"{MODE_TITLES.get(mode, mode):<30} {m['throughput_per_s']['median']:>9,.0f} {m['ratio_to_bare']:>7.2f}"
            f" {m['ratio_to_bare_paired']:>7.2f} {lat['p50']:>8.3f} {lat['p95']:>8.3f} {lat['p99']:>8.3f}"
            f" {_opt(m.get('cpu_ms_per_request'), '{:.3f}'):>7} {stmts:>5} {trips(m.get('round_trips_per_request')):>5}"
            f"  {retries}")
    lines.append("")
    lines.append("stmts = SQL statements per request seen by before_cursor_execute + driver COMMITs (c);"
                 " cpu = process CPU;")
    lines.append("trips = " + WIRE_NOTE.removeprefix("round trips = "))
    for mode, m in report["modes"].items():
        if m["statements"] is not None:
            lines.append(f"  {mode:<15} {' '.join(m['statements']['kinds'])}")
    lines += _wire_lines(report)
    contention = report["modes"].get("contention")
    if contention:
        o = contention["outcomes"]
        lines.append(f"contention outcomes: {o.get('applied', 0)} applied, {o.get('replayed', 0)} replayed")
    x = report["exactly_once"]
    lines.append(f"exactly-once: verified in the database after each of {x['checks']} slices"
                 f" ({x['effects']} effects == {x['distinct_keys']} distinct keys)")
    lines.append("")
    lines += _targets(report)
    mem = report["memory"]
    lines.append("")
    lines.append(f"memory: peak RSS {mem['peak_rss_mib']} MiB")
    check = mem["check"]
    if check:
        lines.append(f"  {check['requests']} requests ({check['pattern']}) in {check['seconds']} s under tracemalloc:"
                     f" start {check['tracemalloc_start_kib']} KiB, end {check['tracemalloc_end_kib']} KiB,"
                     f" peak {check['tracemalloc_peak_kib']} KiB, growth {check['growth_per_10k_kib']} KiB per 10k"
                     f" requests ({'flat' if check['flat'] else 'GROWING'})")
    lines.append(f"elapsed {report['elapsed_s']} s")
    return "\n".join(lines)


def _not_counted(run: Mapping[str, Any]) -> list[str]:
    """Why round trips were not counted, if they were not."""
    why = (run.get("wire") or {}).get("why_not")
    return [f"round trips not counted: {why}"] if why else []


def _wire_lines(run: Mapping[str, Any]) -> list[str]:
    """Why round trips were not counted, or the pass that added latency to each: its throughput beside loopback's."""
    added = added_ms([run])
    if not added:
        return _not_counted(run)
    at = {mode: m["added_latency"] for mode, m in run["modes"].items() if m.get("added_latency")}
    waited = sorted(a["added_ms_per_round_trip"] for a in at.values())
    lines = [f"with {added:g} ms added to each round trip (waited by the proxy: {waited[0]:.2f}-{waited[-1]:.2f} ms a"
             " round trip, by mode), one slice per mode:",
             f"  {'mode':<28} {'req/s':>9} {'x loopback':>11} {'p50 ms':>8} {'p99 ms':>8}"]
    for mode, a in at.items():
        ratio = _opt(a["ratio_to_loopback"], "{:.2f}")
        lines.append(f"  {MODE_TITLES.get(mode, mode):<28} {a['throughput_per_s']:>9,.0f} {ratio:>11}"
                     f" {a['latency_ms']['p50']:>8.3f} {a['latency_ms']['p99']:>8.3f}")
    return lines


def _targets(run: Mapping[str, Any]) -> list[str]:
    """The targets the run measured (targets.py), each met or missed, with its figure and bound (a report saved
    before targets had `where`, `shown` and `bound` shows its target and verdict)."""
    marks = {True: "met   ", False: "MISSED"}
    return ["targets:", *(f"  {marks[t['met']]} {t['target']}" + (f" ({t['where']})" if "where" in t else "")
                          + (f": {t['shown']} ({t['bound']})" if "shown" in t else "")
                          for t in run.get("targets", []))]


def render_async(run: Mapping[str, Any], markdown: bool = False) -> str:
    e, c = run["engine"], run["config"]
    title = f"idem-dialects bench --api async -- {e.get('name') or e['backend']} {e['server_version']}"
    added = added_ms([run])
    rows = [[name, f"{m['throughput_per_s']:,.0f}", f"{m['ratio_to_bare']:.2f}", f"{m['latency_ms']['p50']:.2f}",
             f"{m['latency_ms']['p95']:.2f}", f"{m['latency_ms']['p99']:.2f}", f"{m['heartbeat_worst_lag_ms']:.1f}",
             str(m["replayed"]), f"{m['cpu_ms_per_request']:.3f}", trips(m.get("round_trips_per_request")),
             *([at_latency(m)] if added else [])]
            for name, m in run["modes"].items() if not name.startswith("sleep_")]
    lines = [heading(title, markdown), "",
             f"database: {e['url']} via {e['driver']} (the sync store via {e['sync_driver']})",
             f"{c['concurrency']} concurrent tasks, {c['requests']} requests per mode",
             "", *table(["mode", "req/s", "x bare", "p50 ms", "p95 ms", "p99 ms", "lag ms", "replayed", "cpu ms",
                         "trips", *([f"+{added:g} ms req/s (x)"] if added else [])], rows, markdown),
             "", f"{c['concurrency']} requests at once, effect awaits {c['sleep_s'] * 1000:.0f} ms:"]
    for name, f in run["sleep_figure"].items():
        lines.append(f"  {name:<22} wall {f['wall_s']:.3f} s = {f['x_effect_time']:.2f}x the effect time,"
                     f" heartbeat worst lag {f['heartbeat_worst_lag_ms']:.1f} ms")
    lines += ["cpu ms = this process's CPU per request (averages); trips = " + WIRE_NOTE.removeprefix("round trips = "),
              *([f"+{added:g} ms req/s = the same requests with {added:g} ms added to each round trip (x loopback)"]
                if added else []), *_not_counted(run), *_targets(run),
              f"exactly-once: verified in the database ({run['exactly_once']['distinct_keys']} distinct keys)",
              f"elapsed {run['elapsed_s']} s"]
    return "\n".join(lines) + "\n"


def render_http(run: Mapping[str, Any], markdown: bool = False) -> str:
    e, c = run["engine"], run["config"]
    name = e.get("name") or e["backend"]
    calls = f"{c['concurrent_calls']} x {c['handler_ms']} ms"

    def ratio(p: Mapping[str, Any], key: str) -> str:
        return f"{p[key]:.2f}" if key in p else ("1.00" if p["path"] == "bare" and not p["x_handler"] else "")

    rows = [[name, p["workload"], p["path"], str(p["requests"]), f"{p['throughput_per_s']:.0f}",
             ratio(p, "ratio_to_bare"), f"{p['latency_ms']['p50']:.2f}", f"{p['latency_ms']['p99']:.2f}",
             f"{p['server_cpu_us_per_request']:.0f}", ratio(p, "cpu_ratio_to_bare"),
             trips(p.get("round_trips_per_request")) if p["workload"] == "throughput" else "",
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
             "x bare = the median of each repetition's ratio; trips = round trips per request on the wire (an",
             "unmeasured pass through a counting proxy)", *_not_counted(run),
             *_collections(run), *_targets(run),
             f"exactly-once: balance and record count checked in the database ({x['effects']} effects,"
             f" {x['records']} records)", f"elapsed {run['elapsed_s']} s"]
    return "\n".join(lines) + "\n"


def _collections(run: Mapping[str, Any]) -> list[str]:
    """The garbage collector per throughput path: its collections per 1,000 requests (a full one pauses every request
    in flight: the p99) and what the requests left it, measured with it stopped (an unmeasured pass). A report saved
    before them (http/3) gave the full collections alone."""
    rows = [p for p in run["paths"] if "collections_per_1000" in p]
    if not rows:
        full = [p for p in run["paths"] if "full_collections" in p]
        frozen = " (startup heap frozen: --gc-freeze)" if run["config"].get("gc_freeze") else ""
        return ["full garbage collections" + frozen + ": " + ", ".join(
            f"{p['path']} {p['full_collections']} ({p['full_collections_ms']:.0f} ms)" for p in full)] if full else []

    def per_1000(p: Mapping[str, Any]) -> str:
        counts = p["collections_per_1000"]
        return f"{counts['gen0']:.1f} / {counts['gen1']:.1f} / {counts['gen2']:.2f} ({p['full_collections_ms']:.0f} ms)"

    lines = ["garbage collections per 1,000 requests, generation 0 / 1 / 2 (the full ones' total time): "
             + ", ".join(f"{p['path']} {per_1000(p)}" for p in rows)]
    if all("cyclic_objects_per_request" in p for p in rows):
        lines.append("per request, collector stopped (a pass of its own): objects only a collection frees (reference"
                     " cycles) / memory blocks left allocated: " + ", ".join(
                         f"{p['path']} {p['cyclic_objects_per_request']:.2f} / {p['blocks_left_per_request']:.1f}"
                         for p in rows))
    heap = run.get("heap")
    if heap:
        frozen = (f"the startup heap frozen by the app's lifespan (--gc-freeze): {heap['frozen_objects']:,} objects"
                  if run["config"].get("gc_freeze") else "the startup heap not frozen (--no-gc-freeze)")
        lines.append(f"{frozen}; once warm, a full collection scans {heap['tracked_objects']:,}")
    return lines


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


def render_purge(report: Mapping[str, Any], markdown: bool = False) -> str:
    engine, purge = report.get("engine", {}), report["purge"]
    mode = report.get("mode", "delete")
    lines = [f"purge: {engine.get('backend', '?')} {engine.get('server_version', '')}: {report['rows']:,} old of"
             f" {report['rows'] + report.get('recent', 0):,} records, {mode}"
             + (f" in batches of {report['batch_size']:,}" if mode != "generations" else "")
             + f": {purge['seconds']:.2f} s, {purge['rows_per_s']:,.0f} rows/s",
             f"{'first-time claims, ' + str(report['workers']) + ' workers':<38} {'claims/s':>9} {'p50 ms':>7}"
             f" {'p99 ms':>7} {'max ms':>7}"]
    removal = report.get("claims_during_removal")
    for label, key in (("alone", "claims_alone"),
                       (f"during the removal itself ({removal['seconds']:.2f} s)" if removal else "",
                        "claims_during_removal"),
                       ("during retention (at least 2 s)", "claims_during_purge"),
                       ("alone again, after", "claims_after")):
        row = report.get(key)
        if row is None:
            continue
        lines.append(f"  {label:<36} {row['claims_per_s']:>9.0f} {row['p50_ms']:>7.2f} {row['p99_ms']:>7.2f}"
                     f" {row['max_ms']:>7.1f}")
    if removal is not None and report.get("kept_ratio_removal") is not None:
        lines.append(f"  claims kept {report['kept_ratio_removal']:.0%} of their rate (alone, before and after)"
                     f" during the removal itself, longest claim {removal['max_ms']:.1f} ms")
    if report.get("kept_ratio") is not None:
        lines.append(f"  claims kept {report['kept_ratio']:.0%} of their rate (alone, before and after)"
                     " during retention")
    return "\n".join(lines) + "\n"



def render_outbox(report: Mapping[str, Any], markdown: bool = False) -> str:
    engine = report.get("engine", {})
    lines = [f"outbox relay: {engine.get('backend', '?')} {engine.get('server_version', '')}: {report['rows']:,}"
             f" commands, batches of {report['batch_size']}, each published once",
             f"{'relays':>8} {'seconds':>9} {'commands/s':>11} {'rounds':>7}"]
    for level in report["levels"]:
        lines.append(f"{level['relays']:>8} {level['seconds']:>9.2f} {level['commands_per_s']:>11,.0f}"
                     f" {level['rounds']:>7}")
    return "\n".join(lines) + "\n"



def render_telemetry(report: Mapping[str, Any], markdown: bool = False) -> str:
    engine = report.get("engine", {})
    lines = [f"telemetry overhead per replay: {engine.get('backend', '?')} {engine.get('server_version', '')}"
             f" ({report['requests']} replays x {report['repetitions']} repetitions, medians; SDK exemplar filter"
             f" {report['exemplar_filter']})",
             f"{'telemetry':<14} {'wall us':>9} {'client CPU us':>14} {'CPU overhead':>20}  against"]
    for kind, row in report["replay"].items():
        extra = report["overhead"].get(kind)
        over = "" if extra is None else f"{extra['cpu_us']:+.1f} us ({extra['cpu_pct']:+.1f} %)"
        against = report["baseline"].get(kind, "")
        lines.append(f"{kind:<14} {row['wall_us']:>9.1f} {row['cpu_us']:>14.1f} {over:>20}  {against}")
    lines += [f"{kind}: not measured ({why})" for kind, why in report["not_measured"].items()]
    lines += _targets(report)
    return "\n".join(lines) + "\n"



OTHERS = {"async/2": render_async, "async/1": render_async, "http/4": render_http, "http/3": render_http,
          "consumer/1": render_consumer, "purge/2": render_purge, "purge/3": render_purge, "outbox/1": render_outbox,
          "telemetry/3": render_telemetry}


# What `idem-dialects report` calls (idem_dialects.cli.reporting.html.BenchRenderer).

def render(report: Mapping[str, Any], fmt: str) -> str:
    """A bench report (one engine's, or a set) as a table or markdown."""
    return render_bench(report, fmt)


def engine_names(report: Mapping[str, Any]) -> list[str]:
    return [engine_label(run) for run in runs(report)]


def html_section(reports: Sequence[Mapping[str, Any]], palette: Mapping[str, str]) -> str:
    """The HTML page's benchmark section (the html module), for idem_dialects.cli.reporting's page."""
    from .html import section

    return section(reports, palette)
