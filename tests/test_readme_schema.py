"""The schema table of docs/token-log.md is the one generated from `schemas/token_log.py`."""

from __future__ import annotations

from schemas.token_log import markdown_table
from tests.conftest import REPO


def readme_schema_table() -> str:
    """The Markdown table under the heading of the token log page."""
    lines = (REPO / "docs" / "token-log.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# The token log"))
    first = next(i for i in range(start, len(lines)) if lines[i].startswith("| column |"))
    end = next((i for i in range(first, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[first:end])


def test_readme_schema_table_matches_the_code():
    assert readme_schema_table() == markdown_table()


def test_every_column_is_in_the_table():
    from schemas.token_log import COLUMNS

    table = readme_schema_table()
    assert all(f"| `{c.name}` |" in table for c in COLUMNS)
