"""Sphinx configuration: Markdown pages (MyST), the furo theme, the API reference from docstrings (autodoc) and the
CLI reference from the argparse parsers (sphinx-argparse). Built by the test command with warnings as errors."""

from __future__ import annotations

from importlib.metadata import version as _version

project = "idem-dialects"
author = "the idem-dialects authors"
copyright = "2026, the idem-dialects authors"
release = _version("idem-dialects")
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.intersphinx",
    "sphinx.ext.napoleon",
    "sphinxarg.ext",
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "conftest.py", "README.md"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3  # [text](page.md#a-heading) links are checked like any other reference

html_theme = "furo"
html_title = "idem-dialects"

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
# No network while building: intersphinx inventories are not fetched, so references to Python or SQLAlchemy objects
# in signatures stay plain text instead of failing the build.
intersphinx_mapping: dict[str, tuple[str, str | None]] = {}
