"""The pages a user reads send them only to what the repository holds: `docs/metrics.md` is the reference,
never `DOMAIN.md` (the developers' shared contract, not shipped): not in the README, `docs/`, the fixtures'
page, the thresholds file a user copies, nor any text the dashboard shows (its code's docstrings and
comments may name it). Relative links of the pages lead to files that exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "fixtures" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
OUTSIDE = re.compile(r"DOMAIN\.md|shared docs")


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring nodes of a module, its classes and functions."""
    holders = [n for n in ast.walk(tree) if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef)]
    return {
        id(h.body[0].value)
        for h in holders
        if h.body and isinstance(h.body[0], ast.Expr) and isinstance(h.body[0].value, ast.Constant)
    }


def shown_strings(path: Path) -> list[str]:
    """Every string literal of a module that is not a docstring: what it can show."""
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree)
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip
    ]


@pytest.mark.parametrize(
    "page", [*PAGES, REPO / "schemas" / "default_thresholds.toml"], ids=lambda p: str(p.relative_to(REPO))
)
def test_pages_never_send_a_reader_outside_the_repository(page):
    lines = [
        f"{i}: {line}" for i, line in enumerate(page.read_text().splitlines(), 1) if OUTSIDE.search(line)
    ]
    assert not lines, f"{page.relative_to(REPO)} points outside the repository:\n" + "\n".join(lines)


def test_the_dashboard_shows_no_pointer_outside_the_repository():
    found = [
        f"{path.relative_to(REPO)}: {text!r}"
        for path in sorted((REPO / "dashboard").rglob("*.py"))
        for text in shown_strings(path)
        if OUTSIDE.search(text)
    ]
    assert not found, "\n".join(found)


def test_relative_links_of_the_pages_lead_to_files_that_exist():
    broken = [
        f"{page.relative_to(REPO)}: {target}"
        for page in PAGES
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
        if "://" not in target and not (page.parent / target).exists()
    ]
    assert not broken, "\n".join(broken)
