"""A worker process of `evaluator.replay.summarise`: summarise one range of a file's rows, pickle it
to a file.

`python -m evaluator.replay.range_worker PATH START END RESUMES PARAMS BATCH_ROWS OUT` (RESUMES: an Arrow IPC
file of the file's resumed-segment starts; PARAMS: the `DecisionParams` as JSON). A plain child process
rather than a `multiprocessing` pool: spawn would re-run the caller's main script in the child (a script
that calls `replay` without a `__main__` guard would recurse), and fork would copy Arrow's and DuckDB's
threads.
"""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

import pyarrow as pa

from evaluator.formulas.decisions import DecisionParams
from evaluator.replay.summarise import summarise_range


def main(argv: list[str]) -> None:
    path, start, end, resumes_file, params, batch_rows, out = argv
    with pa.memory_map(resumes_file) as source:
        resumes = pa.ipc.open_file(source).read_all()
    decisions = DecisionParams(**json.loads(params))
    part = summarise_range(path, (int(start), int(end)), resumes, decisions, int(batch_rows))
    Path(out).write_bytes(pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL))


if __name__ == "__main__":
    main(sys.argv[1:])
