"""A simulated training run for `proxaudit watch`'s tests and benchmark: a process that writes synthetic token
logs (`evaluator.trainer.synthetic`) at intervals, each file the way the hook writes one (a temporary name,
then a rename: `evaluator.logio.write_log_atomic`), with a drift planted from a chosen step: from there the
policy moves faster every step (the synthetic model's `drift`, each token's logit slope per version, grows
linearly, up to a chosen step if one is given), so the approximation's error at staleness >= 1, and its
excess over the engine floor, grow.

    python -m evaluator.trainer.simulated_run OUT --files 18 --interval 10 --tokens-per-step 1048576

prints `PATH UNIX_TIME` once each file is in place (its rename done).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from evaluator.logio import write_log_atomic
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps


@dataclass(frozen=True)
class SimulatedRun:
    run_id: str = "simulated"
    """`run_id` of every row."""
    seed: int = 0
    """Seed of the synthetic generator (each step draws its own stream from it)."""
    tokens_per_step: int = 4096
    """Response tokens per trainer step."""
    steps_per_file: int = 1
    """Steps in each file (the hook writes a file every few steps)."""
    drift: float = 0.05
    """The policy's speed before the planted drift: the std of each token's logit slope per version."""
    drift_from_step: int = 20
    """The step from which the policy speeds up."""
    drift_rate: float = 0.01
    """How much `drift` grows per step after `drift_from_step`."""
    drift_until_step: int | None = None
    """The step from which `drift` stops growing (None: it grows to the run's end). From there the files
    are alike: each file's values spread as widely as the last's, so what a reader keeps per file holds."""

    def drift_at(self, step: int) -> float:
        """drift(step) = drift + drift_rate * max(0, min(step, drift_until_step) - drift_from_step)."""
        until = step if self.drift_until_step is None else min(step, self.drift_until_step)
        return self.drift + self.drift_rate * max(0, until - self.drift_from_step)

    def steps(self, first: int, n: int) -> pa.Table:
        """The rows of steps `[first, first + n)`, each step with its own drift."""
        spec = SyntheticSpec(run_id=self.run_id, seed=self.seed, tokens_per_step=self.tokens_per_step)
        parts = [
            synthetic_steps(dataclasses.replace(spec, drift=self.drift_at(s)), s, 1)
            for s in range(first, first + n)
        ]
        return pa.concat_tables(parts)

    def file_name(self, i: int) -> str:
        """The hook's name for file `i`: `{run_id}-step{first}-{last}-{i}.parquet`."""
        first = i * self.steps_per_file
        return f"{self.run_id}-step{first:06d}-{first + self.steps_per_file - 1:06d}-{i:04d}.parquet"

    def write_file(self, out: Path, i: int) -> Path:
        """File `i` (steps `i * steps_per_file ...`), written atomically under `out`."""
        return write_log_atomic(
            self.steps(i * self.steps_per_file, self.steps_per_file), Path(out) / self.file_name(i)
        )


def write_run(
    run: SimulatedRun,
    out: Path,
    files: int | None,
    interval: float,
    *,
    start: int = 0,
    on_written: Callable[[Path, float], None] | None = None,
) -> None:
    """Write files `start, start + 1, ...` (`files` of them; None: until stopped) under `out`, one every
    `interval` seconds on a fixed schedule (each file is made during the wait before its turn, then
    renamed into place), calling `on_written(path, time)` once each is in place."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.staging"  # beside `out`: the rename into it is atomic
    i, due = start, time.time()
    while files is None or i < start + files:
        made = run.write_file(staging, i)
        time.sleep(max(0.0, due - time.time()))
        path = out / made.name
        made.replace(path)
        if on_written is not None:
            on_written(path, time.time())
        i, due = i + 1, due + interval


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder to write the token logs into")
    parser.add_argument("--files", type=int, default=None, help="how many files (default: until killed)")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between two files")
    parser.add_argument("--start", type=int, default=0, help="the index of the first file")
    for field in dataclasses.fields(SimulatedRun):
        kind = int if field.default is None else type(field.default)  # drift_until_step: an int or None
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=kind, default=field.default)
    args = vars(parser.parse_args(argv))
    out, files, interval, start = (args.pop(k) for k in ("out", "files", "interval", "start"))
    run = SimulatedRun(**args)

    def written(path: Path, at: float) -> None:
        print(f"{path} {at:.3f}", flush=True)

    write_run(run, out, files, interval, start=start, on_written=written)


if __name__ == "__main__":
    main(sys.argv[1:])
