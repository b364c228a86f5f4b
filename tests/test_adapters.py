"""Adapters for AReaL's and verl's batch layouts: the hook's rows carry each token's own values."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from evaluator.hook.adapters import areal_record_args, verl_record_args
from evaluator.hook.recorder import TokenLogHook

# seeds/000's example: prompt [101..105], response [201..205] generated under versions [5, 5, 6, 6, 7].
PROMPT, RESPONSE = [101, 102, 103, 104, 105], [201, 202, 203, 204, 205]
BEHAVE = [-1.0, -1.1, -2.2, -1.3, -1.4]  # pi_behave of each response token
PROX = [-1.5, -1.6, -1.7, -1.8, -1.9]  # pi_prox of each response token
THETA = [-0.5, -0.6, -0.7, -0.8, -0.9]
ADV = [0.1, 0.2, 0.3, 0.4, 0.5]
VERSIONS = [5, 5, 6, 6, 7]


def rows_of(tmp_path: Path, **record_args) -> list[dict]:
    with TokenLogHook(tmp_path, "run") as hook:
        hook.record(step=8, minibatch=0, n_minibatches=1, **record_args)
    return [r for f in sorted(tmp_path.glob("*.parquet")) for r in pq.read_table(f).to_pylist()]


def token_aligned(values: list[float], fill: float = 0.0) -> torch.Tensor:
    return torch.tensor([[fill] * len(PROMPT) + values])  # (1, T): prompt part filled


def areal_batch() -> dict[str, torch.Tensor]:
    """AReaL's padded actor batch as `compute_advantages` leaves it (the `_ppo_update` data and its
    minibatches): the keys of RLVRWorkflow.arun_episode plus `prox_logp` (compute_logp, rolled) and
    `advantages`; `loss_mask` and `logprobs` rolled by compute_advantages, `rewards` already removed."""
    return {
        "input_ids": torch.tensor([PROMPT + RESPONSE], dtype=torch.int32),
        "attention_mask": torch.ones(1, 10, dtype=torch.bool),
        "versions": token_aligned(VERSIONS, -1).int(),
        "loss_mask": torch.roll(token_aligned([1.0] * 5), -1, -1),
        "logprobs": torch.roll(token_aligned(BEHAVE), -1, -1),
        "prox_logp": torch.roll(token_aligned(PROX), -1, -1),
        "advantages": torch.roll(token_aligned(ADV), -1, -1),
    }


class TestAReaL:
    def test_each_row_holds_its_tokens_values(self, tmp_path):
        theta = torch.roll(token_aligned(THETA), -1, -1)  # the loss function's logprobs: rolled
        rows = rows_of(tmp_path, **areal_record_args(areal_batch(), theta_logp=theta))
        assert [r["token_id"] for r in rows] == RESPONSE
        assert [r["pos"] for r in rows] == [0, 1, 2, 3, 4]
        assert [r["behave_logp"] for r in rows] == pytest.approx(BEHAVE)
        assert [r["prox_logp"] for r in rows] == pytest.approx(PROX)
        assert [r["theta_logp"] for r in rows] == pytest.approx(THETA)
        assert [r["behave_version"] for r in rows] == VERSIONS
        assert [r["advantage"] for r in rows] == pytest.approx(ADV)
        assert [r["reward"] for r in rows] == [None] * 5  # the loss function's batch has no rewards

    def test_a_copy_of_behave_is_not_recorded(self, tmp_path):
        theta = torch.roll(token_aligned(THETA), -1, -1)
        rows = rows_of(tmp_path, **areal_record_args(areal_batch(), theta_logp=theta, record_prox=False))
        assert [r["prox_logp"] for r in rows] == [None] * 5

    @pytest.mark.parametrize("attention_mask", [{"full_attention": None}, None], ids=["dict", "none"])
    def test_packed_micro_batch(self, tmp_path, attention_mask):
        """The FSDP engine's micro-batch: two sequences packed into [N] with cu_seqlens (rolls ran per
        sequence before packing), attention_mask a dict (or None for qwen3_moe / vl models)."""
        one = areal_batch()
        batch = {k: torch.cat([v[0], v[0]]) for k, v in one.items() if k != "attention_mask"}
        batch["versions"] = torch.cat([one["versions"][0], one["versions"][0] + 1])
        batch |= {
            "cu_seqlens": torch.tensor([0, 10, 20], dtype=torch.int32),
            "attention_mask": attention_mask,
        }
        theta = torch.roll(torch.cat([token_aligned(THETA)[0]] * 2), -1)
        rows = rows_of(tmp_path, **areal_record_args(batch, theta_logp=theta))
        assert [r["seq_id"] for r in rows] == [0] * 5 + [1] * 5
        assert [r["behave_logp"] for r in rows] == pytest.approx(BEHAVE * 2)
        assert [r["prox_logp"] for r in rows] == pytest.approx(PROX * 2)
        assert [r["theta_logp"] for r in rows] == pytest.approx(THETA * 2)
        assert [r["behave_version"] for r in rows] == VERSIONS + [v + 1 for v in VERSIONS]


class TestVerl:
    def batch(self) -> dict[str, torch.Tensor]:
        mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])  # (B, R): response 1 is 3 tokens long
        scores = torch.zeros(2, 5)
        scores[0, 4], scores[1, 2] = 1.0, 0.5  # verl puts the score on the last response token
        return {  # a V1 micro-batch after to_padded_tensor(), as ppo_loss makes it
            "responses": torch.tensor([RESPONSE, [301, 302, 303, 0, 0]]),
            "loss_mask": mask,
            "response_mask": mask,
            "rollout_log_probs": torch.tensor([BEHAVE, BEHAVE]) * mask,
            "old_log_probs": torch.tensor([PROX, PROX]) * mask,
            "advantages": torch.tensor([ADV, ADV]) * mask,
            "rm_scores": scores,
        }

    @pytest.mark.parametrize(
        "version", [7, torch.tensor([7, 7]), torch.full((2, 5), 7)], ids=["int", "per-seq", "per-token"]
    )
    def test_response_only_rows(self, tmp_path, version):
        theta = torch.tensor([THETA, THETA])
        rows = rows_of(tmp_path, **verl_record_args(self.batch(), theta_logp=theta, behave_version=version))
        assert [r["token_id"] for r in rows] == RESPONSE + [301, 302, 303]
        assert [r["behave_logp"] for r in rows] == pytest.approx(BEHAVE + BEHAVE[:3])
        assert [r["prox_logp"] for r in rows] == pytest.approx(PROX + PROX[:3])
        assert [r["theta_logp"] for r in rows] == pytest.approx(THETA + THETA[:3])
        assert [r["advantage"] for r in rows] == pytest.approx(ADV + ADV[:3])
        assert [r["reward"] for r in rows] == [1.0] * 5 + [0.5] * 3
        assert {r["behave_version"] for r in rows} == {7}

    def test_rejected_tokens_stay_out_of_the_loss(self, tmp_path):
        """Rollout rejection sampling overwrites response_mask; loss_mask keeps the response's tokens."""
        batch = self.batch()
        batch["response_mask"] = batch["loss_mask"].clone()
        batch["response_mask"][0, 1:3] = 0
        args = verl_record_args(batch, theta_logp=torch.tensor([THETA, THETA]), behave_version=7)
        rows = rows_of(tmp_path, **args)
        assert [r["token_id"] for r in rows] == RESPONSE + [301, 302, 303]
        assert [r["loss_mask"] for r in rows] == [True, False, False, True, True] + [True] * 3

    def test_needs_rollout_log_probs(self):
        batch = self.batch()
        del batch["rollout_log_probs"]
        with pytest.raises(KeyError, match="calculate_log_probs"):
            verl_record_args(batch, theta_logp=torch.zeros(2, 5), behave_version=0)


class TestSeqIds:
    """Each rank writes its own folder under one run_id: ids must differ over the ranks and go on after a
    resumed run's files."""

    def test_ranks_interleave_after_the_earlier_files(self, tmp_path, monkeypatch):
        import evaluator.hook.trainers as trainers

        with TokenLogHook(tmp_path / "rank1", "run") as hook:  # an earlier run of rank 1: seq_ids 0..6
            hook.record(
                step=0,
                behave_logp=torch.zeros(7, 2),
                behave_version=torch.zeros(7, 2, dtype=torch.int32),
                theta_logp=torch.zeros(7, 2),
            )
        monkeypatch.setattr(trainers, "rank_and_world", lambda: (1, 4))
        with TokenLogHook(tmp_path / "rank1", "run") as hook:
            ids = trainers.SeqIds(hook)
            assert ids.take(3).tolist() == [9, 13, 17]  # rank + 4k, k from ceil(7 / 4) = 2
            assert ids.take(1).tolist() == [21]
        monkeypatch.setattr(trainers, "rank_and_world", lambda: (2, 4))
        with TokenLogHook(tmp_path / "rank2", "run") as hook:
            assert trainers.SeqIds(hook).take(2).tolist() == [2, 6]
