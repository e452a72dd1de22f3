"""The CLI as a whole: subcommands imported only when they run, and one exit status per kind of outcome."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from idem_dialects.cli import COMMANDS, main
from idem_dialects.cli.commands import EXIT_UNAVAILABLE, EXIT_USAGE

LOADED = "import sys\n{run}\nprint(sorted(m for m in sys.modules if m.startswith('idem_dialects.cli.commands.')" \
         " or m in ('pytest', 'idem_dialects.cli.bench', 'idem_dialects.engines')))\n"


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
