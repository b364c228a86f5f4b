"""The AReaL integration on AReaL's own code (1.0.4, pinned in requirements-trainers.txt): the batch of
`RLVRWorkflow.arun_episode`'s layout, AReaL's `PPOActor.compute_logp`, `compute_advantages` and `ppo_update`
on its FSDP engine's own `train_batch` / `forward_batch` path (micro-batches packed with `cu_seqlens`), a tiny
model on CPU. Every recorded column is compared with an independent per-sequence recompute."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
import torch

from evaluator.hook import TokenLogHook
from evaluator.hook.areal import record_ppo_updates
from evaluator.hook.trainers import FakeProxWarning
from evaluator.validate import validate_paths
from tests.tiny_lm import TinyLM, perturbed, sample, token_logps

VERSION = 5  # the engine's version: AReaL's global step
PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [2, 4], [3, 3, 3], [5, 1]]
GROUP = 2  # responses per prompt


@pytest.fixture(scope="module")
def areal() -> SimpleNamespace:
    """AReaL's actor and FSDP engine modules and its config classes, imported when this module's tests run,
    not when it is collected: every pytest-xdist worker collects every module, and AReaL's imports cost
    about 15 CPU-seconds."""
    actor = pytest.importorskip("areal.trainer.ppo.actor", reason="AReaL 1.0.4: make install")
    engine = pytest.importorskip("areal.engine.fsdp_engine", reason="AReaL's FSDP engine does not import")
    from areal.api.cli_args import MicroBatchSpec, PPOActorConfig

    return SimpleNamespace(
        actor=actor, engine=engine, MicroBatchSpec=MicroBatchSpec, PPOActorConfig=PPOActorConfig
    )


@pytest.fixture(scope="module")
def process_group(tmp_path_factory):
    """AReaL's engine all-reduces over its data-parallel group: a gloo group of one process."""
    import torch.distributed as dist

    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def make_engine(areal: SimpleNamespace, config, model: TinyLM, group, model_type: str = "llama"):
    """AReaL's FSDPPPOActor without FSDP: its own train_batch / forward_batch and everything under them, on
    a tiny model; only the optimizer step (fsdp2_clip_grad_norm over device meshes) is a plain SGD step."""
    engine = areal.engine.FSDPPPOActor.__new__(areal.engine.FSDPPPOActor)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    engine.__dict__.update(
        config=config,
        model=model,
        optimizer=optimizer,
        device=torch.device("cpu"),
        enable_tree_training=False,
        is_offload=False,
        model_config=SimpleNamespace(model_type=model_type),
        parallel_helper=SimpleNamespace(sp_size=1, tp_size=1, dp_size=1, tp_group=None),
        dp_group=group,
        logger=SimpleNamespace(info=lambda *a, **k: None, warning=lambda *a, **k: None),
        _version=VERSION,
        weights=[],  # the weights before each optimizer step (the test's own record)
    )

    def optimizer_step():
        engine.weights.append(copy.deepcopy(model.state_dict()))
        optimizer.step()
        return {"update_successful": 1.0, "grad_norm": 0.0, "lr": 0.5}

    engine.optimizer_step = optimizer_step
    engine.actor = areal.actor.PPOActor(config, engine)
    return engine


def actor_config(areal: SimpleNamespace, **overrides):
    settings = dict(
        experiment_name="proxaudit",
        trial_name="hook",
        path="",
        ppo_n_minibatches=2,
        mb_spec=areal.MicroBatchSpec(n_mbs=2),  # two micro-batches a minibatch: the loss runs twice an update
        use_decoupled_loss=True,
        prox_logp_method="metrics",
        kl_ctl=0.0,
        adv_norm=None,
        reward_norm=None,
        temperature=1.0,
    )
    return areal.PPOActorConfig(**(settings | overrides))


