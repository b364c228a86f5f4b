"""The hook's overhead on the reference trainer: step time with the hook on and off, in one run.

Steps alternate between recorded and not recorded (ABAB...), so drift in step time (responses grow as
the policy learns, other load on the machine) falls on both sides alike. The figure is the trainer's own
step (prox pass and minibatch updates, where the hook's calls happen); the writer thread's CPU time is
reported beside it, since on a CPU-only machine it competes with the trainer for cores.
"""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass

import numpy as np
import pyarrow.parquet as pq

from evaluator.trainer.train import Args, train

WARMUP_STEPS = 4


@dataclass(frozen=True)
class HookBench:
    steps: int
    on_ms: float
    off_ms: float
    on_median_ms: float
    off_median_ms: float
    writer_seconds: float
    record_seconds: float
    records: int
    hooked_train_seconds: float
    train_seconds: float
    rows: int

    @property
    def overhead(self) -> float:
        """Extra step time with the hook on, as a fraction of the step time with it off."""
        return self.on_ms / self.off_ms - 1.0

    def render(self) -> str:
        return "\n".join(
            [
                f"hook overhead on the reference trainer ({self.steps} steps, alternating on/off):",
                f"  train step, hook on : mean {self.on_ms:.2f} ms  median {self.on_median_ms:.2f} ms",
                f"  train step, hook off: mean {self.off_ms:.2f} ms  median {self.off_median_ms:.2f} ms",
                f"  overhead: {100 * self.overhead:+.2f}% (mean), "
                f"{100 * (self.on_median_ms / self.off_median_ms - 1):+.2f}% (median); target < 2%",
                f"  inside record(): {1e6 * self.record_seconds / self.records:.0f} us per call, "
                f"{100 * self.record_seconds / self.hooked_train_seconds:.2f}% of the recorded steps' time",
                f"  writer thread: {self.writer_seconds:.2f} s CPU for {self.rows:,} rows "
                f"({100 * self.writer_seconds / self.train_seconds:.1f}% of the trainer's step time, "
                "on another core)",
            ]
        )


def bench_hook(args: Args) -> HookBench:
    """Train with the hook recording every other step, into a temporary folder; compare step times."""
    with tempfile.TemporaryDirectory(prefix="proxaudit-bench-hook-") as out:
        run = dataclasses.replace(args, out_dir=out, log_every=0)
        result = train(run, record_step=lambda step: step % 2 == 0)
        rows = sum(pq.read_metadata(f).num_rows for f in result.files)
    seconds = np.array(result.train_seconds[WARMUP_STEPS:])
    hooked = np.array(result.hooked[WARMUP_STEPS:])
    return HookBench(
        steps=len(seconds),
        on_ms=1e3 * float(seconds[hooked].mean()),
        off_ms=1e3 * float(seconds[~hooked].mean()),
        on_median_ms=1e3 * float(np.median(seconds[hooked])),
        off_median_ms=1e3 * float(np.median(seconds[~hooked])),
        writer_seconds=result.writer_seconds,
        record_seconds=result.record_seconds,
        records=result.records,
        hooked_train_seconds=float(np.sum(np.array(result.train_seconds)[np.array(result.hooked)])),
        train_seconds=float(np.sum(result.train_seconds)),
        rows=rows,
    )
