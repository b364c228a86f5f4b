"""Stage 4, the metrics store (DuckDB): `writer` (the one writer: lock, private working copy, one
transaction per file), `repeats` (a file repeating stored tokens: a duplicate, or a re-saved copy), `files`
(the files beside the store and the atomic publish of the working copy), `findings` (the warnings and
check outcomes a replay stores with its runs), `reader` (read-only, checked opens running proxaudit's
own SQL) and `trainers` (each trainer's own mismatch figure read from the view `trainer_mismatch`, in
sentences).

May import: `evaluator.validate` (the token-identity rule and the findings it stores), `evaluator.formulas`,
the base modules (`errors`, `problems`) and `schemas`. Never the replay pipeline or anything that reads
the store."""

from evaluator.sources import file_digest
from evaluator.store.reader import StoreBusy, check_db_path, open_store
from evaluator.store.writer import FileSummary, StoreWriter

__all__ = ["FileSummary", "StoreBusy", "StoreWriter", "check_db_path", "file_digest", "open_store"]
