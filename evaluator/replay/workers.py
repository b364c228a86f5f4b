"""Where replay's per-file work runs: `LocalRunner` (this process) or `WorkerPool` (one worker process
per core), both an ordered `map` over tasks (`evaluator.replay.tasks`: check a file, summarise it, or
summarise one range of a long file).

A worker is a plain child process running `evaluator.replay.worker` (not a `multiprocessing` pool: spawn would
re-run a caller's main script, fork would copy Arrow's and DuckDB's threads), started when first needed
and kept for the whole replay so its imports are paid once. Requests and answers are pickles over its
stdin and stdout; its stderr goes to a scratch file, quoted when it fails. `map` keeps every worker busy
with the next tasks while the caller consumes the results, in task order, so at most one result per
worker waits in memory. A task that fails, or whose worker dies (it is replaced), yields a `FileFailed`
in its place: the other tasks go on. Leaving the pool stops every worker: closing stdin ends them, an
error or Ctrl-C kills them; a worker whose parent died ends on the closed pipe.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from evaluator.errors import FileFailed
from evaluator.replay.tasks import Summarise, Task

WORKER_MODULE = "evaluator.replay.worker"
STOP_WAIT_S = 10.0
EXIT_ENV = "PROXAUDIT_WORKER_EXIT_ON"
"""Fault injection for tests: when set to a file's name, the worker summarising that file dies
(os._exit), as a worker killed by the OOM killer would."""


def _load_kernels_now() -> None:
    from evaluator.replay.kernels import load  # numba is imported here, in the loading thread

    load()


def load_kernels() -> threading.Thread:
    """Import numba and load replay's compiled loop (`evaluator.replay.kernels`) in a thread, while this
    process checks files: the first summary then finds it ready (or waits for the rest)."""
    thread = threading.Thread(target=_load_kernels_now, name="proxaudit-kernels")
    thread.start()
    return thread


def stderr_tail(err: Path) -> str:
    """The end of what a worker process wrote to its stderr file (quoted in the parent's error)."""
    return err.read_text(errors="replace")[-2000:].strip() or "(nothing on stderr)"


def run_task(task: Task):
    """Run one task here (what a Ray worker is handed)."""
    return task.run()


def failed(task: Task, error: Exception | str, where: str = "") -> FileFailed:
    """The failure of one task, naming its kind and file."""
    why = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return FileFailed(f"{task.kind} {task.path} failed{where}: {why}")


def ordered_map(
    tasks: Iterable[Task],
    size: int,
    submit: Callable[[Task], object],
    collect: Callable[[Task, object], object | FileFailed],
) -> Iterator[object | FileFailed]:
    """The results of `tasks` in task order with at most `size` in flight: `submit(task)` starts one and
    returns its handle, `collect(task, handle)` waits for its result. The next tasks are submitted before
    a result is handed on, so the workers stay busy while the caller consumes it."""
    queue: deque[tuple[Task, object]] = deque()
    pending = iter(tasks)

    def fill() -> None:
        while len(queue) < size and (task := next(pending, None)) is not None:
            queue.append((task, submit(task)))

    fill()
    while queue:
        task, handle = queue.popleft()
        result = collect(task, handle)
        fill()
        yield result


class LocalRunner:
    """Tasks in this process, one after the other (a large file's summary still uses range threads)."""

    def __enter__(self) -> LocalRunner:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def map(self, tasks: Iterable[Task]) -> Iterator[object | FileFailed]:
        for task in tasks:
            try:
                yield run_task(task)
            except Exception as error:  # one file's trouble never stops the others
                yield failed(task, error)


@dataclass
class Worker:
    process: subprocess.Popen
    err: Path  # its stderr

    def exited(self, what: str) -> FileFailed:
        """The error for a worker that died while doing `what`, quoting its stderr."""
        code, tail = self.process.wait(), stderr_tail(self.err)
        return FileFailed(f"{what}: the worker process exited ({code}): {tail}")


class WorkerPool:
    """Up to `size` worker processes running `module` (replay's worker; `evaluator.watch.look_worker`
    for a watch's looks); a context manager with an ordered `map`."""

    def __init__(self, size: int, module: str | None = None) -> None:
        self.size, self.module = size, module or WORKER_MODULE
        self._scratch = tempfile.TemporaryDirectory(prefix="proxaudit-pool-")
        self._workers: list[Worker] = []
        self._idle: list[Worker] = []
        self._started = 0

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, kind, value, trace) -> None:
        self.close(kill=kind is not None)

    def map(self, tasks: Iterable[Task]) -> Iterator[object | FileFailed]:
        """Each task's result (or `FileFailed`), in task order; the next tasks run meanwhile."""
        return ordered_map(tasks, self.size, self._submit, self._collect)

    def _collect(self, task: Task, worker: Worker | FileFailed) -> object | FileFailed:
        return worker if isinstance(worker, FileFailed) else self._result(worker, task)

    def _start(self) -> Worker:
        err = Path(self._scratch.name) / f"{self._started}.err"
        self._started += 1
        with open(err, "wb") as stderr:
            command = [sys.executable, "-m", self.module]
            process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr)
        self._workers.append(Worker(process, err))
        return self._workers[-1]

    def _submit(self, task: Task) -> Worker | FileFailed:
        worker = self._idle.pop() if self._idle else self._start()
        try:
            pickle.dump(task, worker.process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            worker.process.stdin.flush()
        except BrokenPipeError:
            return self._lost(worker, task)
        return worker

    def _result(self, worker: Worker, task: Task) -> object | FileFailed:
        try:
            status, payload = pickle.load(worker.process.stdout)
        except (EOFError, pickle.UnpicklingError):
            return self._lost(worker, task)
        self._idle.append(worker)
        if status != "ok":
            return failed(task, payload[-2000:], " in a worker process")
        return payload

    def _lost(self, worker: Worker, task: Task) -> FileFailed:
        """Forget a dead worker (its slot is free again) and say what happened to the task."""
        self._workers.remove(worker)
        error = worker.exited(f"{task.kind} {task.path}")
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


def serve_stdio() -> None:
    """A worker process's main loop on its stdin and stdout (`serve`). Ctrl-C is left to the parent (which
    closes stdin or kills the worker), so a Ctrl-C in the terminal prints one traceback, not three; anything
    else printed to stdout goes to stderr, so it cannot corrupt the answers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin.buffer, answers)


def serve(requests, answers) -> None:
    """A worker's loop: run each pickled task from `requests`, pickle the answer to `answers`."""
    while True:
        try:
            task = pickle.load(requests)
        except EOFError:  # the parent has closed stdin: no more tasks
            return
        if isinstance(task, Summarise) and os.environ.get(EXIT_ENV) == Path(task.path).name:
            os._exit(71)
        try:
            answer = ("ok", task.run())
        except Exception:  # reported to the parent, which fails this file only
            answer = ("error", traceback.format_exc())
        pickle.dump(answer, answers, protocol=pickle.HIGHEST_PROTOCOL)
        answers.flush()
