"""A worker process of `evaluator.summary_pool`: validate and summarise whole files, one at a time.

`python -m evaluator.file_worker` reads pickled requests `(path, params, batch_rows)` from stdin until it is
closed and answers each with a pickled `("ok", Summarised)` or `("error", traceback)` on stdout:
`evaluator.replay.check_and_summarise(path, workers=1)`, the very summary the parent would make.
Ctrl-C is left to the parent (which closes stdin or kills the worker), so a Ctrl-C in the terminal prints
one traceback, not three. Anything else printed to stdout is sent to stderr, so it cannot corrupt the answers.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import traceback
from pathlib import Path

from evaluator.replay import check_and_summarise

EXIT_ENV = "PROXAUDIT_WORKER_EXIT_ON"
"""Fault injection for tests: when set to a file's name, the worker dies (os._exit) when handed that file,
as a worker killed by the OOM killer would."""


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    requests = sys.stdin.buffer
    while True:
        try:
            path, params, batch_rows = pickle.load(requests)
        except EOFError:  # the parent has closed stdin: no more files
            return
        if os.environ.get(EXIT_ENV) == Path(path).name:
            os._exit(71)
        try:
            answer = ("ok", check_and_summarise(Path(path), params, batch_rows=batch_rows, workers=1))
        except Exception:  # reported to the parent, which stops the replay
            answer = ("error", traceback.format_exc())
        pickle.dump(answer, answers, protocol=pickle.HIGHEST_PROTOCOL)
        answers.flush()


if __name__ == "__main__":
    main()
