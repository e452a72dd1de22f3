"""The matrix and check commands, run as a user would (a subprocess): report formats, JSON schema, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from report_common import grid_columns

from idem_dialects.engines import env_var

NO_DOCKER = "unix:///nonexistent/idem-dialects-test/docker.sock"
QUICK = "first_request or keys_differing_in_case or same_key_thread_race"


def cli(*args: str, code: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IDEM_URL_")}
    env["DOCKER_HOST"] = NO_DOCKER
    prefix = ["-c", code] if code else ["-m", "idem_dialects.cli"]
    return subprocess.run([sys.executable, *prefix, *args], capture_output=True, text=True, env=env, timeout=600)


def test_json_report_schema() -> None:
    done = cli("matrix", "--engine", "sqlite", "--engine", "mysql-8.4", "-k", QUICK, "--format", "json")
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["version"] == 1
    assert set(report) >= {"engines", "checks", "observations", "summary"}
    sqlite, mysql = report["engines"]["sqlite"], report["engines"]["mysql-8.4"]
    assert sqlite["available"] and sqlite["how"] and sqlite["reason"] is None
    assert not mysql["available"] and "IDEM_URL_MYSQL_8_4" in mysql["hint"] and mysql["reason"]
    checks = {c["id"]: c for c in report["checks"]}
    assert set(checks) == {"first_request_claims_and_runs_once", "keys_differing_in_case_are_distinct",
                           "same_key_thread_race"}
    first = checks["first_request_claims_and_runs_once"]
    assert first["statement"].startswith("A first request runs its effect once")
    assert first["results"]["sqlite"]["outcome"] == "passed" and first["results"]["sqlite"]["duration"] >= 0
    skipped = first["results"]["mysql-8.4"]
    assert skipped["outcome"] == "skipped" and "mysql-8.4 unavailable" in skipped["reason"]
    assert "16-thread race: duplicates resolved by" in report["observations"]["sqlite"]
    assert "mysql-8.4" not in report["observations"]
    assert report["summary"]["exit_status"] == 0 and report["summary"]["failed"] == 0
    assert "[" in done.stderr and "passed" in done.stderr  # progress lines


def test_table_summarises_unavailable_engines_in_one_line() -> None:
    done = cli("matrix", "--engine", "sqlite", "--engine", "mssql", "-k", "first_request")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "first_request_claims_and_runs_once" in out and "✓" in out
    assert "Not available here, every check skipped (2): mssql-2022, mssql-2025." in out
    assert grid_columns(out) == ["check", "sqlite"]  # no column per unavailable engine
    assert max(len(line) for line in out.splitlines()) <= 120  # the default table fits a 120-column terminal
    assert "Behaviour" in out and "server version" in out


def test_show_skipped_lists_unavailable_engines_with_reason() -> None:
    done = cli("matrix", "--engine", "sqlite", "--engine", "mssql", "-k", "first_request", "--show-skipped")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "mssql-2022" in out and "mssql-2025" in out and "skip" in out
    assert "Docker engine not reachable" in out or "testcontainers is not installed" in out  # with/without [containers]
    assert grid_columns(out) == ["check", "sqlite", "mssql-2022", "mssql-2025"]
    assert max(len(line) for line in out.splitlines()) <= 120


def test_markdown_format() -> None:
    done = cli("matrix", "--engine", "sqlite", "-k", "first_request", "--format", "markdown")
    assert done.returncode == 0, done.stderr
    assert "| check | guarantee | sqlite |" in done.stdout and "## Behaviour" in done.stdout


def test_required_engine_missing_exits_2_with_how_to() -> None:
    done = cli("matrix", "--engine", "sqlite", "--require", "mssql-2022")
    assert done.returncode == 2
    assert "required engine mssql-2022 is unavailable" in done.stderr
    assert "IDEM_URL_MSSQL_2022=mssql+pyodbc://" in done.stderr and "Docker" in done.stderr
    assert done.stdout == ""


def test_require_family_alias() -> None:
    done = cli("matrix", "--require", "oracle")
    assert done.returncode == 2
    assert "oracle-23 is unavailable" in done.stderr and "oracle-26 is unavailable" in done.stderr


def test_failed_check_exits_1() -> None:
    broken = (
        "import sys\n"
        "from idem_dialects import store\n"
        "def run(self, **kw):\n"
        "    raise RuntimeError('deliberately broken backend')\n"
        "store.IdempotencyStore.run = run\n"
        "from idem_dialects.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    done = cli("matrix", "--engine", "sqlite", "-k", "first_request", "--format", "json", code=broken)
    assert done.returncode == 1, done.stderr
    cell = json.loads(done.stdout)["checks"][0]["results"]["sqlite"]
    assert cell["outcome"] == "failed" and "deliberately broken backend" in cell["reason"]
    assert "FAILED first_request_claims_and_runs_once on sqlite" in done.stderr


def test_check_command_on_a_url(tmp_path: Path) -> None:
    done = cli("check", f"sqlite:///{tmp_path / 'mine.db'}", "-k", "first_request or purge_removes", "--format",
               "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert list(report["engines"]) == ["target"]
    assert report["engines"]["target"]["how"] == "URL given on the command line"
    assert {c["id"] for c in report["checks"]} == {"first_request_claims_and_runs_once", "purge_removes_old_keeps_live"}


def test_check_command_unreachable_url_exits_2() -> None:
    done = cli("check", "postgresql+psycopg://nobody@127.0.0.1:1/none")
    assert done.returncode == 2
    assert "cannot connect" in done.stderr


def test_an_async_only_check_under_the_sync_api_is_left_out_not_a_crash() -> None:
    """pytest parametrizes a check with no column (async-only, --api sync) with NOTSET: not a column of the report."""
    done = cli("matrix", "--engine", "sqlite", "-k", "async_undeclared or first_request", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert "INTERNALERROR" not in done.stderr
    assert [c["id"] for c in json.loads(done.stdout)["checks"]] == ["first_request_claims_and_runs_once"]


CLUSTERS = {"postgresql-patroni", "pgbouncer-transaction", "galera-haproxy-all-writers",
            "galera-haproxy-single-writer"}


def test_default_run_starts_no_cluster_and_no_container() -> None:
    """Without --engine: the embedded engines and the servers found here run; every engine that needs a cluster
    or a container started is listed once as not run unless asked for, and nothing of it was started."""
    done = cli("matrix", "-k", "first_request_claims", "--format", "json", "--quiet")
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    engines = report["engines"]
    held = {name for name, e in engines.items() if e["on_request"]}
    assert CLUSTERS | {"mysql-8.4", "mssql-2022", "oracle-26"} <= held
    assert all(not engines[n]["available"] and "not started unless asked for" in engines[n]["reason"] for n in held)
    assert engines["sqlite"]["available"] and not engines["sqlite"]["on_request"]
    from idem_dialects.cli.reporting import render

    text = render(report, "table")
    assert f"Not run unless asked for ({len(held)}):" in text and "--engine NAME" in text


def test_a_cluster_is_held_back_without_starting_anything() -> None:
    """What the default run asks of a cluster's catalogue entry: no provider that starts servers is tried."""
    from idem_dialects.engines import ENGINES, EntryUnavailable

    for name in CLUSTERS:
        try:
            ENGINES[name].provide(start_on_request=False)
        except EntryUnavailable as exc:
            assert exc.held_back and exc.reasons == [f"{env_var(name)} is not set"], (name, exc)
        else:
            raise AssertionError(f"{name} was provided without being asked for")


