"""The layout (docs/layout.md): imports point one way, down the stages of the data flow, and no module grows
past about 300 lines. A module may import its own stage and the stages below it, never one above it or
another stage of its own level."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("evaluator", "dashboard", "schemas")
# Each stage, bottom up, and the modules it holds (the longest matching prefix names a module's stage).
STAGES = {
    "schemas": (0, ("schemas",)),
    "base": (
        1,
        (
            "evaluator",
            "evaluator.errors",
            "evaluator.duck",
            "evaluator.problems",
            "evaluator.text_table",
            "evaluator.logio",
            "evaluator.sources",
            "evaluator.inputs",
        ),
    ),  # fmt: skip
    "formulas": (2, ("evaluator.formulas",)),
    "hook": (3, ("evaluator.hook",)),
    "importers": (3, ("evaluator.importers",)),
    "lossconfig": (3, ("evaluator.lossconfig",)),
    "trainer": (4, ("evaluator.trainer",)),
    "validate": (4, ("evaluator.validate",)),
    "store": (5, ("evaluator.store",)),
    "replay": (6, ("evaluator.replay",)),
    "gate": (7, ("evaluator.gate",)),
    "export": (7, ("evaluator.export",)),
    "verdict": (8, ("evaluator.verdict",)),
    "watch": (9, ("evaluator.watch",)),
    "dashboard": (10, ("dashboard",)),
    "apps": (11, ("evaluator.bench", "evaluator.demo")),
    "cli": (12, ("evaluator.cli",)),
}
PREFIXES = {prefix: name for name, (_, prefixes) in STAGES.items() for prefix in prefixes}
MAX_LINES = 330  # "under ~300": a module past this is split


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def stage(module: str) -> str:
    candidates = [p for p in PREFIXES if module == p or module.startswith(p + ".")]
    assert candidates, f"{module} belongs to no stage: add it to STAGES (and docs/layout.md)"
    return PREFIXES[max(candidates, key=len)]


def level(module: str) -> int:
    return STAGES[stage(module)][0]


def sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (REPO / package).rglob("*.py"))


def runtime_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of every import of ours that runs (in functions too; not under TYPE_CHECKING)."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for child in node.body for n in ast.walk(child)}
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:  # `from evaluator.validate import audit` imports a module
                sub = f"{node.module}.{alias.name}"
                is_module = (REPO / sub.replace(".", "/")).with_suffix(".py").is_file()
                found.append((node.lineno, sub if is_module else node.module))
    return [(line, m) for line, m in found if m.split(".")[0] in PACKAGES]


def test_every_import_points_down_the_stages():
    wrong = []
    for path in sources():
        here = stage(module_name(path))
        for line, target in runtime_imports(ast.parse(path.read_text())):
            there = stage(target)
            if there != here and STAGES[there][0] >= STAGES[here][0]:
                wrong.append(f"{path.relative_to(REPO)}:{line} ({here}, level {STAGES[here][0]}) imports "
                             f"{target} ({there}, level {STAGES[there][0]})")  # fmt: skip
    assert not wrong, "imports pointing up or sideways:\n" + "\n".join(wrong)


def test_an_import_pointing_up_is_caught(tmp_path):
    tree = ast.parse("def f():\n    from evaluator.replay import replay\n")
    (line, target), = runtime_imports(tree)  # fmt: skip
    assert level(target) > level("evaluator.validate.files")
    typed = ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from evaluator.cli import cli\n"
    )
    assert runtime_imports(typed) == []


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(REPO)))
def test_modules_stay_short(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(REPO)} has {lines} lines: split it by what it does"


def test_every_stage_says_what_it_owns_and_may_import():
    for package in sorted({p.parent for p in sources() if p.name == "__init__.py"}):
        if package.name in ("views",) or package == REPO / "evaluator":
            continue
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        assert "import" in doc.lower(), f"{package.relative_to(REPO)}/__init__.py must say what it may import"


def every_import(tree: ast.Module) -> set[str]:
    """The modules of ours a module imports anywhere: at the top, in functions, under TYPE_CHECKING."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if (REPO / sub.replace(".", "/")).with_suffix(".py").is_file() else node.module)
    return {m for m in found if m.split(".")[0] in PACKAGES}


def test_no_two_modules_import_each_other():
    """No circle of imports, not even one dodged by an import inside a function or under TYPE_CHECKING:
    what two modules share lives below both."""
    modules = {module_name(p): p for p in sources()}
    graph = {name: every_import(ast.parse(path.read_text())) & set(modules) for name, path in modules.items()}
    circles, order, low, stack, on_stack = [], {}, {}, [], set()

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        order[node] = low[node] = len(order)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in order:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], order[target])
        if low[node] == order[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                circles.append(sorted(component))

    for name in sorted(graph):
        if name not in order:
            visit(name)
    assert not circles, f"modules importing each other: {circles}"


def test_evaluator_keeps_at_most_ten_loose_modules():
    loose = sorted(p.name for p in (REPO / "evaluator").glob("*.py"))
    assert len(loose) <= 10, f"{len(loose)} loose modules under evaluator/ ({', '.join(loose)}): package them"
