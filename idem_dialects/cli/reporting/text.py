"""Plain-text and markdown building blocks shared by every renderer: tables, headings, wrapped notes."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

WIDTH = 120  # a terminal report never grows wider than this


def heading(title: str, markdown: bool) -> str:
    return f"## {title}" if markdown else f"{title}\n{'=' * len(title)}"


def show(value: Any) -> str:
    """An observed value as short text: dicts as k=v, lists comma-separated, None as a dash."""
    if value is None:
        return "—"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "none"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return str(value)


def wrap(text: str, indent: str = "", first: str | None = None, width: int = WIDTH) -> list[str]:
    """`text` wrapped to `width`, continuation lines indented by `indent` (the first by `first`)."""
    return textwrap.wrap(text, width=width, initial_indent=indent if first is None else first,
                         subsequent_indent=indent, break_long_words=True, break_on_hyphens=False) or [""]


def table(header: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool) -> list[str]:
    """A table: GitHub markdown, or columns padded to their widest cell (trailing blanks trimmed)."""
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        return lines + ["| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in row) + " |"
                        for row in rows]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return [line(header), line(["-" * w for w in widths])] + [line(r) for r in rows]


def keyed_lines(rows: Sequence[tuple[str, str]], width: int = WIDTH) -> list[str]:
    """`key  value` lines with the keys aligned; a value that does not fit wraps under itself."""
    if not rows:
        return []
    pad = max(len(k) for k, _ in rows) + 2
    if pad > width // 2:  # keys too long to align against: value on its own indented lines
        out: list[str] = []
        for key, value in rows:
            out += [key, *wrap(value, "    ", width=width)]
        return out
    out = []
    for key, value in rows:
        out += wrap(value, " " * pad, first=key.ljust(pad), width=width)
    return out
