"""The tables of benchmarks/RESULTS.md, read for the docs' charts (docs_tools/figures.py).

RESULTS.md is the one record of the figures (people edit it by hand after each run), so the charts read it
rather than a copy that could drift. A table is found by its section heading and the bold caption that opens
the paragraph before it, and its columns by their header cells; whatever is missing raises
``ResultsFormatError`` naming the table, so a change of the page's layout fails the docs build (and
tests/test_docs_results.py) instead of drawing a wrong chart.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "RESULTS.md"


class ResultsFormatError(ValueError):
    pass


@dataclass
class Table:
    section: str  # the headings above it, "## Models on the GPU / ### NVIDIA H200"
    caption: str  # the bold words opening the paragraph before it ("" if none)
    intro: str  # that paragraph, or the section's text before the table
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)
    section_text: str = ""  # the text under the nearest heading, up to the table (its date, commit, device)

    def column(self, name: str) -> int:
        for i, h in enumerate(self.header):
            if _plain(h) == name:
                return i
        raise ResultsFormatError(f"table {self.caption or self.section!r}: no column {name!r} "
                                 f"(columns: {[_plain(h) for h in self.header]})")

    def records(self) -> list[dict[str, str]]:
        return [dict(zip((_plain(h) for h in self.header), row)) for row in self.rows]


def _plain(cell: str) -> str:
    """A cell's text without markdown emphasis, code ticks or the † mark."""
    return re.sub(r"[*`†]", "", cell).strip()


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def tables(text: str | None = None) -> list[Table]:
    text = RESULTS.read_text(encoding="utf-8") if text is None else text
    out, headings, para, blank, under = [], {}, [], False, []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^(#{2,6})\s+(.*)", line)
        if m:
            level = len(m.group(1))
            headings = {k: v for k, v in headings.items() if k < level}
            headings[level] = m.group(2).strip()
            para, under, i = [], [], i + 1
            continue
        if line.startswith("|") and i + 1 < len(lines) and re.match(r"^\|[\s:|-]+\|?\s*$", lines[i + 1]):
            intro = " ".join(para)
            cap = re.match(r"^\*\*(.+?)\*\*", intro)
            t = Table(" / ".join(headings[k] for k in sorted(headings)), cap.group(1) if cap else "", intro,
                      _cells(line), section_text=" ".join(under))
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                t.rows.append(_cells(lines[i]))
                i += 1
            out.append(t)
            para = []
            continue
        if line.strip():
            para = ([] if blank else para) + [line.strip()]
            under.append(line.strip())  # the paragraph just before a table is its intro
        blank = not line.strip()
        i += 1
    return out


def find(tabs: list[Table], *, section: str, caption: str | None = None, columns=()) -> Table:
    """The table under a heading containing ``section`` whose caption starts with ``caption`` (None: any) and
    whose header has every name in ``columns``."""
    for t in tabs:
        if section in t.section and (caption is None or t.caption.startswith(caption)):
            for c in columns:
                t.column(c)
            return t
    raise ResultsFormatError(f"{RESULTS.name}: no table under a heading with {section!r}"
                             + (f" captioned {caption!r}" if caption else ""))


def numbers(cell: str) -> list[float]:
    """The numbers of a cell in order: "**38.3 / 10.3**" -> [38.3, 10.3]; "42 ms (1.25 ×)" -> [42, 1.25];
    an empty cell -> []."""
    return [float(v) for v in re.findall(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e-?\d+)?", _plain(cell))]


def pair(cell: str) -> tuple[float, float] | None:
    """A "forward / backward" or "step / inference" cell; None where the cell is empty."""
    v = numbers(cell)
    if not v:
        return None
    if len(v) != 2:
        raise ResultsFormatError(f"expected two numbers 'a / b' in the cell {cell!r}")
    return v[0], v[1]


def commit_of(text: str) -> str | None:
    m = re.search(r"commit ([0-9a-f]{7,40})", text)
    return m.group(1) if m else None
