"""The CLI as a whole: subcommands imported only when they run, and one exit status per kind of outcome."""

from __future__ import annotations

import argparse
import json
import secrets
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from cli_common import CLI, run_each
from sqlalchemy import create_engine, inspect, text

from idem_dialects import IdempotencyStore
from idem_dialects.cli import COMMANDS, main
from idem_dialects.cli.commands import EXIT_UNAVAILABLE, EXIT_USAGE

LOADED = "import sys\n{run}\nprint(sorted(m for m in sys.modules if m.startswith('idem_dialects.cli.commands.')" \
         " or m in ('pytest', 'idem_dialects_bench', 'idem_dialects.engines')))\n"


def loaded_after(run: str) -> str:
    done = subprocess.run([sys.executable, "-c", LOADED.format(run=run)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_only_the_subcommand_that_runs_is_imported() -> None:
    run = "from idem_dialects.cli import main\nmain(['demo'])"
    assert loaded_after(run) == "['idem_dialects.cli.commands.demo']"
    run = "from idem_dialects.cli import main\nmain(['engines', '--engine', 'sqlite', '--format', 'json'])"
    assert loaded_after(run) == "['idem_dialects.cli.commands.engines', 'idem_dialects.engines']"


def test_top_level_help_lists_every_subcommand_without_importing_them() -> None:
    run = ("from idem_dialects.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass")
    assert loaded_after(run) == "[]"


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_subcommand_has_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([name, "--help"])
    assert exit_.value.code == 0 and "usage: idem-dialects " + name in capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["no-such-command"],
    ["matrix", "--format", "yaml"],
    ["matrix", "--engine", "db2"],
    ["matrix", "--url", "no-equals-sign"],
    ["engines", "--engine", "db2"],
    ["check", "::not a url::"],
])
def test_usage_errors_have_their_own_status(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code  # type: ignore[assignment]
    assert code == EXIT_USAGE != EXIT_UNAVAILABLE
    assert "Traceback" not in capsys.readouterr().err


def test_matrix_k_selecting_nothing_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["matrix", "--engine", "sqlite", "-k", "no_check_is_called_this", "--quiet"]) == EXIT_USAGE
    assert "selects no check" in capsys.readouterr().err


def test_demo_on_a_named_database_drops_only_its_own_tables(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'mine.db'}"
    engine = create_engine(url)
    try:
        with engine.begin() as conn:  # tables of the user's that a fixed-name demo would have dropped
            for name in ("demo_account", "demo_records", "demo_messages", "idem_records"):
                conn.execute(text(f"CREATE TABLE {name} (id INTEGER PRIMARY KEY)"))
                conn.execute(text(f"INSERT INTO {name} (id) VALUES (7)"))
        assert main(["demo", "--url", url]) == 0
        assert "balance is 950" in capsys.readouterr().out
        assert sorted(inspect(engine).get_table_names()) == ["demo_account", "demo_messages", "demo_records",
                                                             "idem_records"]
        with engine.connect() as conn:
            assert conn.execute(text("SELECT id FROM demo_account")).scalar_one() == 7
    finally:
        engine.dispose()


# --- the exit-code table, output options and papercuts ---------------------------------------------------------------

# The commands that print a report (or statements, or a list) on stdout: each takes -o/--output FILE and -q/--quiet.
REPORTERS = ["matrix", "check", "bench", "report", "engines", "stats", "ddl", "consumers"]


@pytest.mark.parametrize("argv", [["ddl", "sqlite"], ["demo"], ["engines"], ["--help"], ["ddl", "--help"]],
                         ids=" ".join)
