"""Bench reports as text or markdown tables: the sync store's (idem-dialects-bench/1) one engine alone or several
side by side, the async store's and the HTTP middleware's (bench_apis) each in turn; -set/1 holds several engines'."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .bench_apis import OTHERS
from .text import WIDTH, heading, table, wrap

SYNC = "idem-dialects-bench/1"

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
    if any(run["schema"] != SYNC for run in items):  # the async store's and HTTP reports: one after another
        text = "\n".join(OTHERS[run["schema"].removeprefix("idem-dialects-bench-")](run, markdown) for run in items)
        return text + (f"\nnot available here: {', '.join(skipped)}\n" if skipped else "")
    if len(items) == 1 and fmt == "table" and not skipped:
        return render_one(items[0]) + "\n"
    return render_side_by_side(items, skipped, markdown=markdown)


def _modes(items: Sequence[Mapping[str, Any]]) -> list[str]:
    modes: list[str] = []
    for run in items:
        modes += [m for m in run["modes"] if m not in modes]
    return modes


def render_side_by_side(items: Sequence[Mapping[str, Any]], skipped: Mapping[str, str], markdown: bool) -> str:
    names = [engine_label(r) for r in items]
    modes = _modes(items)
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
    section("round trips/request", _round_trips)
    if any(m["retries"] for r in items for m in r["modes"].values()):
        section("retries", lambda m: ", ".join(f"{k} {v}" for k, v in m["retries"].items()) or "-")
    else:
        out += ["", "retries: none in any mode on any engine"]
    out += [""]
    notes = ["round trips = statements + commits per request, + the BEGIN psycopg sends, + the pool's reset ROLLBACK"
             " MySQL/MariaDB drivers send; client CPU = this process's CPU time per request (SQLite runs inside it)"]
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


def _round_trips(m: Mapping[str, Any]) -> str:
    st = m.get("statements")
    if not st:
        return "-"
    return str(st.get("round_trips", st["count"] + st["commits"]))


def render_one(report: Mapping[str, Any]) -> str:
    e, c = report["engine"], report["config"]
    lines = [
        f"idem-dialects bench -- {e['backend']} {e['server_version']} ({e['dialect']}+{e['driver']}), {e['url']}",
        f"workers {c['workers']}, {c['requests']} requests per mode x {c['repetitions']} interleaved repetitions"
        f" (+{c['warmup']} warm-up), duplicates {c['duplicates']:.0%} in the contention mode",
        f"bare effect: {report['bare_effect']}",
        "",
        f"{'mode':<30} {'req/s':>9} {'x bare':>7} {'paired':>7} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}"
        f" {'cpu ms':>7} {'stmts':>5}  retries",
    ]
    for mode, m in report["modes"].items():
        lat, st = m["latency_ms"], m["statements"]
        retries = ", ".join(f"{k} {v}" for k, v in m["retries"].items()) or "-"
        stmts = "-" if st is None else f"{st['count']}+{st['commits']}c"
        lines.append(
            f"{MODE_TITLES.get(mode, mode):<30} {m['throughput_per_s']['median']:>9,.0f} {m['ratio_to_bare']:>7.2f}"
            f" {m['ratio_to_bare_paired']:>7.2f} {lat['p50']:>8.3f} {lat['p95']:>8.3f} {lat['p99']:>8.3f}"
            f" {_opt(m.get('cpu_ms_per_request'), '{:.3f}'):>7} {stmts:>5}  {retries}")
    lines.append("")
    lines.append("stmts = SQL statements per request seen by before_cursor_execute + driver COMMITs (c);"
                 " cpu = process CPU")
    for mode, m in report["modes"].items():
        if m["statements"] is not None:
            lines.append(f"  {mode:<15} {' '.join(m['statements']['kinds'])}")
    if report["implicit_begin"]:
        lines.append(f"  plus, per transaction: {report['implicit_begin']}")
    contention = report["modes"].get("contention")
    if contention:
        o = contention["outcomes"]
        lines.append(f"contention outcomes: {o.get('applied', 0)} applied, {o.get('replayed', 0)} replayed")
    x = report["exactly_once"]
    lines.append(f"exactly-once: verified in the database after each of {x['checks']} slices"
                 f" ({x['effects']} effects == {x['distinct_keys']} distinct keys)")
    lines.append("")
    lines.append("targets:")
    for t in report["targets"]:
        mark = "met   " if t["met"] else "MISSED"
        if "ratio" in t:
            value = f"{t['ratio']:.2f}x (>= {t['minimum']}x)"
        elif "cpu_ms" in t:
            value = f"{t['cpu_ms']:.3f} ms (<= {t['maximum']} ms)"
        else:
            value = f"{t['growth_per_10k_kib']} KiB/10k"
        lines.append(f"  {mark} {t['target']}: {value}")
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
