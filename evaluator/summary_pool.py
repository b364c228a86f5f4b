"""Whole files validated and summarised in worker processes, at most one file in flight per worker.

Used by `evaluator.replay`. Each worker is a plain child process running `evaluator.file_worker` (not
a `multiprocessing` pool, for the reasons given in `evaluator.range_worker`), started when first needed
and kept for the whole replay so its imports are paid once. Requests and answers are pickles over its
stdin and stdout; its stderr goes to a scratch file, quoted when it fails. A worker answers one file and
then waits until the parent has read that answer, so the summaries in memory are bounded by the number
of workers.

Leaving the pool stops every worker: on a normal exit closing stdin ends them; on an error or Ctrl-C
they are killed. If the parent itself dies, a worker ends on the closed pipe after its current file.
"""

from __future__ import annotations

import contextlib
import pickle
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from evaluator.decisions import DecisionParams
from evaluator.errors import FileFailed
from evaluator.file_summary import BATCH_ROWS, stderr_tail

if TYPE_CHECKING:
    from evaluator.replay import Summarised

WORKER_MODULE = "evaluator.file_worker"
STOP_WAIT_S = 10.0


@dataclass
class Worker:
    process: subprocess.Popen
    err: Path  # its stderr

    def exited(self, path: Path) -> FileFailed:
        """The error for a worker that died while `path` was in its hands, quoting its stderr."""
        code, tail = self.process.wait(), stderr_tail(self.err)
        return FileFailed(f"summarising {path}: the worker process exited ({code}): {tail}")


class SummaryPool:
    """Up to `size` worker processes validating and summarising whole files; a context manager."""

    def __init__(self, size: int, params: DecisionParams, batch_rows: int = BATCH_ROWS) -> None:
        self.size, self.params, self.batch_rows = size, params, batch_rows
        self._scratch = tempfile.TemporaryDirectory(prefix="proxaudit-pool-")
        self._workers: list[Worker] = []
        self._idle: list[Worker] = []

    def __enter__(self) -> SummaryPool:
        return self

    def __exit__(self, kind, value, trace) -> None:
        self.close(kill=kind is not None)

    def full(self) -> bool:
        """True when every worker has a file in flight (and no more may be started)."""
        return not self._idle and len(self._workers) >= self.size

    def _start(self) -> Worker:
        err = Path(self._scratch.name) / f"{len(self._workers)}.err"
        with open(err, "wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", WORKER_MODULE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
        self._workers.append(Worker(process, err))
        return self._workers[-1]

    def submit(self, path: Path) -> Worker:
        """Hand `path` to an idle worker (starting one if allowed); call only when not `full()`. A
        `FileFailed` if the worker has died (it is replaced on the next submit)."""
        worker = self._idle.pop() if self._idle else self._start()
        try:
            request = (str(path), self.params, self.batch_rows)
            pickle.dump(request, worker.process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            worker.process.stdin.flush()
        except BrokenPipeError:
            raise self._lost(worker, path) from None
        return worker

    def result(self, worker: Worker, path: Path) -> Summarised:
        """The checked and (if it broke no rule) summarised file handed to `worker` (waits for it); the
        worker is then idle again. A `FileFailed` for an error in that file (the worker stays) or a
        worker that died (it is replaced on the next submit): the other files go on."""
        try:
            status, payload = pickle.load(worker.process.stdout)
        except (EOFError, pickle.UnpicklingError):
            raise self._lost(worker, path) from None
        self._idle.append(worker)
        if status != "ok":
            raise FileFailed(f"summarising {path} failed in a worker process: {payload[-2000:]}")
        return payload

    def _lost(self, worker: Worker, path: Path) -> FileFailed:
        """Forget a dead worker (its slot is free again) and say what happened to `path`."""
        self._workers.remove(worker)
        error = worker.exited(path)
        worker.process.stdout.close()
        return error

    def close(self, kill: bool = False) -> None:
        """Stop every worker: by closing stdin, or killed if `kill` or still running after `STOP_WAIT_S`."""
        for worker in self._workers:
            if kill:
                worker.process.kill()
            with contextlib.suppress(OSError):  # a dead worker's pipe
                worker.process.stdin.close()
        for worker in self._workers:
            try:
                worker.process.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
            worker.process.stdout.close()
        self._workers, self._idle = [], []
        self._scratch.cleanup()
