"""Plain-text tables for the terminal: the one column aligner of `validate`, `summary` and `gate`."""

from __future__ import annotations

from collections.abc import Container, Sequence


def column_widths(rows: Sequence[Sequence[str]]) -> list[int]:
    """The width of each column: its longest cell."""
    return [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]


def aligned_lines(rows: Sequence[Sequence[str]], right: Container[int] = ()) -> list[str]:
    """Each row as one line: cells padded to their column's width (right-aligned for the column
    indices in `right`, else left), two spaces apart, trailing spaces dropped."""
    widths = column_widths(rows)
    return [
        "  ".join(
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
