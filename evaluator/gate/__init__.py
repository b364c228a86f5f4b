"""Stage 7, the CI gate: a judge over the metrics store. `judge` applies a thresholds file's checks to the
store's figures (`evaluator.store.figures`) with the rules of `rules` (pass, warn, fail, skip per check and
run; a check at each staleness judged at every staleness 1 to S), into the `verdicts` of a `GateResult`.
`evaluator.verdict` turns them into each run's decision and renders it.

May import: `evaluator.store` (reading only), `evaluator.formulas`, `evaluator.validate` (the words for a run
without ground truth), the base modules and `schemas`."""

from evaluator.gate.judge import (
    DEFAULT_THRESHOLDS,
    evaluate,
    gate_on,
    load_thresholds,
    run_gate,
    staleness_limits,
)
from evaluator.gate.verdicts import GateResult, Level, StalenessLimit, Verdict

__all__ = [
    "DEFAULT_THRESHOLDS", "GateResult", "Level", "StalenessLimit", "Verdict", "evaluate", "gate_on",
    "run_gate", "staleness_limits", "load_thresholds",
]  # fmt: skip