def rollout(current: TinyLM) -> tuple[list[dict], list[dict]]:
    """Trajectories as AReaL's RLVRWorkflow.arun_episode returns them (areal/workflow/rlvr.py), and what
    the test knows of each: tokens, behaviour log-probs, versions (a resume from version 3 to 4 in some)."""
    old = {3: perturbed(current, 3), 4: perturbed(current, 4)}
    trajectories, truth = [], []
    for p, prompt in enumerate(PROMPTS):
        for g in range(GROUP):
            n = 4 + (p + g) % 3
            switch = n if (p + g) % 2 else 2  # every other response resumed under version 4 at token 2
            response, behave = sample([old[3], old[4]], prompt, switch, n, seed=10 * p + g)
            versions = [3] * switch + [4] * (n - switch)
            reward = float(sum(response) % 3 == 0)
            seq = prompt + response
            res = {
                "input_ids": torch.tensor(seq, dtype=torch.int32),
                "loss_mask": torch.tensor([0] * len(prompt) + [1] * n, dtype=torch.int32),
                "logprobs": torch.tensor([0.0] * len(prompt) + behave, dtype=torch.float32),
                "versions": torch.tensor([-1] * len(prompt) + versions, dtype=torch.int32),
                "attention_mask": torch.ones(len(seq), dtype=torch.bool),
                "rewards": torch.tensor(reward, dtype=torch.float32),
            }
            trajectories.append({k: v.unsqueeze(0) for k, v in res.items()})
            truth.append(
                dict(prompt=prompt, response=response, behave=behave, versions=versions, reward=reward)
            )
    return trajectories, truth


def train_one_step(engine, trajectories: list[dict]) -> None:
    """What PPOTrainer.train does with a rollout batch (areal/trainer/rl_trainer.py), actor part."""
    config = engine.actor.config
    if config.should_compute_prox_logp():
        for traj, logp in zip(trajectories, engine.compute_logp(trajectories), strict=True):
            traj["prox_logp"] = logp
    engine.ppo_update(engine.compute_advantages(trajectories))


def recorded(out: Path) -> list[dict]:
    return [r for f in sorted(out.glob("*.parquet")) for r in pq.read_table(f).to_pylist()]


def expected_rows(engine, truth: list[dict], prox_model: TinyLM) -> dict[tuple[int, int], dict]:
    """Each response token's values, recomputed one sequence at a time with the weights each minibatch
    trained from (engine.weights), keyed by (seq_id, pos); the minibatch comes from the recording."""
    expected = {}
    for seq_id, t in enumerate(truth):
        tokens, start = t["prompt"] + t["response"], len(t["prompt"]) - 1
        prox = token_logps(prox_model, tokens)[start:]
        for pos, token in enumerate(t["response"]):
            expected[seq_id, pos] = dict(
                token_id=token,
                behave_logp=t["behave"][pos],
                behave_version=t["versions"][pos],
                prox_logp=float(prox[pos]),
                advantage=t["reward"],  # GAE with gamma = lambda = 1, no critic, no KL: the reward
                reward=t["reward"],
                theta=lambda weights, tokens=tokens, start=start, pos=pos: float(
                    token_logps(load(prox_model, weights), tokens)[start + pos]
                ),
            )
    return expected


def load(model: TinyLM, weights: dict) -> TinyLM:
    other = copy.deepcopy(model)
    other.load_state_dict(weights)
    return other


