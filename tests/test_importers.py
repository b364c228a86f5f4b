"""Importers (evaluator/importers/): dumps built as NeMo-RL and prime-rl write them convert to the same
rows they were built from, validate clean, and a dump whose behaviour log-probs sit one position off is
caught by the alignment audit after import."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from evaluator.cli import cli
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps
from evaluator.validate import validate_paths
from schemas.token_log import ASSUMED_ON_POLICY, RECORDED, VERSIONS_KEY
from tests.dumps import nemo_rl_dump, prime_rl_dump, skyrl_dump, slime_dump

# On-policy (staleness 0), one minibatch, no proximal_t: what these dumps can hold.
SPEC = SyntheticSpec(run_id="dump", tokens_per_step=2048, mean_length=24, max_staleness=0, n_minibatches=1,
                     with_proximal_t=False)  # fmt: skip
DUMPS = {"nemo-rl": nemo_rl_dump, "prime-rl": prime_rl_dump, "slime": slime_dump, "skyrl": skyrl_dump}
COMPARED = ["step", "pos", "token_id", "loss_mask", "behave_logp", "behave_version", "prox_logp", "advantage"]


@pytest.fixture(scope="module")
def table() -> pa.Table:
    return synthetic_steps(SPEC, 3, 4)


def _import(fmt: str, source, out, *extra: str):
    extra = (*extra, "--trust-pickle") if fmt == "skyrl" else extra
    return CliRunner().invoke(
        cli, ["import", fmt, str(source), "--out", str(out), "--run-id", "dump", *extra]
    )


def _sorted(t: pa.Table) -> pa.Table:
    """Rows in an order both sides share (the importers number sequences their own way)."""
    return t.sort_by([("step", "ascending"), ("behave_logp", "ascending"), ("pos", "ascending")])


@pytest.mark.parametrize("fmt", sorted(DUMPS))
def test_import_gives_back_the_rows_and_validates_clean(fmt, table, tmp_path):
    DUMPS[fmt](table, tmp_path / "dump")
    result = _import(fmt, tmp_path / "dump", tmp_path / "logs")
    assert result.exit_code == 0, result.output
    imported = pq.read_table(tmp_path / "logs")
    metadata = pq.read_schema(next((tmp_path / "logs").glob("*.parquet"))).metadata
    assert metadata[VERSIONS_KEY] == (RECORDED if fmt == "slime" else ASSUMED_ON_POLICY)
    got = _sorted(imported)
    # slime's and SkyRL's arrays mark the whole response; the others' dumps mark it by the loss mask
    expected = _sorted(table if fmt in ("slime", "skyrl") else _trimmed(table))
    assert got.num_rows == expected.num_rows
    for column in COMPARED:
        assert np.allclose(
            expected[column].to_numpy(zero_copy_only=False).astype(float),
            got[column].to_numpy(zero_copy_only=False).astype(float),
            atol=1e-6,
        ), column
    validation = validate_paths([tmp_path / "logs"])
    assert all(r.ok for r in validation.reports), [r.problems for r in validation.reports]
    assert validation.findings == []
    assert any("assumed" in n for n in validation.reports[0].notes) == (fmt != "slime")


def _trimmed(table: pa.Table) -> pa.Table:
    """What an importer keeps of a response: from its first to its last token in the loss."""
    frame = table.to_pandas()
    in_loss = frame[frame["loss_mask"]]
    bounds = in_loss.groupby("seq_id")["pos"].agg(["min", "max"])
    frame = frame.join(bounds, on="seq_id")
    kept = frame[(frame["pos"] >= frame["min"]) & (frame["pos"] <= frame["max"])].copy()
    kept["pos"] = kept["pos"] - kept["min"]
    return pa.Table.from_pandas(kept.drop(columns=["min", "max"]), preserve_index=False)


@pytest.mark.parametrize("fmt", sorted(DUMPS))
def test_a_shifted_dump_is_caught_after_import(fmt, table, tmp_path):
    DUMPS[fmt](table, tmp_path / "dump", shift=1)
    assert _import(fmt, tmp_path / "dump", tmp_path / "logs").exit_code == 0
    reports = validate_paths([tmp_path / "logs"]).reports
    assert all(
        any(p.rule == "misaligned_logp" and p.column == "behave_logp" for p in r.problems) for r in reports
    )


def test_a_broken_file_fails_alone(table, tmp_path):
    files = nemo_rl_dump(table, tmp_path / "dump")
    files[1].write_text('{"token_ids": [1, 2]}\n')
    result = _import("nemo-rl", tmp_path / "dump", tmp_path / "logs")
    assert result.exit_code == 1
    assert f"{files[1]}: failed: " in result.output and "line 1: missing token_loss_mask" in result.output
    assert len(list((tmp_path / "logs").glob("*.parquet"))) == len(files) - 1
    assert not list((tmp_path / "logs").glob(".*.tmp"))


def test_a_foreign_file_name_is_a_usage_error(tmp_path):
    (tmp_path / "steps.jsonl").write_text("{}\n")
    result = _import("nemo-rl", tmp_path / "steps.jsonl", tmp_path / "logs")
    assert result.exit_code == 2 and "train_data_step{N}.jsonl" in result.output


def test_large_dumps_stream(table, tmp_path, monkeypatch):
    """Batches are written as they fill: the rows come back whole across many record batches."""
    from evaluator.importers import rows

    monkeypatch.setattr(rows, "BATCH_ROWS", 100)
    prime_rl_dump(table, tmp_path / "dump", ranks=1)
    assert _import("prime-rl", tmp_path / "dump", tmp_path / "logs").exit_code == 0
    path = next((tmp_path / "logs").glob("*.parquet"))
    assert pq.ParquetFile(path).metadata.num_row_groups > 1
    assert pq.read_table(tmp_path / "logs").num_rows == _trimmed(table).num_rows


STALE = SyntheticSpec(run_id="dump", tokens_per_step=2048, mean_length=24, max_staleness=3, n_minibatches=1,
                      resume_fraction=0.0, with_proximal_t=False)  # fmt: skip


def test_slime_keeps_versions_and_skips_what_it_cannot_place(tmp_path):
    """Versions from the rollout dump give real staleness; a response generated across two versions is
    skipped and counted; without the rollout dump, versions are assumed and said so."""
    table = synthetic_steps(STALE, 3, 3)
    slime_dump(table, tmp_path / "dump", resumed=2)
    result = _import("slime", tmp_path / "dump", tmp_path / "logs")
    assert result.exit_code == 0
    assert result.output.count(", 2 generated across several weight versions skipped") == 3
    got = pq.read_table(tmp_path / "logs")
    staleness = np.asarray(got["step"]) - np.asarray(got["behave_version"])
    assert staleness.max() > 0 and validate_paths([tmp_path / "logs"]).findings == []
    for path in (tmp_path / "dump" / "rollout_data").glob("*.pt"):
        path.unlink()
    assert _import("slime", tmp_path / "dump", tmp_path / "assumed").exit_code == 0
    metadata = pq.read_schema(next((tmp_path / "assumed").glob("*.parquet"))).metadata
    assert metadata[VERSIONS_KEY] == ASSUMED_ON_POLICY


def test_slime_refuses_a_file_that_needs_unpickling(tmp_path):
    import pickle

    path = tmp_path / "dump" / "train_data" / "3.pt"
    path.parent.mkdir(parents=True)
    path.write_bytes(pickle.dumps({"samples": [SyntheticSpec()]}))  # a class: code to run on load
    result = _import("slime", tmp_path / "dump", tmp_path / "logs")
    assert result.exit_code == 1 and "refused" in result.output and "never unpickles" in result.output
    assert not (tmp_path / "logs").exists() or not list((tmp_path / "logs").iterdir())


def test_skyrl_needs_trust_and_resolves_nothing_else(table, tmp_path):
    """Without --trust-pickle a SkyRL dump is refused; with it, a pickle that names any other function
    (here os.system) is refused before anything runs."""
    import os
    import pickle

    skyrl_dump(table, tmp_path / "dump")
    refused = CliRunner().invoke(
        cli, ["import", "skyrl", str(tmp_path / "dump"), "--out", str(tmp_path / "o")]
    )
    assert refused.exit_code == 2 and "--trust-pickle" in refused.output and "runs code" in refused.output
    evil = tmp_path / "evil" / "dumped_data" / "global_step_1_training_input.pkl"
    evil.parent.mkdir(parents=True)

    class Payload:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    evil.write_bytes(pickle.dumps(Payload()))
    result = _import("skyrl", tmp_path / "evil", tmp_path / "logs")
    assert result.exit_code == 1 and "refused: the file names posix.system" in result.output
    assert not (tmp_path / "pwned").exists()


def test_written_logs_are_readable_as_plain_files(table, tmp_path):
    """Logs appear with the mode a plain open() gives (0666 less the umask), not mkstemp's 0600."""
    import os
    import stat

    from evaluator.logio import write_log_atomic

    umask = os.umask(0o022)
    try:
        hooked = write_log_atomic(table, tmp_path / "hook.parquet")
        prime_rl_dump(table, tmp_path / "dump", ranks=1)
        assert _import("prime-rl", tmp_path / "dump", tmp_path / "logs").exit_code == 0
        imported = next((tmp_path / "logs").glob("*.parquet"))
    finally:
        os.umask(umask)
    assert {stat.S_IMODE(p.stat().st_mode) for p in (hooked, imported)} == {0o644}
