"""The benchmark section of `idem-dialects report`'s HTML page (templates/bench.html.j2): for the sync store,
throughput per mode per engine side by side, the ratio to the bare effect, latency percentiles, client CPU and round
trips per request, and the machine and versions it ran on; every other report as its table (`render`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from idem_dialects.cli.reporting.html import environment
from idem_dialects.cli.reporting.svg import SHADES, Bar, Segment, bars, svg

from .render import (
    MODE_TITLES,
    SYNC,
    WIRE_NOTE,
    added_ms,
    at_latency,
    engine_label,
    modes_of,
    render_bench,
    runs,
    trips,
)


def section(reports: Sequence[Mapping[str, Any]], palette: Mapping[str, str]) -> str:
    """The section's HTML (autoescaped by its template), for the page to place as it is."""
    return environment("idem_dialects_bench").get_template("bench.html.j2").render(bench=view(reports, palette))


def view(reports: Sequence[Mapping[str, Any]], palette: Mapping[str, str]) -> dict[str, Any]:
    every = [run for report in reports for run in runs(report)]
    items = [run for run in every if run["schema"] in SYNC]
    skipped: dict[str, str] = {}
    for report in reports:
        skipped.update(report.get("skipped") or {})
    others = [(f"{engine_label(r)}: {r['schema'].removeprefix('idem-dialects-bench-').removesuffix('/1')}",
               render_bench(r)) for r in every if r["schema"] not in SYNC]
    return {"skipped": list(skipped), "others": others,
            "sync": sync_view(reports, items, palette) if items else None}


def sync_view(reports: Sequence[Mapping[str, Any]], items: Sequence[Mapping[str, Any]],
              palette: Mapping[str, str]) -> dict[str, Any]:
    names = [engine_label(r) for r in items]
    modes = modes_of(items)
    legend = [(n, palette.get(n, SHADES[0])) for n in names]
    pairs = list(zip(names, items, strict=True))

    def per_mode(mode_bars: Any, *, skip_bare: bool = False) -> list[tuple[str, list[Bar]]]:
        return [(MODE_TITLES.get(m, m), [mode_bars(n, r, r["modes"][m], m) for n, r in pairs if m in r["modes"]])
                for m in modes if not (skip_bare and m == "bare")]

    throughput = per_mode(lambda n, r, mode, m: Bar(n, [Segment(
        mode["throughput_per_s"]["median"], palette.get(n, SHADES[0]),
        f"{n}, {m}: {mode['throughput_per_s']['median']:,.0f} requests/s (median)")],
        f"{mode['throughput_per_s']['median']:,.0f}/s"))
    ratio = per_mode(lambda n, r, mode, m: Bar(n, [Segment(
        mode["ratio_to_bare"], palette.get(n, SHADES[0]), f"{n}, {m}: {mode['ratio_to_bare']:.2f} x the bare effect")],
        f"{mode['ratio_to_bare']:.2f}x"), skip_bare=True)
    latency = per_mode(lambda n, r, mode, m: Bar(n, [
        Segment(mode["latency_ms"][p], SHADES[i], f"{n}, {m}: {p} {mode['latency_ms'][p]} ms")
        for i, p in enumerate(("p50", "p95", "p99"))],
        " · ".join(f"{p} {mode['latency_ms'][p]:.2f}" for p in ("p50", "p99")) + " ms"))
    return {
        "config": items[0]["config"], "bare_effect": items[0]["bare_effect"], "one_run": len(reports) == 1,
        "wire_note": WIRE_NOTE[0].upper() + WIRE_NOTE[1:] + ".",
        "machine": _machine(reports, items, names), "names": names, "numbers": _numbers(items, modes),
        "throughput": svg(bars("chart-throughput", "requests/s per mode per engine", throughput, legend=legend,
                               unit="requests/s")),
        "ratio": svg(bars("chart-ratio", "ratio to the bare effect", ratio, legend=legend, unit="x bare",
                          reference=1.0)),
        "latency": svg(bars("chart-bench-latency", "latency percentiles per mode per engine", latency,
                            legend=[("p50", SHADES[0]), ("p95", SHADES[1]), ("p99", SHADES[2])], unit="ms",
                            log=True)),
    }


def _machine(reports: Sequence[Mapping[str, Any]], items: Sequence[Mapping[str, Any]],
             names: Sequence[str]) -> list[tuple[str, str]]:
    machine = next((r.get("machine") for r in [*reports, *items] if r.get("machine")), None)
    rows = []
    if machine:
        rows.append(("machine", f"{machine['platform']} ({machine['machine']}), {machine['cpus']} CPUs"))
        rows.append(("client", f"Python {machine['python']}, idem-dialects {machine['idem_dialects']}"))
    for n, r in zip(names, items, strict=True):
        e = r["engine"]
        rows.append((n, f"{e['backend']} {e['server_version']} via {e['dialect']}+{e['driver']}"))
    return rows


def _numbers(items: Sequence[Mapping[str, Any]], modes: Sequence[str]) -> list[tuple[str, list[tuple[str, list[str]]]]]:
    """(title, [(mode, one cell per engine)]) blocks of the numbers table."""
    blocks = []
    cells: tuple[tuple[str, Callable[[Mapping[str, Any]], str]], ...] = (
        ("requests/s (x bare)", lambda m: f"{m['throughput_per_s']['median']:,.0f} ({m['ratio_to_bare']:.2f})"),
        ("p50 / p95 / p99 ms", lambda m: " / ".join(f"{m['latency_ms'][p]:.2f}" for p in ("p50", "p95", "p99"))),
        ("client CPU ms per request", lambda m: "-" if m.get("cpu_ms_per_request") is None
         else f"{m['cpu_ms_per_request']:.3f}"),
        ("round trips per request", lambda m: trips(m.get("round_trips_per_request"))),
        *([(f"requests/s with {added:g} ms added to each round trip (x loopback)", at_latency)]
          if (added := added_ms(items)) else []),
        ("retries", lambda m: ", ".join(f"{k} {v}" for k, v in m["retries"].items()) or "none"),
    )
    for title, cell in cells:
        rows = [(MODE_TITLES.get(mode, mode), ["-" if (m := r["modes"].get(mode)) is None else cell(m) for r in items])
                for mode in modes]
        blocks.append((title, rows))
    return blocks