@pytest.mark.parametrize(
    "model_type", ["llama", "qwen3_moe"], ids=["dict-attention-mask", "no-attention-mask"]
)
def test_every_column_equals_a_per_sequence_recompute(tmp_path, process_group, areal, model_type):
    model = TinyLM(seed=0)
    prox_model = copy.deepcopy(model)  # the weights at the start of the step: the recompute's
    engine = make_engine(areal, actor_config(areal), model, process_group, model_type)
    trajectories, truth = rollout(model)
    with TokenLogHook(tmp_path, "areal") as hook:
        record_ppo_updates(engine, hook)
        train_one_step(engine, trajectories)
    rows = recorded(tmp_path)
    expected = expected_rows(engine, truth, prox_model)
    assert len(rows) == len(expected) == sum(len(t["response"]) for t in truth)
    assert len(engine.weights) == 2  # two minibatches, one optimizer step each
    for r in rows:
        want = expected[r["seq_id"], r["pos"]]
        assert (r["step"], r["n_minibatches"], r["loss_mask"]) == (VERSION, 2, True)
        assert r["token_id"] == want["token_id"]
        assert r["behave_version"] == want["behave_version"]
        assert r["behave_logp"] == pytest.approx(want["behave_logp"], abs=1e-6)
        assert r["prox_logp"] == pytest.approx(want["prox_logp"], abs=1e-5)
        assert r["theta_logp"] == pytest.approx(want["theta"](engine.weights[r["minibatch"]]), abs=1e-5)
        assert r["advantage"] == pytest.approx(want["advantage"], abs=1e-6)
        assert r["reward"] == want["reward"]
    by_seq = {}
    for r in rows:
        by_seq.setdefault(r["seq_id"], set()).add(r["minibatch"])
    assert all(len(m) == 1 for m in by_seq.values())  # a response trains in one minibatch of the step
    assert {m for ms in by_seq.values() for m in ms} == {0, 1}
    validation = validate_paths([tmp_path])  # each file's rules, then the run's findings
    assert all(r.ok for r in validation.reports) and not validation.findings


def test_without_decoupled_loss_prox_is_not_recorded(tmp_path, process_group, areal):
    """AReaL's default (use_decoupled_loss false): prox_logp is the rolled behaviour log-prob, a copy."""
    model = TinyLM(seed=0)
    engine = make_engine(areal, actor_config(areal, use_decoupled_loss=False), model, process_group)
    trajectories, truth = rollout(model)
    with TokenLogHook(tmp_path, "areal") as hook:
        with pytest.warns(FakeProxWarning, match="use_decoupled_loss"):
            record_ppo_updates(engine, hook)
        train_one_step(engine, trajectories)
    rows = recorded(tmp_path)
    assert len(rows) == sum(len(t["response"]) for t in truth)
    assert all(r["prox_logp"] is None for r in rows)
    behave = {(s, p): b for s, t in enumerate(truth) for p, b in enumerate(t["behave"])}
    assert [r["behave_logp"] for r in rows] == pytest.approx([behave[r["seq_id"], r["pos"]] for r in rows])


def test_recompute_logprob_without_decoupled_loss_records_nothing(tmp_path, process_group, areal):
    """compute_advantages then overwrites the behaviour log-probs with the recompute: no behave to record."""
    model = TinyLM(seed=0)
    config = actor_config(areal, use_decoupled_loss=False, recompute_logprob=True)
    engine = make_engine(areal, config, model, process_group)
    trajectories, _ = rollout(model)
    with TokenLogHook(tmp_path, "areal") as hook:
        with pytest.warns(FakeProxWarning, match="recompute_logprob"):
            record_ppo_updates(engine, hook)
        train_one_step(engine, trajectories)
    assert recorded(tmp_path) == []
    assert len(engine.weights) == 2  # training went on


def test_loglinear_records_no_prox_and_no_warning(tmp_path, process_group, areal):
    model = TinyLM(seed=0)
    engine = make_engine(areal, actor_config(areal, prox_logp_method="loglinear"), model, process_group)
    trajectories, _ = rollout(model)
    with TokenLogHook(tmp_path, "areal") as hook, warnings.catch_warnings():
        warnings.simplefilter("error", FakeProxWarning)
        record_ppo_updates(engine, hook)
        train_one_step(engine, trajectories)
    rows = recorded(tmp_path)
    assert rows and all(r["prox_logp"] is None and r["theta_logp"] is not None for r in rows)
