"""Sphinx configuration: Markdown pages (MyST), the furo theme, the API reference from docstrings (autodoc) and the
CLI reference from the argparse parsers (sphinx-argparse). Built by the test command with warnings as errors."""

from __future__ import annotations

import sys
from importlib.metadata import version as _version
from pathlib import Path

project = "idem-dialects"
author = "the idem-dialects authors"
copyright = "2026, the idem-dialects authors"
release = _version("idem-dialects")
version = ".".join(release.split(".")[:2])

# `python -m sphinx` puts the working directory first on sys.path: run from the repository root, the source tree's
# idem_dialects/ (without engines/ and conformance/, which installing maps into the package) would shadow the installed
# package. The pages document the installed one (an editable install finds the source through its own finder).
_root = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _root]
sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.intersphinx",
    "sphinx.ext.napoleon",
    "sphinxarg.ext",
    "parameters",  # every parameter of the API reference described (after napoleon: it reads its :param: fields)
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_ext", "conftest.py", "README.md"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3  # [text](page.md#a-heading) links are checked like any other reference

html_theme = "furo"
html_title = "idem-dialects"

autodoc_member_order = "bysource"
autodoc_typehints = "description"
# Defaults as the source writes them (`payload=NO_PAYLOAD`), not the repr of a sentinel object.
autodoc_preserve_defaults = True
# The broker clients are imported by their adapter modules only; the site is built without them (.readthedocs.yaml
# installs the docs and the frameworks' extras, not the brokers'), so autodoc imports the adapters against stand-ins.
autodoc_mock_imports = ["aio_pika", "nats", "redis", "celery", "kombu"]
# No default `members`: Sphinx lets a boolean default override a directive's own `:members: a, b` list, so each
# directive says which members it documents.
autodoc_default_options = {"show-inheritance": True}
# No network while building: intersphinx inventories are not fetched, so references to Python or SQLAlchemy objects
# in signatures stay plain text instead of failing the build.
intersphinx_mapping: dict[str, tuple[str, str | None]] = {}
