"""`idem-dialects report`: saved matrix and bench JSON rendered as a 120-column table, markdown and one HTML page.

The HTML check runs the real commands on the four engines this machine provides (a `-k` subset of the matrix, a
short bench), renders the page, proves it refers to nothing outside itself, and opens it in Debian's headless
Chromium with the network cut off: a screenshot, the rendered DOM (every engine name and chart present) and no
console or script error (an error hook writes what it caught into the DOM; Chromium's console log is checked too).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from report_common import grid_columns

from idem_dialects.cli.reporting import render, render_html, render_matrix
from idem_dialects.engines import started

LIVE = ["sqlite", "postgresql-18", "postgresql", "mariadb"]
SUBSET = "same_key_thread_race or same_key_race_under_isolation or key_column_declares or declared_isolation"
CHARTS = ["chart-latency", "chart-retries", "chart-duplicates", "chart-throughput", "chart-ratio",
          "chart-bench-latency"]
NO_DOCKER = "unix:///nonexistent/idem-dialects-test/docker.sock"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--host-resolver-rules=MAP * ~NOTFOUND"]  # no name resolves: the page must need no network
ERROR_HOOK = """<script>
window.__errors = [];
window.addEventListener('error', e => window.__errors.push(String(e.message || e.target && e.target.outerHTML)), true);
for (const level of ['error', 'warn']) {
  const original = console[level];
  console[level] = (...args) => { window.__errors.push(level + ': ' + args.join(' ')); original(...args); };
}
window.addEventListener('load', () => {
  document.body.setAttribute('data-errors', JSON.stringify(window.__errors));
  document.body.setAttribute('data-loaded', 'yes');
});
</script>"""


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IDEM_URL_")}
    env["DOCKER_HOST"] = NO_DOCKER
    return subprocess.run([sys.executable, "-m", "idem_dialects.cli", *args], capture_output=True, text=True,
                          env=env, timeout=900, cwd=cwd)


@pytest.fixture(scope="module")
def live_reports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """matrix.json (the four live engines and three that cannot be had here, a subset of the checks) and bench.json
    (the four live engines, one run). Engines are named so that no cluster engine is started just for this."""
    if started.refusal():  # the CLI runs in a process of its own, which the run's refusal does not reach
        pytest.skip(f"the four live engines are needed: {started.refusal()}")
    out = tmp_path_factory.mktemp("live-report")
    engines = [a for n in [*LIVE, "mysql-8.4", "mssql"] for a in ("--engine", n)]
    done = cli("matrix", *engines, "-k", SUBSET, "--format", "json", "--output", str(out / "matrix.json"), "--quiet")
    assert done.returncode == 0, done.stderr
    engines = json.loads((out / "matrix.json").read_text())["engines"]
    missing = [f"{n}: {engines[n]['reason']}" for n in LIVE if not engines[n]["available"]]
    if missing:
        pytest.skip("the four live engines are needed; unavailable here: " + "; ".join(missing))
    done = cli("bench", *(a for n in LIVE for a in ("--engine", n)), "--requests", "20", "--repetitions", "1",
               "--warmup", "2", "--workers", "2", "--format", "json", "--output", str(out / "bench.json"), "--quiet")
    assert done.returncode == 0, done.stderr
    return out


def test_default_matrix_table_fits_120_columns(live_reports: Path) -> None:
    report = json.loads((live_reports / "matrix.json").read_text())
    done = cli("report", str(live_reports / "matrix.json"))  # what `matrix` prints: the same renderer
    assert done.returncode == 0, done.stderr
    assert done.stdout == render(report, "table")
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 120, max(lines, key=len)
    assert grid_columns(done.stdout) == ["check", *LIVE]  # columns named by engine; unavailable ones are not ...
    unavailable = [n for n, e in report["engines"].items() if not e["available"]]
    # ... but one line
    assert unavailable and f"Not available here, every check skipped ({len(unavailable)})" in done.stdout
    assert "duplicates resolved by" in done.stdout and "…" not in done.stdout  # long observations wrap, never cut


def test_wide_reports_still_fit_120_columns() -> None:
    """Seven engines with long names and long observations: numbered columns and wrapped notes keep 120."""
    engines = {f"engine-with-a-long-name-{i}": {"available": True, "how": "URL " * 30, "server_version": "x 1.0"}
               for i in range(7)}
    cell = {"outcome": "failed", "reason": "a reason " * 40, "duration": 0.1}
    report: dict[str, Any] = {
        "engines": engines,
        "checks": [{"id": "a_check_with_a_rather_long_identifier_" * 2, "statement": "s", "module": "m",
                    "results": dict.fromkeys(engines, cell)}],
        "observations": {n: {"an observation with a long name " * 3: "a long observed value " * 8, "n": 1}
                         for n in engines},
        "summary": {"passed": 0, "failed": 7, "skipped": 0, "duration": 1.0, "exit_status": 1},
    }
    for show_skipped in (False, True):
        text = render_matrix(report, "table", show_skipped=show_skipped)
        assert max(len(line) for line in text.splitlines()) <= 120


def test_report_renders_html_that_headless_chromium_opens_offline(live_reports: Path, tmp_path: Path) -> None:
    html_path = tmp_path / "report.html"
    done = cli("report", str(live_reports / "matrix.json"), str(live_reports / "bench.json"), "-o", str(html_path))
    assert done.returncode == 0, done.stderr
    page = html_path.read_text(encoding="utf-8")
    # Self-contained: no URL of any scheme that would reach out, no resource attribute, no CSS import or url().
    assert re.findall(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", page, re.I) == []
    assert re.findall(r"\s(?:src|srcset|href)\s*=\s*(?![\"']?#)", page, re.I) == []  # only in-page anchors
    assert "@import" not in page and "url(" not in page and "<script" not in page and "<link" not in page
    for name in LIVE:
        assert f">{name}<" in page
    for chart in CHARTS:
        assert f'id="{chart}"' in page
    assert "not available here" in page and "to enable:" in page  # unavailable engines: one collapsed line
    grid = page[page.index('<table class="grid"'):]
    grid = grid[:grid.index("</table>")]
    cells = re.findall(r'<td class="[^"]*"><a href="#([^"]+)"', grid)
    assert len(cells) == grid.count("<td ")  # every cell links ...
    assert all(f'id="{target}"' in page for target in cells)  # ... to its reason (or the check's guarantee)

    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium): cannot render the page")
    hooked = tmp_path / "hooked.html"
    hooked.write_text(page.replace("<head>", "<head>" + ERROR_HOOK, 1), encoding="utf-8")
    dom = _chromium(chromium, tmp_path, "--dump-dom", hooked.as_uri())
    assert 'data-loaded="yes"' in dom.stdout, dom.stderr[-2000:]
    assert 'data-errors="[]"' in dom.stdout, re.findall(r'data-errors="[^"]*"', dom.stdout)
    for name in LIVE:
        assert f">{name}<" in dom.stdout
    for chart in CHARTS:
        assert f'id="{chart}"' in dom.stdout
    shot = tmp_path / "report.png"
    done = _chromium(chromium, tmp_path, "--enable-logging=stderr", "--v=0", "--hide-scrollbars",
                     "--window-size=1280,2400", f"--screenshot={shot}", html_path.as_uri())
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == []
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 50_000  # a blank page compresses to a few KiB


def _chromium(chromium: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp / f"chromium-profile-{len(list(tmp.iterdir()))}"
    done = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def test_markdown_of_a_bench_set_is_one_side_by_side_table(live_reports: Path) -> None:
    done = cli("report", str(live_reports / "bench.json"), "--format", "markdown")
    assert done.returncode == 0, done.stderr
    header = next(line for line in done.stdout.splitlines() if line.startswith("| requests/s"))
    assert header == "| requests/s (x bare) | " + " | ".join(LIVE) + " |"


def test_report_of_a_file_that_is_not_a_report_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text('{"hello": 1}')
    done = cli("report", str(bad), str(tmp_path / "missing.json"))
    assert done.returncode == 64 and "x.json: not a report of idem-dialects matrix or bench" in done.stderr
    assert "Traceback" not in done.stderr
    done = cli("report", str(tmp_path / "missing.json"))
    assert done.returncode == 64 and "missing.json: cannot read it" in done.stderr


def test_html_of_an_empty_matrix_has_no_charts_but_renders() -> None:
    report = {"version": 1, "engines": {"sqlite": {"available": True, "how": "h", "server_version": "v"}},
              "checks": [], "observations": {"sqlite": {}},
              "summary": {"passed": 0, "failed": 0, "skipped": 0, "duration": 0, "exit_status": 1}}
    page = render_html([report])
    assert "No engine recorded behaviour observations" in page and "chart-latency" not in page


def test_matrix_writes_json_and_html_in_one_run(tmp_path: Path) -> None:
    done = cli("matrix", "--engine", "sqlite", "--engine", "oracle-23", "-k", "same_key_thread_race", "--format",
               "json", "--output", str(tmp_path / "m.json"), "--html", str(tmp_path / "m.html"), "--quiet")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert json.loads((tmp_path / "m.json").read_text())["version"] == 1
    page = (tmp_path / "m.html").read_text()
    assert 'id="chart-latency"' in page and ">sqlite<" in page
    assert "1 engine not available here, every check skipped: oracle-23" in page  # collapsed, with how to enable
    assert "to enable: set IDEM_URL_ORACLE_23=" in page


def test_engines_report_renders_in_every_format(tmp_path: Path) -> None:
    done = cli("engines", "--probe", "--engine", "sqlite", "--engine", "oracle-23", "--format", "json")
    assert done.returncode == 0, done.stderr
    saved = tmp_path / "engines.json"
    saved.write_text(done.stdout)
    table = cli("report", str(saved)).stdout
    assert "sqlite         available" in table and "oracle-23      unavailable" in table
    assert "| oracle-23 | unavailable |" in cli("report", str(saved), "--format", "markdown").stdout
    assert 'id="catalogue"' in cli("report", str(saved), "--format", "html").stdout


def test_effect_callable_calls_per_key_are_charted_where_a_cluster_reports_them() -> None:
    """Recorded as text by the cluster checks ("2.9 (max 4; ...)"): charted by its number, shown as recorded."""
    engine = {"available": True, "how": "h", "server_version": "v"}
    report = {
        "version": 1, "engines": {"galera": engine, "mariadb": engine}, "checks": [],
        "observations": {
            "galera": {"spread race: effect callable calls per key": "2.9 (max 4; 38 of 58 runs rolled back)",
                       "spread race (16 threads, 20 keys): effects per key in the database": 1},
            "mariadb": {"16-thread race: median caller (ms)": 12.5, "16-thread race: slowest caller (ms)": 30}},
        "summary": {"passed": 0, "failed": 0, "skipped": 0, "duration": 0, "exit_status": 0},
    }
    page = render_html([report])
    chart = page[page.index('id="chart-effect-calls"'):]
    chart = chart[:chart.index("</svg>")]
    assert ">2.9<" in chart and "38 of 58 runs rolled back" in chart and "effects per key in the database" in chart
    assert "spread race: effect callable calls per key: galera 2.9 (max 4; 38 of 58 runs rolled back)." in page
    assert 'id="chart-latency"' in page and "galera" not in page[page.index('id="chart-latency"'):].split("</svg>")[0]


# Writes into the page, once it has rendered, each chart text drawn outside its chart's drawing (its viewBox).
MEASURE_HOOK = """<script>
window.addEventListener('load', () => {
  const outside = [];
  for (const chart of document.querySelectorAll('svg.chart')) {
    const view = chart.viewBox.baseVal;
    for (const text of chart.querySelectorAll('text')) {
      const box = text.getBBox();
      if (box.x < view.x - 0.5 || box.x + box.width > view.x + view.width + 0.5)
        outside.push(chart.id + ' ' + text.getAttribute('class') + ': ' + text.textContent);
    }
  }
  document.body.setAttribute('data-outside', JSON.stringify(outside));
});
</script>"""


def test_one_engine_check_report_reads_right_and_leaves_no_file_behind(tmp_path: Path) -> None:
    """A newcomer's first report: `check` on a SQLite file, with --html. Every chart's text (its legend above all)
    lies inside its drawing in Chromium's own layout; the page names no option `check` lacks; counts of one are
    singular; and the database file the check made is gone (kept with --keep-database)."""
    from idem_dialects.cli import reference_parser

    done = cli("check", "sqlite:///rep.db", "-k", SUBSET, "--html", "report.html", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    check = next(a for a in reference_parser()._actions if a.dest == "command").choices["check"]  # type: ignore
    options = {o for a in check._actions for o in a.option_strings}
    text = re.sub(r"<style>.*?</style>", "", page, flags=re.S)  # CSS custom properties are --names too
    assert set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", text)) <= options
    assert "URL given on the command line" in page
    assert re.findall(r"\b1 (?:engines|checks)\b", page) == [] and "&times; 1 engine</h2>" in page
    for chart in ("chart-latency", "chart-retries", "chart-duplicates"):
        assert f'id="{chart}"' in page

    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium): cannot lay the page out")
    hooked = tmp_path / "hooked.html"
    hooked.write_text(page.replace("<head>", "<head>" + MEASURE_HOOK, 1), encoding="utf-8")
    dom = _chromium(chromium, tmp_path, "--dump-dom", hooked.as_uri()).stdout
    assert "data-outside=" in dom, dom[-2000:]
    assert 'data-outside="[]"' in dom, re.findall(r'data-outside="[^"]*"', dom)

    kept = cli("check", "sqlite:///kept.db", "-k", "declared_isolation", "--quiet", "--keep-database", cwd=tmp_path)
    assert kept.returncode == 0 and (tmp_path / "kept.db").is_file(), kept.stderr
