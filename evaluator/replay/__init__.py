"""Stage 3, replay: token logs -> every estimator and metric -> the store. `pipeline` says it in order
(digest -> validate -> summarise, in workers -> ingest); below it `summarise` (a file's summaries, by
ranges of record batches), `batch` (one record batch through the estimators and metrics), `accumulators`
(the dense moments and sketch counts), `histograms` (sketch counts: numpy, or `kernels`, the compiled
loop, for a batch of many tokens), `pairing` (AReaL's shipped version pairing), and the plumbing: `workers`
and `worker` (the process pool), `ray_runner`.

May import: `evaluator.validate`, `evaluator.store`, `evaluator.formulas`, the base modules and `schemas`;
never the gate or anything that only reads the store."""

from evaluator.replay.outcomes import FileOutcome, ReplayReport
from evaluator.replay.pipeline import check_and_summarise, replay

__all__ = ["FileOutcome", "ReplayReport", "check_and_summarise", "replay"]
