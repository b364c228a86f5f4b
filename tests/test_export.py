"""`proxaudit export`: the store's per-step series written to TensorBoard event files and W&B offline
runs, read back with each tool's own reader (TensorBoard's event accumulator; the W&B transaction log),
equal to DOMAIN.md's figures computed in numpy over the token logs the store was made from."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

from evaluator.cli import cli
from tests.conftest import FIXTURES
from tests.reference import decision_figures, reference_values

BLOCK = 32768  # the W&B transaction log: LevelDB's log format, 32 KiB blocks, 7-byte record headers


def expected_series(run: str) -> dict[tuple[str, int], float]:
    """{(tag, step): value} of `run` in the fixture store (its first 3 files, conftest.fixture_store), from
    numpy over the logs (tests/reference.py): each method and metric's per-step mean and max, and each
    estimator's per-step gradient mass error where the step's true gradient mass is not 0."""
    values = reference_values(sorted(FIXTURES.glob(f"{run}-*.parquet"))[:3])
    stats = values.groupby(["method", "metric", "step"])["value"].agg(["mean", "max"])
    out = {(f"{m}/{k}/avg", s): row["mean"] for (m, k, s), row in stats.iterrows()}
    out |= {(f"{m}/{k}/max", s): row["max"] for (m, k, s), row in stats.iterrows()}
    gme = decision_figures(values, ["step"])["gradient_mass_error"].dropna()
    return out | {(f"{m}/decision/gradient_mass_error", s): v for (s, m), v in gme.items()}


def test_tensorboard_event_files_hold_the_store(fixture_store, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    result = CliRunner().invoke(
        cli, ["export", "--db", str(fixture_store), "--to", "tensorboard", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loglinear", "recompute"]
    events = EventAccumulator(str(tmp_path / "recompute"), size_guidance={"tensors": 0}).Reload()
    expected = expected_series("recompute")
    tags = (
        "loglinear/abs_error/avg",
        "loglinear_shipped/abs_error/max",
        "ground_truth/drift/avg",
        "loglinear/decision/gradient_mass_error",
        "rollout/decision/gradient_mass_error",
    )
    for tag in tags:  # every step of the tag, and only those, with its value (TensorBoard keeps float32)
        exported = {e.step: float(make_ndarray(e.tensor_proto)) for e in events.Tensors(tag)}
        wanted = {step: v for (name, step), v in expected.items() if name == tag}
        assert sorted(exported) == sorted(wanted), tag
        for step, value in exported.items():
            assert value == pytest.approx(wanted[step], rel=1e-6, abs=1e-7), (tag, step)
    assert len(wanted) > 25  # the gradient mass error of most of the 30 steps (none where the mass is 0)


def _wandb_records(path: Path):
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, chunks = 7, []
    while pos + 7 <= len(data):
        room = BLOCK - pos % BLOCK
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7]) if room >= 7 else (0, 0, 0)
        if kind == 0:  # the rest of a block is padding
            pos += room
            continue
        chunks.append(data[pos + 7 : pos + 7 + length])
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(chunks))
            chunks = []
            yield record


def test_wandb_offline_run_holds_the_store(fixture_store, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    args = ["export", "--db", str(fixture_store), "--to", "wandb", str(tmp_path), "--run", "loglinear"]
    result = CliRunner().invoke(cli, [*args, "--project", "audit"])
    assert result.exit_code == 0, result.output
    (log,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    expected = expected_series("loglinear")
    steps, checked = set(), 0
    for record in _wandb_records(log):
        if record.WhichOneof("record_type") == "run":
            assert (record.run.display_name, record.run.project) == ("loglinear", "audit")
        if record.WhichOneof("record_type") != "history":
            continue
        items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
        steps.add(items["_step"])
        for tag in ("loglinear/abs_error/avg", "linear_exact/behave_imp_weight/max"):
            if tag in items:
                assert items[tag] == pytest.approx(expected[(tag, items["_step"])], rel=1e-9, abs=1e-12)
                checked += 1
    assert len(steps) == 30 and checked == 15 + 30  # abs_error on the even steps (prox recomputed there)


def test_nothing_to_export_is_a_usage_error(fixture_store, tmp_path):
    args = ["export", "--db", str(fixture_store), "--to", "tensorboard", str(tmp_path), "--run", "nope"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and "no run nope" in result.output


def test_a_run_id_never_names_a_folder_outside_the_export(tmp_path):
    """A run_id is data (a token log's, a store's): `../../x`, an absolute path, `.`, the empty string
    or a control character become percent-encoded folder names under the export folder, and the lines
    printed spell control characters out."""
    from evaluator.export import run_folder
    from evaluator.logio import write_log_atomic
    from evaluator.replay.pipeline import replay
    from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps

    runs = ["../../escaped", str(tmp_path / "absolute"), ".", "", "red\x1b[31m", "plain-run.v2"]
    for i, run_id in enumerate(runs):
        log = synthetic_steps(SyntheticSpec(run_id=run_id, tokens_per_step=256, mean_length=16), 4, 2)
        write_log_atomic(log, tmp_path / "logs" / f"{i}.parquet")
    replay([tmp_path / "logs"], tmp_path / "m", progress=False)
    out = tmp_path / "deep" / "tb"
    result = CliRunner().invoke(cli, ["export", "--db", str(tmp_path / "m"), "--to", "tensorboard", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == sorted(run_folder(r) for r in runs)
    assert {"%2E.%2F..%2Fescaped", "%2E", "%", "red%1B%5B31m", "plain-run.v2"} <= {
        p.name for p in out.iterdir()
    }
    assert [p for p in tmp_path.rglob("*") if p.name in ("escaped", "absolute")] == []
    assert all(p.parent.parent == out for p in out.rglob("events.out.tfevents.*"))
    assert "\x1b" not in result.output
