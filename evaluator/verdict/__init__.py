"""Stage 8, the verdict: each run's decision (`Decision`: ship, ship up to a staleness, do not ship, or
cannot tell yet), made from the gate's verdicts on it (`decision`), said in one sentence a person acts on
(`words`, with the engine floor's own verdict, `floor`, and the trainer options it may recommend,
`options`), and rendered by the gate's reports (`report`) and `summary` (`summary`, with the public views
as tables, and `query`). `judge_store` (an open connection) and `judge_db` compute the decisions of a store;
`what_if` the decisions under other losses (`replay --loss a,b,c`).

May import: `evaluator.gate`, `evaluator.store` (reading only; `what_if` records its table through the
store's writer), `evaluator.replay` (`what_if`'s scratch replays), `evaluator.validate` (the words for a
run without ground truth), `evaluator.formulas`, the base modules and `schemas`."""

from evaluator.verdict.decision import ACTIONS, Decision, Judgement, Reason
from evaluator.verdict.judging import judge_db, judge_store
from evaluator.verdict.words import run_line, sentence

__all__ = ["ACTIONS", "Decision", "Judgement", "Reason", "judge_db", "judge_store", "run_line", "sentence"]
