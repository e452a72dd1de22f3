"""The documentation site builds with warnings as errors (broken internal links and references included, and every
parameter of the API reference described: docs/_ext/parameters.py), the API reference holds every public name, the
command reference every option of every subcommand, and the built pages render in headless Chromium; the
screenshots are kept in docs/screenshots/. The site is built once per run, as it is published: the `site` fixture
(tests/conftest.py) builds it with README's docs command, from the repository root, in a fresh venv with the wheel
and exactly the extras .readthedocs.yaml names. The examples inside the pages run as tests of their own
(docs/conftest.py, tests/test_examples.py)."""

from __future__ import annotations

import html
import importlib
import json
import re
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest
from wheel_common import Built, publishing_venv, venv_env

# The site is the session's publishing build (tests/conftest.py): a wheel and a venv installed from the index.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SHOTS = {"index.html": "site-index.png", "engines/postgresql.html": "site-engine-postgresql.png"}
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--host-resolver-rules=MAP * ~NOTFOUND", "--hide-scrollbars", "--window-size=1280,1400"]


# The modules whose `__all__` is the public API: the package, the HTTP layer and Django, and the integrations.
PUBLIC_MODULES = ("idem_dialects", "idem_dialects.http", "idem_dialects.http.wsgi", "idem_dialects.http.asgi",
                  "idem_dialects.http.flask", "idem_dialects.http.fastapi", "idem_dialects.django",
                  "idem_dialects.consumers", "idem_dialects.consumers.rabbitmq", "idem_dialects.consumers.nats",
                  "idem_dialects.consumers.redis", "idem_dialects.consumers.celery")


def inventory(site: Path) -> set[str]:
    """The Python object names in the site's objects.inv (Sphinx's format: four header lines, then zlib)."""
    raw = (site / "objects.inv").read_bytes()
    header_end = 0
    for _ in range(4):
        header_end = raw.index(b"\n", header_end) + 1
    lines = zlib.decompress(raw[header_end:]).decode("utf-8").splitlines()
    return {line.split(" ", 1)[0] for line in lines if re.match(r"\S+ py:\w+ ", line)}


def public_names(modules: tuple[str, ...]) -> list[str]:
    return [f"{module}.{name}" for module in modules for name in importlib.import_module(module).__all__]


def test_docs_build_without_warnings(site: Path) -> None:
    config = (ROOT / ".readthedocs.yaml").read_text(encoding="utf-8")
    assert re.search(r"^\s*fail_on_warning:\s*true\s*$", config, re.M), "the published build must fail on warnings"
    for page in ("index.html", "reference/api.html", "reference/cli.html", *SHOTS):
        assert (site / page).is_file(), page


def test_api_reference_documents_every_public_name(site: Path) -> None:
    pytest.importorskip("django", reason="the [django] extra is not installed")
    documented = inventory(site)
    missing = [name for name in public_names(PUBLIC_MODULES) if name not in documented]
    assert missing == [], f"not in the API reference (docs/reference/api.md): {missing}"


# Every subcommand's options as the installed package's parser has them: {command: [option, ...]}.
OPTIONS_PROBE = """
import argparse, json
from idem_dialects.cli import COMMANDS, reference_parser
subparsers = next(a for a in reference_parser()._actions if isinstance(a, argparse._SubParsersAction))
assert set(subparsers.choices) == set(COMMANDS), (sorted(subparsers.choices), sorted(COMMANDS))
print(json.dumps({name: [o for a in parser._actions for o in a.option_strings if o not in ("-h", "--help")]
                  for name, parser in subparsers.choices.items()}))
"""


def test_command_reference_lists_every_option_of_every_subcommand(site: Path, built: Built) -> None:
    """Every subcommand of the install the site was built with (the wheel and the publishing extras: a command of
    another distribution, such as tools/bench's, is not in it), with every option."""
    home = publishing_venv(built)
    done = subprocess.run([str(home / "bin" / "python"), "-c", OPTIONS_PROBE], cwd=built.workdir, env=venv_env(home),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    page = html.unescape(re.sub(r"<[^>]+>", "", (site / "reference" / "cli.html").read_text(encoding="utf-8")))
    missing = []
    for name, options in json.loads(done.stdout).items():
        assert f"idem-dialects {name}" in page, name
        missing += [f"{name} {option}" for option in options if option not in page]
    assert missing == [], f"options missing from the command reference: {missing}"


def test_built_pages_render_in_headless_chromium(site: Path, tmp_path: Path) -> None:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium): cannot render the site")
    (DOCS / "screenshots").mkdir(exist_ok=True)
    for page, name in SHOTS.items():
        shot = tmp_path / name
        done = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / ('profile-' + name)}",
                               f"--screenshot={shot}", (site / page).as_uri()],
                              capture_output=True, text=True, timeout=120)
        png = shot.read_bytes() if shot.exists() else b""
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000, done.stderr[-2000:]  # not a blank page
        shutil.copyfile(shot, DOCS / "screenshots" / name)