def test_a_reader_closing_the_pipe_early_is_not_an_error(argv: list[str], tmp_path: Path) -> None:
    """`idem-dialects ddl sqlite | head -1`: exit 0 and nothing on stderr, not "[Errno 32] Broken pipe" and 2."""
    command = " ".join([*CLI, *argv])
    done = subprocess.run(["bash", "-o", "pipefail", "-c", f"{command} | head -1"], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == "", (done.returncode, done.stderr)
    assert len(done.stdout.splitlines()) == 1


def test_a_full_disk_is_still_an_error(tmp_path: Path) -> None:
    """Only a reader that left is forgiven: stdout on a full device still fails, in one line."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        done = subprocess.run([*CLI, "ddl", "sqlite"], stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode != 0 and "No space left" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("name", REPORTERS)
def test_every_report_command_takes_output_and_quiet(name: str) -> None:
    from idem_dialects.cli import build_parser

    subparsers = next(a for a in build_parser(name)._actions if isinstance(a, argparse._SubParsersAction))
    options = {o for action in subparsers.choices[name]._actions for o in action.option_strings}
    assert {"-o", "--output", "-q", "--quiet"} <= options, sorted(options)


def test_reports_go_to_the_file_given_with_o(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    url = f"sqlite:///{db}"
    runs = {
        "ddl.sql": ["ddl", "sqlite", "-q", "-o", "ddl.sql"],
        "engines.json": ["engines", "--engine", "sqlite", "--format", "json", "-o", "engines.json", "-q"],
        "check.json": ["check", url, "-k", "first_request", "--format", "json", "-q", "-o", "check.json"],
        "matrix.txt": ["matrix", "--engine", "sqlite", "-k", "first_request", "-q", "-o", "matrix.txt"],
        "stats.json": ["stats", url, "--format", "json", "-o", "stats.json", "-q"],
        "report.md": ["report", "check.json", "-o", "report.md", "-q"],
    }
    init, *done_runs = run_each([["init", url, "-q"], *runs.values()], tmp_path, timeout=600)
    assert init.returncode == 0, init.stderr
    for (out, args), done in zip(runs.items(), done_runs, strict=True):
        assert done.returncode == 0, (args, done.stderr)
        assert done.stdout == "" and done.stderr == "", (args, done.stdout, done.stderr)  # -q: nothing but the file
        assert (tmp_path / out).stat().st_size > 0, out
    assert "CREATE TABLE idem_records" in (tmp_path / "ddl.sql").read_text()
    assert json.loads((tmp_path / "check.json").read_text())["summary"]["exit_status"] == 0
    assert "first_request_claims_and_runs_once" in (tmp_path / "matrix.txt").read_text()


@pytest.mark.parametrize("command", [["stats"], ["purge", "--older-than", "1d"]])
def test_stats_and_purge_never_create_a_missing_sqlite_database(command: list[str], tmp_path: Path) -> None:
    missing = tmp_path / "typo.db"
    done = subprocess.run([*CLI, command[0], f"sqlite:///{missing}", *command[1:]], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == EXIT_UNAVAILABLE, done.stderr
    assert done.stderr.splitlines() == [
        f"idem-dialects {command[0]}: cannot connect to the sqlite database: the database file '{missing}' does not"
        " exist", "  fix: check the path in the URL; `idem-dialects init URL` creates it"]
    assert not missing.exists()


def test_purge_is_quiet_unless_asked_for_progress(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    subprocess.run([*CLI, "init", url], capture_output=True, timeout=120, check=True)
    plain = subprocess.run([*CLI, "purge", url, "--older-than", "1d"], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0 and plain.stderr == "" and plain.stdout.startswith("purged 0 rows"), plain
    verbose = subprocess.run([*CLI, "purge", url, "--older-than", "1d", "-v"], capture_output=True, text=True,
                             timeout=120)
    assert verbose.returncode == 0 and "idem_records: 0 deleted" in verbose.stderr, verbose
    quiet = subprocess.run([*CLI, "purge", url, "--older-than", "1d", "-q"], capture_output=True, text=True,
                           timeout=120)
    assert quiet.returncode == 0 and quiet.stdout == quiet.stderr == "", quiet


@pytest.mark.parametrize("engine", ["sqlite", "postgresql", "mariadb"])
def test_stats_json_gives_utc_times_with_their_offset_on_every_engine(engine: str, tmp_path: Path) -> None:
    from idem_dialects.engines import Unavailable, get

    try:
        server = get(engine).provide()
    except Unavailable as exc:
        pytest.skip(f"{engine} unavailable: {exc}")
    prefix = f"st{secrets.token_hex(3)}_"
    url = server.url.render_as_string(hide_password=False)
    store = IdempotencyStore.from_url(server.url, table_prefix=prefix, retention=timedelta(seconds=1))
    try:
        store.create_tables()
        with store.transaction() as conn:  # a claim left open: stats reports its created_at
            store.claim(conn, scope="s", operation="op", key="k", request={}, lease=timedelta(hours=1))
        done = subprocess.run([*CLI, "stats", url, "--table-prefix", prefix, "--format", "json"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        for moment in (report["db_now"], report["oldest_open"]["created_at"]):
            assert datetime.fromisoformat(moment).utcoffset() == timedelta(0), moment
    finally:
        store.drop_tables()
        store.close()
        server.stop()