def test_each_distinct_reason_is_one_note() -> None:
    """Three checks skipped on four engines for one reason, one failure: two notes, and cells point at them."""
    from idem_dialects.cli.reporting import render_matrix

    names = ["sqlite", "postgresql-18", "postgresql", "mariadb"]
    skipped = {"outcome": "skipped", "reason": "needs multi_primary, which this engine lacks", "duration": 0}
    checks = [{"id": f"cluster_check_{i}", "statement": "s", "module": "m", "results": dict.fromkeys(names, skipped)}
              for i in range(3)]
    checks.append({"id": "a_check", "statement": "s", "module": "m", "results": {
        n: {"outcome": "failed" if n == "mariadb" else "passed", "reason": "boom" if n == "mariadb" else None,
            "duration": 0} for n in names}})
    report: dict[str, Any] = {
        "engines": {n: {"available": True, "how": "here", "server_version": "1"} for n in names},
        "checks": checks, "observations": {},
        "summary": {"passed": 3, "failed": 1, "skipped": 12, "duration": 1.0, "exit_status": 1}}
    text = render_matrix(report)
    assert text.count("needs multi_primary") == 1 and text.count("boom") == 1
    assert text.count("skip [1]") == 12 and "✗ [2]" in text
    assert grid_columns(text) == ["check", *names]
