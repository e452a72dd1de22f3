"""Plain-text and markdown building blocks shared by every renderer: tables, headings, wrapped notes."""

from __future__ import annotations

import re
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


def _name_lines(name: str, width: int) -> list[str]:
    """`name` broken after its hyphens into lines of at most `width` (a part longer than that stays whole)."""
    lines: list[str] = []
    for part in re.findall(r"[^-]+-?|-", name):
        if lines and len(lines[-1]) + len(part) <= width:
            lines[-1] += part
        else:
            lines.append(part)
    return lines or [""]


def stacked_table(label: str, columns: Sequence[str], rows: Sequence[Sequence[str]], width: int = WIDTH) -> list[str]:
    """A terminal table whose first column is `label` and whose other columns are headed by `columns` in full: a
    name wider than its column's cells is broken after its hyphens over several header lines (bottom-aligned), so
    every column keeps its real name. If it is still wider than `width`, the first column's values are shortened."""
    widths = [max([len(r[i + 1]) for r in rows] + [max(len(p) for p in re.findall(r"[^-]+-?|-", c) or [""])])
              for i, c in enumerate(columns)]
    heads = [_name_lines(c, w) for c, w in zip(columns, widths, strict=True)]
    depth = max((len(h) for h in heads), default=1)
    heads = [[""] * (depth - len(h)) + h for h in heads]
    labels = [r[0] for r in rows]
    room = width - sum(w + 2 for w in widths)
    cut = max(12, room)
    if max((len(x) for x in [label, *labels]), default=0) > cut:
        labels = [x[: cut - 1] + "…" if len(x) > cut else x for x in labels]
    first = max((len(x) for x in [label, *labels]), default=0)

    def line(cells: Sequence[str], pads: Sequence[int]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, pads, strict=True)).rstrip()

    pads = [first, *widths]
    out = [line([label if i == depth - 1 else "", *(h[i] for h in heads)], pads) for i in range(depth)]
    out.append(line(["-" * w for w in pads], pads))
    return out + [line([labels[i], *rows[i][1:]], pads) for i in range(len(rows))]
