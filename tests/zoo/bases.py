"""The clean logs the zoo plants its bugs in: a synthetic log whose policy moves within a step more than
the noise (`synthetic`; `synthetic-long`, more steps of fewer tokens, for what needs a long run;
`synthetic-wide`, more responses a step, for what needs many responses per staleness level), and the real
language models' fixtures (SmolLM2-135M's `recompute` run, the tiny model's `toy-recompute` run), their
first 40 steps."""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps
from tests.zoo.edits import ppo_epochs

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SYNTHETIC = SyntheticSpec(run_id="zoo", tokens_per_step=1536, mean_length=24, drift=0.3, seed=3)
SYNTHETIC_SHAPES = {"synthetic": (1536, 12), "synthetic-long": (768, 24), "synthetic-wide": (4096, 12)}
"""Each synthetic base's tokens per step and steps."""
STEPS = 40
"""Steps of a fixture run the zoo reads (4 files of 10)."""
RUNS = {"smollm2": FIXTURES / "recompute", "toy": FIXTURES / "toy" / "toy-recompute"}


@cache
def _base(name: str) -> pa.Table:
    if name in SYNTHETIC_SHAPES:
        tokens, steps = SYNTHETIC_SHAPES[name]
        return synthetic_steps(replace(SYNTHETIC, tokens_per_step=tokens), 8, steps)
    folder, run = RUNS[name].parent, RUNS[name].name
    table = pa.concat_tables(pq.read_table(p) for p in sorted(folder.glob(f"{run}-*.parquet")))
    return table.filter(pc.less(table["step"], STEPS))


@cache
def base(name: str, epochs: bool = False) -> pa.Table:
    """The clean log `name` (a synthetic shape, `smollm2`, `toy`), with two PPO epochs if `epochs`."""
    return ppo_epochs(_base(name)) if epochs else _base(name)
