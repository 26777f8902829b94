"""The ``deskbox ls`` table: every id whole, at any width.

An id is what a user copies out of the table, so it is never cut. The other columns give
way on a narrow terminal: the least useful are left out (BACKEND, then DISPLAY, then
CREATED), LABELS wraps inside its column (and goes too when under 12 columns are left);
if ID and STATE alone are wider than the terminal, the line runs on and the terminal wraps
it, the id still whole. No box lines
either: they cost three characters a column, and without them ``awk '{print $1}'`` and a
double-click select an id. Unbounded (``--wide``, or output to a pipe without
``COLUMNS``), every column is shown and nothing wraps.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from typing import IO

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["COLUMNS", "render_table", "terminal_width"]

COLUMNS = ("ID", "STATE", "BACKEND", "DISPLAY", "CREATED", "LABELS")
_LEFT_OUT_FIRST = ("BACKEND", "DISPLAY", "CREATED", "LABELS")
_GAP = 2
_LABELS_MIN = 12  # narrower than this, LABELS is better left out than wrapped a word a line


def terminal_width() -> int | None:
    """``COLUMNS``, else the terminal's width, else None: a pipe gets whole lines."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def _layout(rows: Sequence[Sequence[str]], width: int | None) -> tuple[list[int], int]:
    """The indexes of the columns shown, and the width to render them in."""
    natural = [max([cell_len(name), *(cell_len(row[i]) for row in rows)])
               for i, name in enumerate(COLUMNS)]
    shown = list(range(len(COLUMNS)))

    def needed(columns: list[int], labels_min: bool) -> int:
        widths = [min(natural[i], _LABELS_MIN) if labels_min and COLUMNS[i] == "LABELS"
                  else natural[i] for i in columns]
        return sum(widths) + _GAP * (len(widths) - 1)

    if width is None:
        return shown, needed(shown, labels_min=False)
    for name in _LEFT_OUT_FIRST:
        if needed(shown, labels_min=True) <= width:
            break
        shown.remove(COLUMNS.index(name))
    return shown, max(width, needed(shown, labels_min=True))


def render_table(file: IO[str], rows: Sequence[Sequence[str]], width: int | None) -> None:
    """Print ``rows`` (one string per column of ``COLUMNS``) for a terminal ``width`` wide."""
    shown, render_width = _layout(rows, width)
    table = Table(box=None, padding=(0, _GAP, 0, 0), pad_edge=False, show_edge=False)
    for i in shown:
        if COLUMNS[i] == "LABELS":
            table.add_column(COLUMNS[i], overflow="fold")
        else:
            table.add_column(COLUMNS[i], no_wrap=True, overflow="ignore")
    for row in rows:
        # Text, not str: a label like "[red]x" is data, not rich markup.
        table.add_row(*(Text(row[i]) for i in shown))
    # A console of its own: a shared one would clamp the width to the terminal's.
    Console(file=file, width=render_width, highlight=False, soft_wrap=True).print(table)
