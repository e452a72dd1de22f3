"""The benchmark part of the HTML report: throughput per mode per engine side by side, ratio to the bare effect,
latency percentiles, client CPU and round trips per request, and the machine and versions it ran on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from .bench import MODE_TITLES, engine_label, runs
from .svg import SHADES, Bar, Segment, bars


def _modes(items: Sequence[Mapping[str, Any]]) -> list[str]:
    modes: list[str] = []
    for run in items:
        modes += [m for m in run["modes"] if m not in modes]
    return modes


def bench_section(reports: Sequence[Mapping[str, Any]], palette: Mapping[str, str]) -> str:
    items = [run for report in reports for run in runs(report)]
    skipped: dict[str, str] = {}
    for report in reports:
        skipped.update(report.get("skipped") or {})
    names = [engine_label(r) for r in items]
    modes = _modes(items)
    out = ['<h2 id="benchmark">Benchmark: what idempotency costs, per engine</h2>']
    one_run = len(reports) == 1
    c = items[0]["config"]
    out.append(f"<p>Seed 000's debit workload (<code>{escape(str(items[0]['bare_effect']))}</code>) beside the same"
               f" effect through <code>IdempotencyStore.run</code>; {c['workers']} worker(s), {c['requests']} requests"
               f" per mode &times; {c['repetitions']} interleaved repetitions (+{c['warmup']} warm-up), duplicates"
               f" {c['duplicates']:.0%} in the contention mode. "
               + ("All engines measured in one run, one after another." if one_run else
                  "Engines come from separate runs: compare their ratios to the bare effect rather than rates.")
               + " Exactly-once was verified in the database after every slice.</p>")
    out.append(_machine(reports, items, names))
    if skipped:
        out.append(f"<p class=\"muted\">Not available for this run: {escape(', '.join(skipped))}.</p>")
    legend = [(n, palette.get(n, SHADES[0])) for n in names]
    groups = [(MODE_TITLES.get(m, m), [
        Bar(n, [Segment(r["modes"][m]["throughput_per_s"]["median"], palette.get(n, SHADES[0]),
                        f"{n}, {m}: {r['modes'][m]['throughput_per_s']['median']:,.0f} requests/s (median)")],
            f"{r['modes'][m]['throughput_per_s']['median']:,.0f}/s")
        for n, r in zip(names, items, strict=True) if m in r["modes"]]) for m in modes]
    out.append("<h3>Requests per second by mode (median over repetitions)</h3>")
    out.append(bars("chart-throughput", "requests/s per mode per engine", groups, legend=legend, unit="requests/s"))
    groups = [(MODE_TITLES.get(m, m), [
        Bar(n, [Segment(r["modes"][m]["ratio_to_bare"], palette.get(n, SHADES[0]),
                        f"{n}, {m}: {r['modes'][m]['ratio_to_bare']:.2f} x the bare effect")],
            f"{r['modes'][m]['ratio_to_bare']:.2f}x") for n, r in zip(names, items, strict=True) if m in r["modes"]])
        for m in modes if m != "bare"]
    out.append("<h3>Throughput as a ratio of the bare effect (dashed line = 1, the effect with no idempotency)</h3>")
    out.append(bars("chart-ratio", "ratio to the bare effect", groups, legend=legend, unit="x bare", reference=1.0))
    groups = [(MODE_TITLES.get(m, m), [
        Bar(n, [Segment(r["modes"][m]["latency_ms"][p], SHADES[i], f"{n}, {m}: {p} {r['modes'][m]['latency_ms'][p]} ms")
                for i, p in enumerate(("p50", "p95", "p99"))],
            " · ".join(f"{p} {r['modes'][m]['latency_ms'][p]:.2f}" for p in ("p50", "p99")) + " ms")
        for n, r in zip(names, items, strict=True) if m in r["modes"]]) for m in modes]
    out.append("<h3>Request latency percentiles</h3>")
    out.append(bars("chart-bench-latency", "latency percentiles per mode per engine", groups,
                    legend=[("p50", SHADES[0]), ("p95", SHADES[1]), ("p99", SHADES[2])], unit="ms", log=True))
    out.append(_numbers(items, names, modes))
    return "\n".join(out)


def _machine(reports: Sequence[Mapping[str, Any]], items: Sequence[Mapping[str, Any]], names: Sequence[str]) -> str:
    machine = next((r.get("machine") for r in [*reports, *items] if r.get("machine")), None)
    rows = []
    if machine:
        rows.append(("machine", f"{machine['platform']} ({machine['machine']}), {machine['cpus']} CPUs"))
        rows.append(("client", f"Python {machine['python']}, idem-dialects {machine['idem_dialects']}"))
    for n, r in zip(names, items, strict=True):
        e = r["engine"]
        rows.append((n, f"{e['backend']} {e['server_version']} via {e['dialect']}+{e['driver']}"))
    return ("<table><thead><tr><th>ran on</th><th></th></tr></thead>"
            + "".join(f"<tr><th scope=\"row\">{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in rows)
            + "</table>")


def _numbers(items: Sequence[Mapping[str, Any]], names: Sequence[str], modes: Sequence[str]) -> str:
    head = "".join(f"<th>{escape(n)}</th>" for n in names)

    def row(title: str, mode: str, cell: Any) -> str:
        cells = []
        for r in items:
            m = r["modes"].get(mode)
            cells.append("-" if m is None else cell(m))
        return f"<tr><td>{escape(title)}</td>" + "".join(f"<td>{escape(x)}</td>" for x in cells) + "</tr>"

    blocks = []
    for title, cell in (
        ("requests/s (x bare)", lambda m: f"{m['throughput_per_s']['median']:,.0f} ({m['ratio_to_bare']:.2f})"),
        ("p50 / p95 / p99 ms", lambda m: " / ".join(f"{m['latency_ms'][p]:.2f}" for p in ("p50", "p95", "p99"))),
        ("client CPU ms per request", lambda m: "-" if m.get("cpu_ms_per_request") is None
         else f"{m['cpu_ms_per_request']:.3f}"),
        ("round trips per request", lambda m: "-" if not m.get("statements") else
         str(m["statements"].get("round_trips", m["statements"]["count"] + m["statements"]["commits"]))),
        ("retries", lambda m: ", ".join(f"{k} {v}" for k, v in m["retries"].items()) or "none"),
    ):
        rows = []
        for mode in modes:
            rows.append(row(MODE_TITLES.get(mode, mode), mode, cell))
        blocks.append(f"<tr><th colspan=\"{len(names) + 1}\">{escape(title)}</th></tr>" + "".join(rows))
    return ("<h3>The numbers</h3><table class=\"num\"><thead><tr><th>mode</th>" + head + "</tr></thead>"
            + "".join(blocks) + "</table><p class=\"muted\">Round trips = statements + commits per request, + the"
            " BEGIN psycopg sends, + the pool's reset ROLLBACK MySQL/MariaDB drivers send. Client CPU = this"
            " process's CPU time per request (SQLite runs inside it).</p>")
