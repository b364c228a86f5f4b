"""A worker process of `evaluator.replay.workers.WorkerPool`: `python -m evaluator.replay.worker`.

Reads pickled tasks from stdin until it is closed and answers each with a pickled `("ok", result)` or
`("error", traceback)` on stdout (`evaluator.replay.workers.serve`). Ctrl-C is left to the parent
(which closes stdin or kills the worker), so a Ctrl-C in the terminal prints one traceback, not three.
Anything else printed to stdout goes to stderr, so it cannot corrupt the answers.
"""

from __future__ import annotations

import os
import signal
import sys

from evaluator.replay.workers import load_kernels, serve


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    load_kernels()  # numba's start, while the first file is checked
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
