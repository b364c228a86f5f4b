"""The bug zoo (tests/zoo): every kind of real trainer bug, planted in each clean log where the data can show
it (a synthetic log, SmolLM2's and the tiny model's fixtures), is found by its finding (or file rule) with
evidence naming the right column; the clean logs it is planted in make no finding; the docs list every kind
with its citation."""

from __future__ import annotations

import numpy as np
import pytest

from evaluator.problems import SEVERITY
from tests.test_findings import found
from tests.zoo.bases import base
from tests.zoo.edits import col
from tests.zoo.kind import Kind
from tests.zoo.kinds_bookkeeping import KINDS as BOOKKEEPING
from tests.zoo.kinds_logp import KINDS as LOGP
from tests.zoo.kinds_mask_advantage import KINDS as MASK_ADVANTAGE

KINDS: tuple[Kind, ...] = LOGP + BOOKKEEPING + MASK_ADVANTAGE
CASES = [(kind, name) for kind in KINDS for name in kind.bases]


def _id(case) -> str:
    kind, name = case
    return f"{kind.rule}-{name}-{KINDS.index(kind)}"


def test_the_zoo_has_40_kinds_each_with_a_citation():
    assert len({k.name for k in KINDS}) == len(KINDS) >= 40
    for kind in KINDS:
        assert "#" in kind.citation or "@" in kind.citation, kind.name
        assert any(b != "synthetic" for b in kind.bases) or kind.why_not, kind.name


BASES = sorted({(name, kind.epochs) for kind in KINDS for name in kind.bases})


@pytest.mark.parametrize("name, epochs", BASES)
def test_the_clean_bases_make_no_finding(tmp_path, name, epochs):
    validation = found(base(name, epochs), tmp_path, files=2)
    assert validation.findings == [] and all(r.ok for r in validation.reports)


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_each_kind_is_found_with_evidence_naming_its_column(tmp_path, case):
    kind, name = case
    planted = kind.plant(base(name, kind.epochs))
    validation = found(planted, tmp_path, kind.max_staleness, files=2)
    if kind.rule not in SEVERITY:  # a rule of the file itself
        problems = [p for r in validation.reports for p in r.problems if p.rule == kind.rule]
        assert problems and all(p.column == kind.column for p in problems), _seen(validation)
        return
    findings = [f for f in validation.findings if f.rule == kind.rule]
    assert len(findings) == 1, _seen(validation)
    (finding,) = findings
    assert finding.column == kind.column and finding.severity == SEVERITY[kind.rule]
    assert finding.rows > 0 and finding.threshold and finding.advice
    seq_ids = set(col(planted, "seq_id").tolist())
    assert 1 <= len(finding.examples) <= 3
    assert all(e["seq_id"] in seq_ids and e["pos"] >= 0 for e in finding.examples)
    assert np.isfinite(finding.figure)
    if SEVERITY[kind.rule] == "error":  # a problem of the run's files (those that hold the signal)
        assert any(p.rule == kind.rule for r in validation.reports for p in r.problems)


def _seen(validation) -> str:
    rules = [(f.rule, f.column) for f in validation.findings]
    problems = [(p.rule, p.column) for r in validation.reports for p in r.problems]
    return f"findings {rules}, problems {problems}"


def test_the_docs_list_every_kind_with_its_citation(repo_root):
    text = (repo_root / "docs" / "validate.md").read_text()
    for kind in KINDS:
        first = kind.citation.split(";")[0].split(" (")[0].strip()
        assert first in text, (kind.name, first)
