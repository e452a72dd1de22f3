"""examples/django_postgres as its README shows it: set up with the README's commands, served by gunicorn -w 4 on
PostgreSQL, driven with the README's curl commands; the answers are the ones the README promises."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django_common import gunicorn

from idem_dialects.engines import Unavailable, get

pytest.importorskip("django", reason="the [django] extra is not installed")
pytest.importorskip("rest_framework", reason="djangorestframework (the [dev] extra) is not installed")
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "django_postgres"
README = (EXAMPLE / "README.md").read_text()


def block(name: str) -> list[str]:
    """The commands of the README's marked bash block: comments dropped, continued lines joined."""
    found = re.search(rf"<!-- {name} -->\s*```bash\n(.*?)```\s*<!-- /{name} -->", README, re.S)
    assert found, f"README has no <!-- {name} --> block"
    text = found.group(1).replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def sh(command: str, env: dict[str, str]) -> str:
    done = subprocess.run(["bash", "-c", command], cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_example_under_gunicorn_4_workers_driven_with_the_readme_curls(tmp_path: Path) -> None:
    try:
        url = get("postgresql").provide().url
    except Unavailable as exc:
        pytest.skip(f"postgresql: {exc}")
    database = f"idem_example_{secrets.token_hex(4)}"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PGHOST": url.host or "",
           "PGPORT": str(url.port or 5432), "PGUSER": url.username or "", "PGPASSWORD": url.password or "",
           "PGDATABASE": database}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    setup = block("setup")
    serve = [line for line in setup if line.startswith("gunicorn ")]
    assert len(serve) == 1 and " -w 4 " in serve[0]
    try:
        for command in setup:
            # Already here: the checkout, the installed package; the database's name is this test's own.
            if command.startswith(("cd ", "pip ", "export ", "gunicorn ")):
                continue
            sh(command, env)
        app, options = serve[0].split()[1], serve[0].split()[2:]
        assert options == ["-w", "4", "-b", "127.0.0.1:8000"]
        with gunicorn(app, EXAMPLE, env, workers=4, log=tmp_path / "gunicorn.log") as base:
            answers = [sh(c.replace("http://127.0.0.1:8000", base), env) for c in block("curl")]
    finally:
        subprocess.run(["dropdb", "--if-exists", "--force", database], env=env, capture_output=True, timeout=60)
    first, replay, mismatch, listing = answers
    assert first.startswith("HTTP/1.1 201 Created") and "idempotent-replayed" not in first.lower()
    assert replay.startswith("HTTP/1.1 201 Created") and "\nIdempotent-Replayed: true" in replay
    assert first.split("\n\n", 1)[1] == replay.split("\n\n", 1)[1]  # the same body
    assert mismatch.startswith("HTTP/1.1 422") and "application/problem+json" in mismatch
    assert json.loads(mismatch.split("\n\n", 1)[1])["type"] == "https://idem-dialects.readthedocs.io/en/latest/http.html#request-mismatch"
    payments = json.loads(listing)
    assert len(payments) == 1 and payments[0]["amount"] == 250
