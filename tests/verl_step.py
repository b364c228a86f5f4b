"""verl's own code driven for one training step (0.9.1, pinned in requirements-trainers.txt), for
`tests/test_hook_verl.py`: samples in the agent loop's layout, the driver's old log-probs, rollout rejection
sampling and GRPO advantages, verl's `PPOTrainer._update_actor`, and an in-process worker group running
verl's mini-batch iterator, micro-batch split and loss on a tiny model on CPU. A module of its own so that
verl is imported only by the tests that run it, not when pytest collects them."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import torch
import verl
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl import DataProto
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.trainer.ppo.v1 import trainer_sync
from verl.utils import tensordict_utils as tu
from verl.workers.engine.utils import prepare_micro_batches
from verl.workers.utils.padding import response_from_nested, response_to_nested

from evaluator.hook.verl import record_actor_updates
from tests.tiny_lm import TinyLM, perturbed, sample

GLOBAL_STEPS = 6  # the trainer's global_steps: its weights are version 5
PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [2, 4]]
N = 2  # rollout.n
TOOL = [9, 9]  # a tool's output inside one response: response_mask 0, not the policy's tokens


def trainer_config(bypass: bool = False):
    config = OmegaConf.load(Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml")
    config.data.train_batch_size = len(PROMPTS)
    actor = config.actor_rollout_ref.actor
    actor.ppo_mini_batch_size, actor.ppo_micro_batch_size_per_gpu, actor.use_dynamic_bsz = 2, 2, False
    actor.ppo_epochs, actor.shuffle, actor.rollout_n = 1, False, N
    config.actor_rollout_ref.rollout.n = N
    config.actor_rollout_ref.rollout.calculate_log_probs = True
    correction = config.algorithm.rollout_correction
    correction.rollout_rs, correction.rollout_rs_threshold = "token_k1", "0.5_2.0"  # rejects some tokens
    correction.bypass_mode = bypass
    return config


def engine_log_probs(model: TinyLM, input_ids) -> torch.Tensor:
    """What verl's engine gives the loss as `model_output["log_probs"]`: nested like `input_ids`, value i the
    log-prob of token i + 1 (labels rolled over the packed sequences)."""
    ids, offsets = input_ids.values(), input_ids.offsets()
    logits = model(ids[None], cu_seq_lens_q=offsets).logits[0]  # (N, V)
    logp = torch.log_softmax(logits.float(), -1).gather(-1, torch.roll(ids, -1)[:, None])[:, 0]  # (N,)
    return torch.nested.nested_tensor_from_jagged(logp, offsets=offsets)


def rollout(model: TinyLM):
    """Samples as the agent loop stores them (agent_loop_tq.py: AgentLoopOutput.as_dict, loss_mask, input_ids,
    position_ids, extra_fields with the generating weights' global_steps) and what the test knows of each."""
    old = {3: perturbed(model, 3), 4: perturbed(model, 4), 5: model}
    fields, truth = [], []
    for p, prompt in enumerate(PROMPTS):
        for g in range(N):
            n = 4 + (p + g) % 3
            version = 3 + (p + g) % 3
            response, behave = sample([old[version], old[version]], prompt, n, n, seed=10 * p + g)
            mask = [1] * n
            if (p, g) == (1, 0):  # a tool call: its output is in the response, out of the policy's tokens
                response, behave, mask = (
                    response[:2] + TOOL + response[2:],
                    behave[:2] + [0.0, 0.0] + behave[2:],
                    [1, 1, 0, 0] + mask[2:],
                )
            score = [0.0] * len(response)
            score[-1] = float(sum(response) % 3 == 0)
            seq = prompt + response
            fields.append(
                {
                    "prompts": torch.tensor(prompt),
                    "responses": torch.tensor(response),
                    "response_mask": torch.tensor(mask),
                    "loss_mask": torch.tensor(mask),
                    "rollout_log_probs": torch.tensor(behave),
                    "rm_scores": torch.tensor(score),
                    "input_ids": torch.tensor(seq),
                    "position_ids": torch.arange(len(seq)),
                    "uid": torch.tensor(p),
                    "extra_fields": {"min_global_steps": version, "max_global_steps": version},
                }
            )
            truth.append(
                dict(
                    prompt=prompt,
                    response=response,
                    behave=behave,
                    mask=mask,
                    version=version,
                    reward=score[-1],
                )
            )
    return tu.list_of_dict_to_tensordict(fields), truth


def prepare_step(data: TensorDict, model: TinyLM, config) -> TensorDict:
    """The driver's part of a step (`_compute_old_log_prob`, `_compute_advantage`), with verl's functions."""
    response_mask = data["response_mask"]
    if config.algorithm.rollout_correction.bypass_mode:
        data["old_log_probs"] = data["rollout_log_probs"]
    else:
        with torch.no_grad():
            data["old_log_probs"] = response_from_nested(
                engine_log_probs(model, data["input_ids"]), response_mask
            )
    padded = DataProto(
        batch=data.select(
            "response_mask", "rm_scores", "rollout_log_probs", "old_log_probs"
        ).to_padded_tensor()
    )
    if not config.algorithm.rollout_correction.bypass_mode:
        padded, _ = compute_rollout_correction_and_add_to_batch(padded, config.algorithm.rollout_correction)
    index = np.array(data["uid"].tolist(), dtype=object)
    advantages, _ = compute_grpo_outcome_advantage(
        padded.batch["rm_scores"], padded.batch["response_mask"], index
    )
    data["advantages"] = response_to_nested(advantages, response_mask)
    data["response_mask"] = response_to_nested(padded.batch["response_mask"], response_mask)
    return data


class WorkerGroup:
    """The actor worker group, in-process: `set_loss_fn` pickles the loss function as Ray would, and
    `update_actor` runs `train_mini_batch` and the engine's micro-batch loop (engine_workers.py,
    workers/engine/fsdp/transformer_impl.py) with verl's functions, one SGD step per mini-batch."""

    def __init__(self, model: TinyLM, data: TensorDict) -> None:
        self.model, self.data, self.weights = model, data, []
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.5)

    def set_loss_fn(self, loss_fn) -> None:
        self.loss_fn = pickle.loads(pickle.dumps(loss_fn))

    def update_actor(self, batch):
        data = self.data.clone()
        for key, value in batch.extra_info.items():  # what _async_meta_to_realdata does with extra_info
            tu.assign_non_tensor_data(data, key, value)
        options = {k: tu.pop(data, k) for k in ("mini_batch_size", "epochs", "seed", "dataloader_kwargs")}
        for mini in tu.make_iterator(data, **options):
            tu.assign_non_tensor(mini, use_dynamic_bsz=False, micro_batch_size_per_gpu=1, dp_size=1)
            tu.assign_non_tensor(mini, batch_num_tokens=int(mini["loss_mask"].values().sum()))
            micro_batches, _ = prepare_micro_batches(data=mini, same_micro_num_in_dp=False)
            self.weights.append(copy.deepcopy(self.model.state_dict()))
            for micro in micro_batches:
                output = {"log_probs": engine_log_probs(self.model, micro["input_ids"])}
                loss, _ = self.loss_fn(model_output=output, data=micro, dp_group=None)
                loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
        return {"metrics": {"mfu": [0.0]}}


