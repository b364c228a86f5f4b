"""The trainer hook: layouts, alignment, shape errors, never touching training, the writer thread."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

import evaluator.hook.recorder as hook_module
from evaluator.hook.recorder import HookShapeError, HookWriterError, RunIdReusedWarning, TokenLogHook
from evaluator.validate import validate_paths
from schemas.token_log import SCHEMA_VERSION, SCHEMA_VERSION_KEY, arrow_schema

REPO = Path(__file__).resolve().parents[1]
# A batch of B=2 sequences, prompt+response padded to T=6; prompt 3 tokens; sequence 1 has 2 response tokens.
B, T, P = 2, 6, 3
RESP = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 0]], dtype=torch.bool)  # (B, T)
LOGP = -torch.arange(1, B * T + 1, dtype=torch.float32).reshape(B, T) / 10  # (B, T) token i's log-prob
VERSION = torch.tensor([[-1, -1, -1, 4, 4, 5], [-1, -1, -1, 5, 5, -1]])  # (B, T)


def read_rows(out: Path) -> list[dict]:
    files = sorted(out.glob("*.parquet"))
    assert files, f"no files in {out}"
    return [row for f in files for row in pq.read_table(f).to_pylist()]


def record_all(out: Path, run_id: str = "run", **kwargs) -> list[dict]:
    with TokenLogHook(out, run_id) as hook:
        hook.record(step=7, minibatch=1, n_minibatches=2, **kwargs)
    return read_rows(out)


def base(**overrides) -> dict:
    kwargs = dict(
        behave_logp=LOGP,
        behave_version=VERSION,
        theta_logp=LOGP - 0.01,
        response_mask=RESP,
        seq_id=torch.tensor([10, 11]),
    )
    return kwargs | overrides


class TestLayouts:
    def test_padded_prompt_and_response_rows(self, tmp_path):
        rows = record_all(tmp_path, **base(reward=torch.tensor([1.0, 0.0])))
        # Response tokens: seq 10 at t=3,4,5; seq 11 at t=3,4; behave_logp of (b, t) is -(b*T + t + 1)/10.
        assert [(r["seq_id"], r["pos"]) for r in rows] == [(10, 0), (10, 1), (10, 2), (11, 0), (11, 1)]
        assert [r["behave_logp"] for r in rows] == pytest.approx([-0.4, -0.5, -0.6, -1.0, -1.1])
        assert [r["behave_version"] for r in rows] == [4, 4, 5, 5, 5]
        assert [r["reward"] for r in rows] == [1.0, 1.0, 1.0, 0.0, 0.0]
        assert {(r["step"], r["minibatch"], r["n_minibatches"], r["run_id"]) for r in rows} == {
            (7, 1, 2, "run")
        }
        assert all(r["loss_mask"] for r in rows) and all(r["prox_logp"] is None for r in rows)

    def test_file_is_schema_v1(self, tmp_path):
        record_all(tmp_path, **base())
        (path,) = tmp_path.glob("*.parquet")
        schema = pq.read_schema(path)
        assert schema.remove_metadata().equals(arrow_schema().remove_metadata())
        assert schema.metadata[SCHEMA_VERSION_KEY.encode()] == SCHEMA_VERSION.encode()
        assert path.name == "run-step000007-000007-0000.parquet"

    def test_prompt_lengths_same_rows_as_response_mask(self, tmp_path):
        by_mask = record_all(tmp_path / "a", **base())
        attention = torch.tensor([[1] * 6, [1] * 5 + [0]])  # (B, T) sequence 1 is padded at t=5
        by_length = record_all(
            tmp_path / "b",
            **base(response_mask=None, prompt_lengths=torch.tensor([P, P]), attention_mask=attention),
        )
        assert by_length == by_mask

    def test_packed_same_rows_as_padded(self, tmp_path):
        padded = record_all(tmp_path / "a", **base(advantage=torch.tensor([0.5, -0.5])))
        keep = torch.tensor([[1] * 6, [1] * 5 + [0]], dtype=torch.bool)  # drop the pad token of sequence 1
        packed = record_all(
            tmp_path / "b",
            **base(
                behave_logp=LOGP[keep],
                behave_version=VERSION[keep],
                theta_logp=(LOGP - 0.01)[keep],
                response_mask=RESP[keep],
                advantage=torch.tensor([0.5, -0.5]),  # [B] per sequence
                cu_seqlens=torch.tensor([0, 6, 11]),
            ),
        )
        assert packed == padded

    def test_response_only_layout(self, tmp_path):
        rows = record_all(
            tmp_path,
            behave_logp=LOGP[:, P:],
            behave_version=VERSION[:, P:],
            theta_logp=LOGP[:, P:],
            response_mask=RESP[:, P:],
        )
        assert [r["behave_logp"] for r in rows] == pytest.approx([-0.4, -0.5, -0.6, -1.0, -1.1])
        assert [r["seq_id"] for r in rows] == [0, 0, 0, 1, 1]  # fresh ids when none are given


class TestAlignment:
    def test_token_rolled_and_sliced_give_identical_rows(self, tmp_path):
        token = record_all(tmp_path / "token", **base(prox_logp=LOGP - 0.02))
        rolled = record_all(
            tmp_path / "rolled",
            **base(
                theta_logp=torch.roll(LOGP - 0.01, -1, -1),  # value i belongs to token i + 1
                prox_logp=torch.roll(LOGP - 0.02, -1, -1),
                alignment={"theta_logp": "next_token", "prox_logp": "next_token"},
            ),
        )
        sliced = record_all(
            tmp_path / "sliced",
            **base(
                theta_logp=(LOGP - 0.01)[:, 1:],  # a logits[:, :-1] gather: [B, T - 1]
                prox_logp=(LOGP - 0.02)[:, 1:],
                alignment={"theta_logp": "next_token", "prox_logp": "next_token"},
            ),
        )
        assert token == rolled == sliced
        assert [r["theta_logp"] for r in token] == pytest.approx([-0.41, -0.51, -0.61, -1.01, -1.11])

    def test_rolled_mask_and_packed_next_token(self, tmp_path):
        keep = torch.tensor([[1] * 6, [1] * 5 + [0]], dtype=torch.bool)
        token = record_all(tmp_path / "token", **base(cu_seqlens=torch.tensor([0, 6, 11]), **_packed(keep)))
        rolled = {k: torch.roll(v, -1, -1) for k, v in _packed(keep).items() if k != "behave_version"}
        next_token = record_all(
            tmp_path / "next",
            **base(cu_seqlens=torch.tensor([0, 6, 11]), behave_version=VERSION[keep], **rolled),
            alignment={
                "response_mask": "next_token",
                "behave_logp": "next_token",
                "theta_logp": "next_token",
            },
        )
        assert next_token == token

    def test_next_token_on_response_only_has_no_value_for_first_token(self, tmp_path):
        hook = TokenLogHook(tmp_path, "run")
        args = dict(behave_logp=LOGP[:, P:], behave_version=VERSION[:, P:], theta_logp=LOGP[:, P:])
        hook.record(step=0, **args, alignment={"theta_logp": "next_token"})
        with pytest.raises(HookWriterError, match="first token of their sequence"):
            hook.flush()
        with pytest.raises(HookWriterError):
            hook.record(step=1, **args)  # the hook stays failed, loudly
        hook.close()


def _packed(keep: torch.Tensor) -> dict:
    return dict(
        behave_logp=LOGP[keep],
        behave_version=VERSION[keep],
        theta_logp=(LOGP - 0.01)[keep],
        response_mask=RESP[keep],
    )


class TestShapeErrors:
    def test_mismatch_names_both_shapes(self, tmp_path):
        with TokenLogHook(tmp_path, "run") as hook, pytest.raises(HookShapeError) as error:
            hook.record(step=0, **base(theta_logp=LOGP[:, 1:]))  # token-aligned but one short
        assert "theta_logp has shape (2, 5)" in str(error.value) and "(2, 6)" in str(error.value)

    def test_packed_mismatch(self, tmp_path):
        with TokenLogHook(tmp_path, "run") as hook, pytest.raises(HookShapeError, match=r"\(11,\)"):
            hook.record(
                step=0,
                behave_logp=torch.zeros(11),
                behave_version=torch.zeros(10),
                theta_logp=torch.zeros(11),
                cu_seqlens=torch.tensor([0, 6, 11]),
            )

    def test_per_sequence_and_alignment_errors(self, tmp_path):
        with TokenLogHook(tmp_path, "run") as hook:
            with pytest.raises(HookShapeError, match="seq_id has shape"):
                hook.record(step=0, **base(seq_id=torch.arange(3)))
            with pytest.raises(HookShapeError, match="alignment of theta_logp"):
                hook.record(step=0, **base(), alignment={"theta_logp": "rolled"})
            with pytest.raises(HookShapeError, match="not a per-token tensor"):
                hook.record(step=0, **base(), alignment={"theta": "token"})
        assert not list(tmp_path.glob("*.parquet"))  # nothing half-recorded


class TestNeverChangesTraining:
    def test_no_grad_kept_inputs_unchanged_and_snapshotted(self, tmp_path):
        weight = torch.ones(1, requires_grad=True)
        theta = LOGP * weight  # part of an autograd graph
        behave = LOGP.clone()
        before = {"theta": theta.detach().clone(), "behave": behave.clone()}
        with TokenLogHook(tmp_path, "run") as hook:
            hook.record(step=0, **base(theta_logp=theta, behave_logp=behave))
            behave.add_(-5.0)  # the trainer reuses its buffer right after the call
            snap = hook_module.host_copy(theta)
            assert not snap.requires_grad and snap.grad_fn is None
        assert torch.equal(theta.detach(), before["theta"]) and theta.requires_grad and weight.grad is None
        theta.sum().backward()  # the graph is intact
        assert [r["behave_logp"] for r in read_rows(tmp_path)] == pytest.approx(
            [-0.4, -0.5, -0.6, -1.0, -1.1]
        )


class TestWriter:
    def test_error_surfaces_on_next_call_and_on_close(self, tmp_path, monkeypatch):
        def broken(table, path):
            raise OSError("disk full")

        monkeypatch.setattr(hook_module, "write_log_atomic", broken)
        hook = TokenLogHook(tmp_path, "run", tokens_per_file=1)
        hook.record(step=0, **base())
        deadline = time.time() + 5
        with pytest.raises(HookWriterError, match="disk full"):  # on one of the next calls
            while time.time() < deadline:
                hook.record(step=1, **base())
                time.sleep(0.01)
        hook2 = TokenLogHook(tmp_path, "run2", tokens_per_file=1)
        hook2.record(step=0, **base())
        with pytest.raises(HookWriterError, match="disk full"):
            hook2.close()

    def test_backpressure_blocks_the_caller(self, tmp_path, monkeypatch):
        gate = threading.Event()
        real = TokenLogHook._add

        def slow(self, snap):
            gate.wait()
            return real(self, snap)

        monkeypatch.setattr(TokenLogHook, "_add", slow)
        hook = TokenLogHook(tmp_path, "run", max_pending=2)
        for step in range(3):  # one in the writer's hands, two queued
            hook.record(step=step, **base())
        blocked = threading.Thread(target=lambda: hook.record(step=3, **base()))
        blocked.start()
        blocked.join(0.3)
        assert blocked.is_alive() and hook._queue.qsize() == 2  # the caller waits; the queue stays bounded
        gate.set()
        blocked.join(5)
        assert not blocked.is_alive()
        hook.close()
        assert sorted({r["step"] for r in read_rows(tmp_path)}) == [0, 1, 2, 3]

    def test_roll_by_step(self, tmp_path):
        with TokenLogHook(tmp_path, "run", steps_per_file=2) as hook:
            for step in range(5):
                for minibatch in range(2):
                    hook.record(step=step, minibatch=minibatch, n_minibatches=2, **base())
        names = sorted(p.name for p in tmp_path.glob("*.parquet"))
        assert names == [
            "run-step000000-000001-0000.parquet",
            "run-step000002-000003-0001.parquet",
            "run-step000004-000004-0002.parquet",
        ]
        with TokenLogHook(tmp_path, "run") as hook:  # a restarted run continues the counter
            hook.record(step=5, **base())
        assert (tmp_path / "run-step000005-000005-0003.parquet").exists()

    def test_roll_by_size_keeps_sequences_whole_and_sorted(self, tmp_path):
        with TokenLogHook(tmp_path, "run", tokens_per_file=20) as hook:
            for minibatch in (1, 0, 2):  # out of order: each file is sorted anyway
                seq_ids = torch.tensor([20 - minibatch, 10 + minibatch])
                hook.record(step=3, minibatch=minibatch, n_minibatches=3, **base(seq_id=seq_ids))
        files = sorted(tmp_path.glob("*.parquet"))
        assert [pq.read_metadata(f).num_rows for f in files] == [10, 5]
        for f in files:
            rows = pq.read_table(f).to_pylist()
            keys = [(r["step"], r["minibatch"], r["seq_id"], r["pos"]) for r in rows]
            assert keys == sorted(keys)
        seqs_per_file = [{(r["minibatch"], r["seq_id"]) for r in pq.read_table(f).to_pylist()} for f in files]
        assert not seqs_per_file[0] & seqs_per_file[1]

    def test_bad_run_id(self, tmp_path):
        with pytest.raises(ValueError, match="file-name-safe"):
            TokenLogHook(tmp_path, "../escape")
        with pytest.raises(ValueError, match="at most 200 characters"):
            TokenLogHook(tmp_path, "r" * 201)
        TokenLogHook(tmp_path, "r" * 200).close()  # the validator's limit: its files are valid

    def test_sigkill_mid_write_leaves_no_partial_file(self, tmp_path):
        """A trainer process killed while its writer is half-way through a file: only whole files show."""
        script = textwrap.dedent(
            f"""
            import sys, time, torch
            sys.path.insert(0, {str(REPO)!r})
            import evaluator.logio as logio
            from evaluator.hook.recorder import TokenLogHook

            real_write, calls = logio.pq.write_table, []
            def half_then_stall(table, sink, **kw):  # the 2nd file: half its rows reach disk, then a stall
                calls.append(1)
                if len(calls) == 2:
                    real_write(table.slice(0, table.num_rows // 2), sink, **kw)
                    sink.flush()
                    time.sleep(600)
                real_write(table, sink, **kw)
            logio.pq.write_table = half_then_stall

            hook = TokenLogHook({str(tmp_path)!r}, "killed", tokens_per_file=40000)
            B, T = 64, 400
            logp = -torch.rand(B, T)
            for step in range(1000):
                hook.record(step=step, behave_logp=logp, behave_version=torch.zeros(B, T, dtype=torch.long),
                            theta_logp=logp, prox_logp=logp)
            """
        )
        proc = subprocess.Popen([sys.executable, "-c", script])
        try:
            deadline = time.time() + 60
            while time.time() < deadline and not (  # kill once half of the second file is on disk
                list(tmp_path.glob("*.parquet"))
                and [p for p in tmp_path.iterdir() if p.name.endswith(".tmp") and p.stat().st_size > 0]
            ):
                time.sleep(0.05)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        (done,) = tmp_path.glob("*.parquet")  # the first file, whole
        assert done.name == "killed-step000000-000001-0000.parquet"
        assert pq.read_table(done).num_rows == 2 * 64 * 400
        (partial,) = [p for p in tmp_path.iterdir() if p != done]  # the second, half written, stays hidden
        assert partial.name.startswith(".killed-step000002-000003-0001.parquet.") and partial.name.endswith(
            ".tmp"
        )
        assert partial.stat().st_size > 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_give_the_same_rows(tmp_path):
    cpu = record_all(tmp_path / "cpu", **base())
    on_gpu = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in base().items()}
    assert record_all(tmp_path / "gpu", **on_gpu) == cpu


class TestCachedPlan:
    """Shapes are checked fully once per call signature; later calls of that signature take a fast path."""

    def test_a_mismatch_after_a_cached_signature_raises_the_same_error(self, tmp_path):
        with TokenLogHook(tmp_path / "fresh", "run") as fresh, pytest.raises(HookShapeError) as first:
            fresh.record(step=0, **base(theta_logp=LOGP[:, 1:]))
        with TokenLogHook(tmp_path / "warm", "run") as warm:
            for step in range(3):
                warm.record(step=step, **base())
            for _ in range(2):  # every time, not only the first
                with pytest.raises(HookShapeError) as again:
                    warm.record(step=3, **base(theta_logp=LOGP[:, 1:]))
                assert str(again.value) == str(first.value)
            with pytest.raises(HookShapeError, match="alignment of theta_logp"):
                warm.record(step=3, **base(), alignment={"theta_logp": "rolled"})
            warm.record(step=4, **base())  # the good signature still works after the errors
        assert sorted({r["step"] for r in read_rows(tmp_path / "warm")}) == [0, 1, 2, 4]

    def test_new_shapes_and_dtypes_give_their_own_rows(self, tmp_path):
        """Same names, other batch sizes, dtypes and alignment: each call is aligned by its own shapes."""
        with TokenLogHook(tmp_path / "mixed", "run") as hook:
            hook.record(step=0, **base())
            hook.record(step=1, **base(behave_version=VERSION.int(), behave_logp=LOGP.double()))
            hook.record(step=2, **base(theta_logp=LOGP[:, 1:]), alignment={"theta_logp": "next_token"})
            one = {k: v[1:] for k, v in base().items()}  # B = 1
            hook.record(step=3, **one)
        rows = read_rows(tmp_path / "mixed")
        alone = record_all(tmp_path / "alone", **base())
        by_step = {s: [r for r in rows if r["step"] == s] for s in range(4)}
        keys = ("seq_id", "pos", "behave_logp", "behave_version")
        for s in (0, 1, 2):
            assert [tuple(r[k] for k in keys) for r in by_step[s]] == [
                tuple(r[k] for k in keys) for r in alone
            ]
        assert [r["theta_logp"] for r in by_step[2]] == pytest.approx([r["behave_logp"] for r in alone])
        assert [tuple(r[k] for k in keys) for r in by_step[3]] == [
            tuple(r[k] for k in keys) for r in alone if r["seq_id"] == 11
        ]

    def test_copies_are_new_memory_without_grad(self, tmp_path):
        theta = (LOGP * torch.ones(1, requires_grad=True)).contiguous()
        plan = hook_module.make_plan(base(theta_logp=theta), {})
        parts = hook_module.host_copies(base(theta_logp=theta), plan)
        given = {t.data_ptr() for t in base(theta_logp=theta).values()} | {theta.data_ptr()}
        assert all(not p.requires_grad and p.grad_fn is None for p in parts)
        assert not given & {p.data_ptr() for p in parts}
        assert len(parts) < len(base())  # same-dtype tensors share one copy

    def test_calls_aligned_together_give_each_calls_own_rows(self, tmp_path):
        """The writer aligns the padded calls of one plan in one pass; rows must match calls written alone."""
        calls = [
            dict(
                step=s,
                minibatch=m,
                n_minibatches=2,
                **base(behave_logp=LOGP - s - m, seq_id=torch.tensor([s, 9])),
            )
            for s in range(3)
            for m in range(2)
        ]
        packed = dict(step=1, behave_logp=LOGP[RESP], behave_version=VERSION[RESP], theta_logp=LOGP[RESP])
        packed["cu_seqlens"] = torch.tensor([0, 3, 5])
        with TokenLogHook(tmp_path / "together", "run") as hook:
            for kwargs in calls[:3] + [packed] + calls[3:]:
                hook.record(**kwargs)
        alone = []
        for i, kwargs in enumerate(calls[:3] + [packed] + calls[3:]):
            with TokenLogHook(tmp_path / f"alone{i}", "run") as hook:
                hook.record(**kwargs)
            alone += read_rows(tmp_path / f"alone{i}")
        key = lambda r: (r["step"], r["minibatch"], r["seq_id"], r["pos"])  # noqa: E731
        assert sorted(read_rows(tmp_path / "together"), key=key) == sorted(alone, key=key)
        assert len(alone) == 6 * 5 + 5


class TestEarlierFilesOfTheRun:
    """A new hook of a run whose files are already in its folder: a resumed run goes on after them, a
    training restarted under the same run_id is warned about (not left to replay's duplicate rule)."""

    def steps(self, out: Path, steps: list[int], run_id: str = "run") -> None:
        with TokenLogHook(out, run_id, steps_per_file=1) as hook:
            for step in steps:
                hook.record(step=step, **base(seq_id=None, behave_version=torch.zeros_like(VERSION)))

    def test_a_restart_at_step_0_over_the_runs_files_warns(self, tmp_path):
        self.steps(tmp_path, [0, 1, 2])
        with pytest.warns(RunIdReusedWarning, match=r"already holds steps 0\.\.2 of run 'run' \(3 files\)"):
            self.steps(tmp_path, [0])
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a resume after the last step, or another run: no warning
            self.steps(tmp_path, [3])
            self.steps(tmp_path, [0], run_id="other")

    def test_a_resumed_run_continues_fresh_seq_ids_and_file_numbers(self, tmp_path):
        self.steps(tmp_path, [7, 8])
        self.steps(tmp_path, [9])
        names = sorted(p.name for p in tmp_path.glob("*.parquet"))
        assert names == [f"run-step00000{s}-00000{s}-000{n}.parquet" for n, s in enumerate([7, 8, 9])]
        seq_ids = [sorted({r["seq_id"] for r in pq.read_table(tmp_path / n).to_pylist()}) for n in names]
        assert seq_ids == [[0, 1], [2, 3], [4, 5]]  # never an earlier file's token again
        assert all(r.ok for r in validate_paths([tmp_path]).reports)  # no duplicate_across_files
