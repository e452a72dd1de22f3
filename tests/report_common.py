"""Reading the matrix's terminal table back: its grid's columns, whose engine names may be stacked over several
header lines (broken after their hyphens)."""

from __future__ import annotations

import re


def grid_columns(text: str) -> list[str]:
    """The grid's column names, read through the header lines above its rule of dashes, column by column."""
    lines = text.splitlines()
    rule = next(i for i, line in enumerate(lines)
                if line.startswith("-") and not line.replace("-", "").strip() and "check" in lines[i - 1])
    spans = [m.span() for m in re.finditer(r"-+", lines[rule])]
    top = rule
    while top > 0 and lines[top - 1].strip():
        top -= 1
    header = lines[top:rule]
    return ["".join(line[start:end].strip() if len(spans) - 1 != n else line[start:].strip() for line in header)
            for n, (start, end) in enumerate(spans)]
