"""The process a watch's looks run in (`evaluator.watch.look.LookProcess`): `python -m
evaluator.watch.look_worker`, a worker of `evaluator.replay.workers.WorkerPool` whose tasks are `Look`s.
On Linux the kernel kills it when watch dies, before it has imported anything: a watch killed with -9
leaves no look writing the store behind it (elsewhere it ends on the closed pipe once its look is done).
"""

from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the call
        os._exit(1)


def main() -> None:
    die_with_parent()
    from evaluator.duck import arrow_without_pandas
    from evaluator.replay.workers import serve_stdio

    arrow_without_pandas()

    serve_stdio()


if __name__ == "__main__":
    main()