def run_step(tmp_path: Path, bypass: bool = False):
    model = TinyLM(seed=0)
    prox_model = copy.deepcopy(model)
    config = trainer_config(bypass)
    data, truth = rollout(model)
    data = prepare_step(data, model, config)
    trainer = trainer_sync.PPOTrainerSync.__new__(trainer_sync.PPOTrainerSync)  # the default trainer_mode
    workers = WorkerGroup(model, data)
    trainer.__dict__.update(
        config=config,
        global_steps=GLOBAL_STEPS,
        local_trigger_step=0,
        parameter_sync_step=1,
        distillation_config=None,
        actor_rollout_wg=workers,
    )
    record_actor_updates(trainer, tmp_path, "verl")
    trainer._update_actor(SimpleNamespace(extra_info={}), metrics={})
    workers.loss_fn.hook.close()
    rows = [r for f in sorted(tmp_path.glob("rank0/*.parquet")) for r in pq.read_table(f).to_pylist()]
    return rows, truth, data, workers, prox_model


def one_micro_batch(data: TensorDict) -> TensorDict:
    mini = tu.chunk_tensordict(data, 4)[0]  # two samples
    for key, value in dict(
        proxaudit_step=0,
        proxaudit_minibatch=0,
        proxaudit_n_minibatches=1,
        proxaudit_update=99,
        global_batch_size=2,
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=2,
        dp_size=1,
        batch_num_tokens=int(mini["loss_mask"].values().sum()),
    ).items():
        tu.assign_non_tensor_data(mini, key, value)
    return mini
