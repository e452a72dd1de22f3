"""The documentation site builds with warnings as errors (broken internal links and references included), and the
built pages render in headless Chromium; the screenshots are kept in docs/screenshots/. The examples inside the
pages run as tests of their own (docs/conftest.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
SHOTS = {"index.html": "site-index.png", "engines/postgresql.html": "site-engine-postgresql.png"}
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--host-resolver-rules=MAP * ~NOTFOUND", "--hide-scrollbars", "--window-size=1280,1400"]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("sphinx", reason="the docs extra is not installed (pip install 'idem-dialects[docs]')")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS),
                           str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_docs_build_without_warnings(site: Path) -> None:
    for page in ("index.html", "reference/api.html", "reference/cli.html", *SHOTS):
        assert (site / page).is_file(), page


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
