"""Bad dumps (the trainers' own, fixtures/importers/, broken in a copy): each gives a clear error naming the
file and the line, sample or key, never a traceback; the broken file leaves no log behind and the other
files of the call are imported."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from evaluator.cli import cli


def _cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _edit_line(number: int, edit: Callable[[dict], object]) -> Callable[[Path], None]:
    def apply(path: Path) -> None:
        lines = path.read_text().splitlines()
        lines[number - 1] = json.dumps(edit(json.loads(lines[number - 1])))
        path.write_text("\n".join(lines) + "\n")

    return apply


def _edit_pt(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(path: Path) -> None:
        data = torch.load(path, weights_only=True)
        edit(data)
        torch.save(data, path)

    return apply


def _set(record: dict, **values) -> dict:
    return record | values


def _text_token(record: dict) -> dict:
    record["token_ids"][0][3] = "a"
    return record


NEMO, PRIME, SLIME = "nemo-rl", "prime-rl", "slime/sync"
CASES = {  # case -> (format, fixture folder, file broken, how, what the message says)
    "nemo-rl truncated": (NEMO, NEMO, "train_data_step1.jsonl", _cut, "not JSON"),
    "nemo-rl text": (
        NEMO, NEMO, "train_data_step2.jsonl", _edit_line(2, _text_token),
        "line 2: token_ids is not a flat list"
    ),
    "nemo-rl two rewards": (
        NEMO, NEMO, "train_data_step1.jsonl", _edit_line(3, lambda r: _set(r, rewards=[1.0, 2.0])),
        "line 3: rewards is not a one-element",
    ),
    "nemo-rl binary": (
        NEMO, NEMO, "train_data_step2.jsonl", lambda p: p.write_bytes(b"\xff\xfe\x00garbage"),
        "not a text file"
    ),
    "nemo-rl beyond": (
        NEMO, NEMO, "train_data_step1.jsonl", _edit_line(1, lambda r: _set(r, input_lengths=[99])),
        "line 1: input_lengths 99 beyond",
    ),
    "prime-rl lengths": (
        PRIME, PRIME, "token_exports/step_1/rank_0.jsonl",
        _edit_line(2, lambda r: _set(r, trainer_logprobs=r["trainer_logprobs"][1:])),
        "line 2: per-token arrays are not lists of one length",
    ),
    "prime-rl array": (
        PRIME, PRIME, "token_exports/step_2/rank_1.jsonl", _edit_line(1, lambda r: [r]),
        "line 1: a JSON list, not an object",
    ),
    "prime-rl step": (
        PRIME, PRIME, "token_exports/step_2/rank_0.jsonl", _edit_line(1, lambda r: _set(r, step="two")),
        "line 1: step is 'two', not a number",
    ),
    "slime truncated train": ("slime", SLIME, "train_data/1.pt", _cut, "truncated or corrupt"),
    "slime truncated rollout": (
        "slime", SLIME, "rollout_data/0.pt", _cut, "rollout_data/0.pt: cannot be read"
    ),
    "slime missing": (
        "slime", SLIME, "train_data/0.pt", _edit_pt(lambda d: d["samples"][2].pop("log_probs")),
        "sample 2: missing log_probs",
    ),
    "slime tokens": (
        "slime", SLIME, "train_data/1.pt", _edit_pt(lambda d: d["samples"][1].update(tokens="abc")),
        "sample 1: tokens is not a flat",
    ),
    "slime versions": (
        "slime", SLIME, "rollout_data/1.pt",
        _edit_pt(lambda d: d["samples"][3].update(weight_versions=["v7"])),
        "sample 3: weight_versions",
    ),
    "slime length": (
        "slime", SLIME, "train_data/0.pt", _edit_pt(lambda d: d["samples"][0].update(response_lengths=2)),
        "not response_lengths 2",
    ),
    "miles context parallel": (
        "slime", "miles", "train_data/1_0.pt", _edit_pt(lambda d: d.update(cp_size=2)),
        "context-parallel rank (cp_size 2)",
    ),
    "skyrl truncated": (
        "skyrl", "skyrl", "dumped_data/global_step_2_training_input.pkl", _cut,
        "not SkyRL's TrainingInputBatch"
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_dump_is_named_and_fails_alone(repo_root, tmp_path, case):
    fmt, folder, broken, how, says = CASES[case]
    dump = tmp_path / "dump"
    ignore = shutil.ignore_patterns("*.py", "force_on_policy")
    shutil.copytree(repo_root / "fixtures" / "importers" / folder, dump, ignore=ignore)
    how(dump / broken)
    out = tmp_path / "logs"
    extra = ["--trust-pickle"] if fmt == "skyrl" else []
    result = CliRunner().invoke(cli, ["import", fmt, str(dump), "--out", str(out), "--run-id", "bad", *extra])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    (line,) = [line for line in result.output.splitlines() if ": failed: " in line]
    assert str(dump) in line and says in line, line
    assert not list(out.glob(".*.tmp"))
    done, total = map(int, re.search(r"(\d+) of (\d+) files imported", result.output).groups())
    assert done == total - 1 == len(list(out.glob("*.parquet"))) > 0
