"""`proxaudit watch`: follow a training run's token logs (or its trainer's dumps) as they are written, replay
each complete file into the store, judge the runs again as data arrives, and raise an alert on each change
of state. `completeness` (which files of a folder listing are whole, per trainer), `listing` (the folders'
files), `dumps` (a trainer's dump files imported), `judge` (a verdict per run: the one function watch reads
verdicts through), `trends` (the trend test on a store's runs), `alerts` (the state machine), `sinks` (the
alerts file, the webhook, and `state`, what a trainer polls), `progress` (the progress line), `scalars`
(each run's final steps to TensorBoard and W&B, as `proxaudit export` writes them), `look` and
`look_worker` (a look's replay and judging, in a process of its own), `loop` (`watch`).
Importing the package loads only what `state` needs (no store, no replay): a trainer polls it.

May import: `evaluator.replay`, `evaluator.gate` and the read stage (`evaluator.verdict`), the store
(reading), `evaluator.export`, the importers, `evaluator.formulas`, the base modules and `schemas`; never
the CLI.
"""

from evaluator.watch.alerts import Alert, RunState
from evaluator.watch.sinks import read_alerts, state

__all__ = ["Alert", "RunState", "read_alerts", "state"]
