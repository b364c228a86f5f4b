"""Stage 5, the CI gate: a judge over the metrics store. `judge` applies a thresholds file's checks to
the store's summaries (pass, warn, fail, skip per check and run); `report` renders the verdicts (table,
JSON, JUnit XML, Markdown).

May import: `evaluator.store` (reading only), the base modules and `schemas`."""

from evaluator.gate.judge import DEFAULT_THRESHOLDS, GateResult, Verdict, judge, run_gate, selection_stats

__all__ = ["DEFAULT_THRESHOLDS", "GateResult", "Verdict", "judge", "run_gate", "selection_stats"]
