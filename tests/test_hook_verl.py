"""The verl integration on verl's own code (0.9.1, pinned in requirements-trainers.txt): samples in the agent
loop's layout (`list_of_dict_to_tensordict`, nested tensors), `old_log_probs` by `response_from_nested`,
rollout rejection sampling (`compute_rollout_correction_and_add_to_batch`) and GRPO advantages as
`_compute_advantage` runs them, verl's real `PPOTrainer._update_actor` on the driver, and on the worker the
mini-batch iterator, the micro-batch split and `ppo_loss` as `train_mini_batch` and the engine run them, a
tiny model on CPU. Every recorded column is compared with an independent per-sequence recompute."""

from __future__ import annotations

import copy
import pickle
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from evaluator.hook.trainers import FakeProxWarning
from evaluator.hook.verl import record_actor_updates
from evaluator.validate import validate_paths
from tests.tiny_lm import token_logps


@pytest.fixture(scope="module")
def verl_step():
    """`tests/verl_step.py`, which runs verl's code: imported when this module's tests run, not when it is
    collected (every pytest-xdist worker collects every module; verl's imports cost about 10 CPU-seconds)."""
    pytest.importorskip("verl", reason="verl 0.9.1: make install")
    pytest.importorskip("verl.trainer.ppo.v1.trainer_sync", reason="verl's V1 trainer does not import")
    from tests import verl_step

    return verl_step


def test_every_column_equals_a_per_sequence_recompute(tmp_path, verl_step):
    rows, truth, data, workers, prox_model = verl_step.run_step(tmp_path)
    rs_mask = [m.tolist() for m in data["response_mask"].unbind()]  # after rejection sampling
    assert len(workers.weights) == 2  # 8 samples, mini-batches of ppo_mini_batch_size * n = 4
    expected = {}
    for seq_id, t in enumerate(truth):
        tokens, start = t["prompt"] + t["response"], len(t["prompt"]) - 1
        minibatch = seq_id // 4
        prox = token_logps(prox_model, tokens)[start:]
        theta_model = copy.deepcopy(prox_model)
        theta_model.load_state_dict(workers.weights[minibatch])
        theta = token_logps(theta_model, tokens)[start:]
        group = [u["reward"] for u in truth[2 * (seq_id // 2) : 2 * (seq_id // 2) + 2]]
        advantage = (t["reward"] - np.mean(group)) / (np.std(group, ddof=1) + 1e-6)
        kept = [j for j, m in enumerate(t["mask"]) if m]  # the tool's tokens are no rows
        for pos, j in enumerate(kept):
            expected[seq_id, pos] = dict(
                minibatch=minibatch,
                token_id=t["response"][j],
                behave_logp=t["behave"][j],
                behave_version=t["version"],
                prox_logp=float(prox[j]),
                theta_logp=float(theta[j]),
                loss_mask=bool(rs_mask[seq_id][j]),
                advantage=advantage if rs_mask[seq_id][j] else 0.0,
                reward=t["reward"],
            )
    assert len(rows) == len(expected)
    for r in rows:
        want = expected[r["seq_id"], r["pos"]]
        assert (r["step"], r["n_minibatches"]) == (verl_step.GLOBAL_STEPS - 1, 2)
        for key in ("minibatch", "token_id", "behave_version", "loss_mask"):
            assert r[key] == want[key], key
        for key in ("behave_logp", "prox_logp", "theta_logp", "advantage", "reward"):
            assert r[key] == pytest.approx(want[key], abs=1e-5), key
    assert 0 < sum(not r["loss_mask"] for r in rows) < len(rows)  # rejected tokens kept, out of the loss
    validation = validate_paths([tmp_path])  # each file's rules, then the run's findings
    assert all(r.ok for r in validation.reports) and not validation.findings


def test_bypass_mode_records_no_prox(tmp_path, verl_step):
    with pytest.warns(FakeProxWarning, match="bypass_mode"):
        rows, truth, *_ = verl_step.run_step(tmp_path, bypass=True)
    assert rows and all(r["prox_logp"] is None for r in rows)
    assert all(r["loss_mask"] for r in rows)  # no rejection sampling in bypass mode here


def test_needs_the_behaviour_log_probs(tmp_path, verl_step):
    config = verl_step.trainer_config()
    config.actor_rollout_ref.rollout.calculate_log_probs = False
    trainer = SimpleNamespace(config=config)
    with pytest.raises(ValueError, match="calculate_log_probs"), warnings.catch_warnings():
        record_actor_updates(trainer, tmp_path, "verl")


def test_recording_loss_returns_verls_loss(tmp_path, verl_step):
    """The wrapped loss is verl's: same value, same gradient."""
    rows, truth, data, workers, prox_model = verl_step.run_step(tmp_path)
    loss_fn = pickle.loads(pickle.dumps(workers.loss_fn))  # a fresh worker's copy: it opens its own hook
    loss_fn.out_dir = tmp_path / "again"
    micro = next(
        iter(
            verl_step.prepare_micro_batches(data=verl_step.one_micro_batch(data), same_micro_num_in_dp=False)[
                0
            ]
        )
    )
    output = {"log_probs": verl_step.engine_log_probs(prox_model, micro["input_ids"])}
    recorded, _ = loss_fn(model_output=output, data=micro, dp_group=None)
    plain, _ = loss_fn.loss_fn(model_output=output, data=micro, dp_group=None)
    assert float(recorded.detach()) == float(plain.detach())
    params = list(prox_model.parameters())
    for a, b in zip(
        torch.autograd.grad(recorded, params, retain_graph=True),
        torch.autograd.grad(plain, params),
        strict=True,
    ):
        assert torch.equal(a, b)
    loss_fn.hook.close()
