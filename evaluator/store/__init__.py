"""Stage 4, the metrics store (a DuckLake): `lake` (where a store is; attaching it with the extensions loaded
by path), `writer` (any number of writers; `staging` writes a file's Parquet files before the commit that
registers them, `group` registers the staged files of several files in one commit), `commits` (a
transaction run again while another writer commits first), `repeats` (a file repeating stored tokens: a
duplicate, or a re-saved copy), `evidence` (each file's evidence for the findings), `derived` and
`findings` (what is judged on a whole run, from the stored per-file rows), `intervals`, `maintenance`
(compaction, converting an old single-file store), `reader` (read-only, checked opens running proxaudit's
own SQL), `memo` (a reader's connection that answers each repeated query once) and `trainers` (each
trainer's own mismatch figure read from the view `trainer_mismatch`, in sentences).

May import: `evaluator.validate` (the token-identity rule and the findings it stores), `evaluator.formulas`,
the base modules (`errors`, `problems`) and `schemas`. Never the replay pipeline or anything that reads
the store."""

from evaluator.sources import file_digest
from evaluator.store.reader import StoreBusy, connect_store, open_store
from evaluator.store.staging import FileSummary
from evaluator.store.writer import StoreWriter

__all__ = ["FileSummary", "StoreBusy", "StoreWriter", "connect_store", "file_digest", "open_store"]
