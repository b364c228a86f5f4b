"""Plain text for the terminal and text reports: the one column aligner of `validate`, `summary` and
`gate`, and `printable`, which escapes control characters that a value from the data may carry."""

from __future__ import annotations

from collections.abc import Container, Sequence

_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F)} | {ord("\n"): "\\n", ord("\t"): "\\t"}


def printable(text: str, keep_lines: bool = False) -> str:
    """`text` with control characters (an escape sequence a run_id smuggles to the terminal, a byte XML
    cannot hold) written as `\\xNN`; with `keep_lines`, newlines and tabs stay."""
    table = {k: v for k, v in _CONTROL.items() if not keep_lines or k not in (ord("\n"), ord("\t"))}
    return text.translate(table)


def column_widths(rows: Sequence[Sequence[str]]) -> list[int]:
    """The width of each column: its longest cell."""
    return [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]


def aligned_lines(rows: Sequence[Sequence[str]], right: Container[int] = ()) -> list[str]:
    """Each row as one line: cells padded to their column's width (right-aligned for the column
    indices in `right`, else left), two spaces apart, trailing spaces dropped."""
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = column_widths(rows)
    return [
        "  ".join(
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
