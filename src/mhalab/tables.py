"""One table writer for every report: rows of cells to Markdown, HTML and CSV, each escaped for its format.

Text from run files (overrides, error messages) is untrusted: in Markdown, markup characters are escaped and HTML
is entity-encoded; in HTML everything is entity-encoded; a cell is one line of bounded length.
"""

from __future__ import annotations

import csv
import html
import math
from pathlib import Path
from typing import Any, NamedTuple, Sequence
from urllib.parse import quote

from mhalab.relative_path import relative

MAX_CELL = 300


def md_escape(text: Any) -> str:
    """Text for a Markdown table cell: markup characters escaped, one line, bounded length."""
    s = _one_line(text)
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")  # no HTML gets through
    return "".join("\\" + c if c in "\\|`*[]" else c for c in s)


def _one_line(text: Any) -> str:
    s = str(text).replace("\r", " ").replace("\n", " ")
    return s if len(s) <= MAX_CELL else s[:MAX_CELL - 3] + "..."


def fmt(x: Any, digits: int = 4) -> str:
    """A number for a table: 4 significant digits, thousands separated, '-' for none."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1e5 else f"{x:.3g}"
    if isinstance(x, int) and abs(x) >= 10000:
        return f"{x:,}"
    return str(x)


def fmt_p(p: float | None) -> str:
    return "-" if p is None else (f"{p:.2g}" if p >= 0.001 else f"{p:.1e}")


def interval(mean: float | None, lo: float | None, hi: float | None, digits: int = 3,
             unbounded: bool = False) -> str:
    """'mean [lo, hi]'; with `unbounded`, a missing end is the infinite one of an interval the design cannot close
    ('mean (-inf, hi]'); otherwise the mean alone when there is no interval."""
    if mean is None:
        return "-"
    if unbounded and (lo is None or hi is None):
        left = "(-inf" if lo is None else f"[{lo:.{digits}f}"
        right = "inf)" if hi is None else f"{hi:.{digits}f}]"
        return f"{mean:.{digits}f} {left}, {right}"
    if lo is None or hi is None:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


class Link(NamedTuple):
    """A cell that links to a file or folder: its text escaped as any cell's, its target a relative URL."""

    text: str
    target: Path
    base: Path = Path(".")  # the folder the table is read from: the link is relative to it

    @property
    def href(self) -> str:
        return quote(relative(self.target, self.base) + ("/" if Path(self.target).is_dir() else ""))


class Table:
    """A header and rows of already formatted cells (strings, or a Link); `bold` marks cells to emphasise."""

    def __init__(self, header: Sequence[str]):
        self.header = list(header)
        self.rows: list[list[str]] = []
        self.bold: set[tuple[int, int]] = set()

    def add(self, cells: Sequence[Any], bold: Sequence[int] = ()) -> None:
        if len(cells) != len(self.header):
            raise ValueError(f"a row of {len(cells)} cells for {len(self.header)} columns")
        self.rows.append([c if isinstance(c, Link) else str(c) for c in cells])
        self.bold |= {(len(self.rows) - 1, j) for j in bold}

    def markdown(self) -> str:
        def cell(i, j, c):
            c = f"[{md_escape(c.text)}]({c.href})" if isinstance(c, Link) else md_escape(c)
            return f"**{c}**" if (i, j) in self.bold and c not in ("", "-") else c

        lines = ["| " + " | ".join(md_escape(h) for h in self.header) + " |", "|" + "---|" * len(self.header)]
        lines += ["| " + " | ".join(cell(i, j, c) for j, c in enumerate(r)) + " |" for i, r in enumerate(self.rows)]
        return "\n".join(lines)

    def html(self) -> str:
        def cell(i, j, c):
            c = (f"<a href='{html.escape(c.href)}'>{html.escape(_one_line(c.text))}</a>" if isinstance(c, Link)
                 else html.escape(_one_line(c)))
            return f"<td><b>{c}</b></td>" if (i, j) in self.bold else f"<td>{c}</td>"

        head = "".join(f"<th>{html.escape(h)}</th>" for h in self.header)
        body = "".join("<tr>" + "".join(cell(i, j, c) for j, c in enumerate(r)) + "</tr>"
                       for i, r in enumerate(self.rows))
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def write_csv(path: Path, columns: Sequence[str], records: list[dict]) -> None:
    """Records as CSV with these columns (missing values empty); values are written unformatted."""
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        for r in records:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in columns})
