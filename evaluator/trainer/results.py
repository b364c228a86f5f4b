"""What a reference-trainer run did: its per-step curves (`TrainResult`), the progress line while it
trains and the report after it."""

from __future__ import annotations

import csv
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from evaluator.trainer.engine import Engine


class Args(Protocol):
    """The options of a run its progress line and report say (`evaluator.trainer.train.Args`)."""

    steps: int
    prox_method: str
    out_dir: str


@dataclass
class TrainResult:
    """Per-step curves of one run, and the files the hook wrote."""

    reward: list[float] = field(default_factory=list)
    staleness_max: list[int] = field(default_factory=list)
    staleness_mean: list[float] = field(default_factory=list)
    mixed_fraction: list[float] = field(default_factory=list)
    """fraction of responses whose tokens carry more than one version"""
    response_tokens: list[float] = field(default_factory=list)
    """mean response length per step"""
    train_seconds: list[float] = field(default_factory=list)
    """trainer time per step: the prox pass (if any) and the minibatch updates, with the hook calls"""
    recompute_seconds: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    """wall time per step: the engine's decoding and the trainer's step"""
    hooked: list[bool] = field(default_factory=list)
    dropped_groups: int = 0
    files: list = field(default_factory=list)
    curve: Path | None = None
    """the per-step curves as CSV (`_{run_id}-curve.csv` in out_dir)"""
    writer_seconds: float = 0.0
    """CPU time of the hook's writer thread (it runs beside the trainer)"""
    record_seconds: float = 0.0
    """time the trainer spent inside the hook's `record` calls"""
    records: int = 0

    def write_curve(self, path: Path) -> None:
        columns = ("reward", "staleness_mean", "staleness_max", "mixed_fraction", "response_tokens")
        with open(path, "w", newline="") as sink:
            writer = csv.writer(sink)
            writer.writerow(["step", *columns, "train_seconds", "step_seconds"])
            for i in range(len(self.reward)):
                values = [getattr(self, c)[i] for c in (*columns, "train_seconds", "step_seconds")]
                writer.writerow([i, *(f"{v:.6g}" for v in values)])
        self.curve = path


def note_step(result: TrainResult, batch: dict, step: int, stats: dict, hooked: bool) -> None:
    resp, versions = batch["loss_mask"], batch["versions"]
    staleness = (step - versions)[resp]  # (n_tokens,)
    v_hi = torch.where(resp, versions, -1).max(1).values  # (B,)
    v_lo = torch.where(resp, versions, 1 << 30).min(1).values  # (B,)
    result.reward.append(float(batch["rewards"].mean()))
    result.staleness_max.append(int(staleness.max()))
    result.staleness_mean.append(float(staleness.float().mean()))
    result.mixed_fraction.append(float((v_hi > v_lo).float().mean()))
    result.response_tokens.append(float(resp.sum(1).float().mean()))
    result.train_seconds.append(stats["train_seconds"])
    result.recompute_seconds.append(stats["recompute_seconds"])
    result.hooked.append(hooked)


def progress(result: TrainResult, step: int, args: Args, engine: Engine, started: float) -> str:
    """One progress line: step, reward (now and at the start), staleness, step time, tokens/s, ETA."""
    elapsed = time.perf_counter() - started
    k = min(10, len(result.reward))
    eta = elapsed / (step + 1) * (args.steps - step - 1)
    return (
        f"step {step + 1:4d}/{args.steps}  reward {np.mean(result.reward[-k:]):.3f} (first {k} steps "
        f"{np.mean(result.reward[:k]):.3f})  staleness mean {result.staleness_mean[-1]:.2f} max "
        f"{result.staleness_max[-1]}  mixed-version responses {result.mixed_fraction[-1]:.2f}  "
        f"step {result.step_seconds[-1]:.2f} s  {engine.tokens_generated / elapsed:,.0f} generated tok/s  "
        f"ETA {eta / 60:.1f} min"
    )


def report(result: TrainResult, args: Args) -> str:
    """What the run did: the reward curve's start and end, staleness, step times, files."""
    k = max(1, len(result.reward) // 5)
    train_ms = 1e3 * float(np.mean(result.train_seconds))
    lines = [
        f"reward: first {k} steps {np.mean(result.reward[:k]):.3f} -> "
        f"last {k} steps {np.mean(result.reward[-k:]):.3f}",
        f"staleness: max {max(result.staleness_max)}, mean {np.mean(result.staleness_mean):.2f}; "
        f"responses with mixed versions: {np.mean(result.mixed_fraction):.0%}; groups dropped as too stale: "
        f"{result.dropped_groups}; mean response {np.mean(result.response_tokens):.1f} tokens",
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
        lines.append(f"token log: {len(result.files)} files in {args.out_dir}; reward curve: {result.curve}")
    return "\n".join(lines)
