"""Replay's per-file work as Ray tasks (`proxaudit replay --ray [ADDRESS]`): the same ordered `map` as
`evaluator.replay.workers.WorkerPool`, on a Ray cluster instead of local worker processes.

No address starts a local Ray with this machine's cores; an address (`ray://...`, `auto`, `host:port`)
joins that cluster, whose workers must reach the log files by the same paths (a shared file system). Each
task is `evaluator.replay.workers.run_task`: check, or summarise and stage (`StageTo`) one file, or
summarise one range of the batches of a long file (one range per cluster CPU, merged here in file order);
the caller commits the results in task order, in group commits, exactly as with local workers, so the
store is the same bit for bit. A worker that dies is retried by Ray (`MAX_RETRIES`); a task that raises,
or whose retries run out, yields a `FileFailed` in its place and the other files go on. At most `2 x CPUs`
tasks are in flight, so finished results wait in the object store, not here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from evaluator.errors import FileFailed, UsageError
from evaluator.replay.tasks import Task
from evaluator.replay.workers import failed, ordered_map, run_task

MAX_RETRIES = 3
LOCAL = "local"


class RayRunner:
    """A context manager with an ordered `map` over Ray tasks; starts or joins Ray on entry and leaves
    a Ray it did not start running on exit."""

    cpus: int = 1
    """The cluster's CPUs (set on entry): a long file is summarised as up to this many range tasks."""

    def __init__(self, address: str = LOCAL, num_cpus: int | None = None) -> None:
        self.address, self.num_cpus = address, num_cpus
        self._started = False

    def __enter__(self) -> RayRunner:
        try:
            import ray
        except ImportError:
            raise UsageError("--ray needs Ray: pip install 'proxaudit[ray]'") from None
        if not ray.is_initialized():
            local = self.address == LOCAL
            ray.init(
                address=None if local else self.address,
                num_cpus=self.num_cpus if local else None,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
            self._started = True
        self._ray = ray
        self._task = ray.remote(max_retries=MAX_RETRIES)(run_task)
        self.cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._window = 2 * self.cpus
        return self

    def __exit__(self, *exc) -> None:
        if self._started:
            self._ray.shutdown()

    def map(self, tasks: Iterable[Task]) -> Iterator[object | FileFailed]:
        """Each task's result (or `FileFailed`), in task order; the next tasks run meanwhile."""
        return ordered_map(tasks, self._window, self._task.remote, self._get)

    def _get(self, task: Task, ref) -> object | FileFailed:
        try:
            return self._ray.get(ref)
        except Exception as error:  # RayTaskError, WorkerCrashedError after the retries
            first = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
            return failed(task, f"{type(error).__name__}: {first}", " on Ray")
