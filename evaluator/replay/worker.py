"""A worker process of `evaluator.replay.workers.WorkerPool`: `python -m evaluator.replay.worker`.

Reads pickled tasks from stdin until it is closed and answers each with a pickled `("ok", result)` or
`("error", traceback)` on stdout (`evaluator.replay.workers.serve_stdio`).
"""

from __future__ import annotations

from evaluator.duck import arrow_without_pandas
from evaluator.replay.workers import load_kernels, serve_stdio


def main() -> None:
    arrow_without_pandas()
    load_kernels()  # numba's start, while the first file is checked
    serve_stdio()


if __name__ == "__main__":
    main()
