"""The trainer hook: records per-token log-probs and versions into Parquet token logs (schema v1).

A PPO trainer calls `TokenLogHook.record(...)` once per minibatch update with the tensors it already has.
The hook computes nothing new: it copies the tensors off the training stream, aligns them to one row
per response token (DOMAIN.md section 5) and writes Parquet files in a background thread.

Layouts (every per-token tensor of one call uses the same one):
- padded `[B, T]` (prompt+response or response-only), optionally with `attention_mask [B, T]`;
- packed `[N]` with `cu_seqlens [B + 1]` (sequence b spans `cu_seqlens[b]:cu_seqlens[b + 1]`).
Response tokens (the rows) are where `response_mask` is true, else from index `prompt_lengths[b]` on
(the row index of the first response token, left padding included), else every valid token.

Alignment, declared per tensor in `alignment` (default `token`):
- `token`: value i belongs to token i (AReaL's rollout `logprobs`, verl's `old_log_probs`);
- `next_token`: value i belongs to token i + 1, as after `torch.roll(x, -1)` or a `logits[:, :-1]` gather
  (padded tensors may then be `[B, T - 1]`).

Never changes training: tensors are detached and copied (pinned host memory, `non_blocking=True` on CUDA);
a CUDA event recorded on the current stream is waited on by the writer thread, never by the caller.
"""

from __future__ import annotations

import contextlib
import queue
import re
import threading
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from evaluator.hook.earlier import EarlierFiles, RunIdReusedWarning
from evaluator.hook.layout import LAYOUT_TENSORS, TOKEN_COLUMNS, Alignment, HookShapeError
from evaluator.hook.rows import CallPlan, Snapshot, host_copies, make_plan, rows_table
from evaluator.hook.rows import host_copy as host_copy  # one tensor's copy, as every group's on CUDA
from evaluator.logio import token_table, write_log_atomic
from schemas.token_log import RUN_ID_MAX_BYTES

__all__ = ["Alignment", "HookShapeError", "HookWriterError", "RunIdReusedWarning", "TokenLogHook"]

TENSOR_ARG_NAMES = (*TOKEN_COLUMNS, *LAYOUT_TENSORS, "seq_id", "prompt_lengths", "cu_seqlens")
MAX_PLANS = 256
"""Call signatures whose checked plan is kept (a trainer has a few: minibatch sizes, padded lengths)."""
SORT_KEYS = [("step", "ascending"), ("minibatch", "ascending"), ("seq_id", "ascending"), ("pos", "ascending")]


class HookWriterError(RuntimeError):
    """The background writer failed; raised to the caller on the next call or on `close()`."""


@dataclass
class _Flush:
    """Marker in the queue: write what is buffered, then set `done`."""

    done: threading.Event = field(default_factory=threading.Event)


_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=+-]*$")


class TokenLogHook:
    """Records a trainer's per-token log-probs into Parquet files `{run_id}-step{first}-{last}-{n}.parquet`.

    Use as a context manager (it flushes on exit) or call `close()`. Memory stays bounded: at most
    `max_pending` calls wait for the writer (then `record` blocks: backpressure) and calls holding about
    `tokens_per_file` tokens (every position of their per-token tensors, an upper bound on the rows) are
    buffered. A file closes when a call brings a step beyond `steps_per_file` distinct steps, or once it
    holds `tokens_per_file` tokens; a call's rows never straddle two files, so a sequence's tokens of one
    minibatch stay together.
    """

    def __init__(
        self,
        out_dir: str | Path,
        run_id: str,
        *,
        steps_per_file: int = 10,
        tokens_per_file: int = 1_000_000,
        max_pending: int = 16,
        poll_seconds: float = 0.05,
    ) -> None:
        if not _RUN_ID.match(run_id) or len(run_id) > RUN_ID_MAX_BYTES:
            raise ValueError(
                f"run_id {run_id!r} must be a file-name-safe word (letters, digits, _ . = + -) of at most "
                f"{RUN_ID_MAX_BYTES} characters"
            )
        if steps_per_file < 1 or tokens_per_file < 1 or max_pending < 1:
            raise ValueError("steps_per_file, tokens_per_file and max_pending must be >= 1")
        self.out_dir, self.run_id = Path(out_dir), run_id
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.steps_per_file, self.tokens_per_file = steps_per_file, tokens_per_file
        self.files: list[Path] = []
        self.rows_written = 0
        self.writer_seconds = 0.0
        """CPU time the writer thread spent (aligning, encoding, writing)."""
        self.record_seconds = 0.0
        """Time the caller spent inside `record` (shape checks, host copies, queueing, backpressure)."""
        self.records = 0
        earlier = EarlierFiles.scan(self.out_dir, run_id)  # a resumed run goes on after its files
        self._n_file, self._next_seq_id = earlier.next_file, earlier.next_seq_id
        self._earlier = earlier if earlier.files else None  # checked against the first call's step
        self._plans: dict[tuple, CallPlan] = {}
        self._pending: list[Snapshot] = []
        self._buffered_tokens = 0
        self._buffered_steps: set[int] = set()
        self._error: BaseException | None = None
        self._error_reported = False
        self._queue: queue.SimpleQueue[Snapshot | _Flush | None] = queue.SimpleQueue()
        self._max_pending, self._put_lock, self._room = max_pending, threading.Lock(), threading.Event()
        self._wake = threading.Event()
        self.poll_seconds = poll_seconds
        token_table(
            {"step": np.zeros(0, np.int64)}
        )  # pyarrow imports pandas on first use: now, not mid-training
        self._thread = threading.Thread(target=self._run, name=f"proxaudit-hook-{run_id}", daemon=True)
        self._thread.start()
        self._closed = False

    # ---- caller side -------------------------------------------------------------------------------
    def record(
        self,
        *,
        step: int,
        minibatch: int = 0,
        n_minibatches: int = 1,
        behave_logp: torch.Tensor,
        behave_version: torch.Tensor,
        theta_logp: torch.Tensor,
        prox_logp: torch.Tensor | None = None,
        proximal_t_logp: torch.Tensor | None = None,
        proximal_t_version: torch.Tensor | None = None,
        advantage: torch.Tensor | None = None,
        reward: torch.Tensor | None = None,
        token_id: torch.Tensor | None = None,
        loss_mask: torch.Tensor | None = None,
        seq_id: torch.Tensor | None = None,
        response_mask: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        prompt_lengths: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
        alignment: Mapping[str, Alignment] | None = None,
    ) -> None:
        """Record one minibatch update. Per-token tensors are `[B, T]` (padded) or `[N]` (packed with
        `cu_seqlens [B + 1]`); `advantage` and `reward` may be `[B]`; `seq_id` is `[B]` (default: fresh
        ids, after every seq_id of the run's earlier files in out_dir). A first call at or before the last
        step of those files warns (`RunIdReusedWarning`): a second training under the same run_id.
        `alignment` maps a tensor's name to `token` or `next_token`. `step`, `minibatch` and
        `n_minibatches` are Python ints (a device scalar would force a sync)."""
        started = time.perf_counter()
        self._raise_pending()
        if self._closed:
            raise HookWriterError("record() after close()")
        if self._earlier is not None:  # the first call: a training restarted over its run's files?
            restart, self._earlier = self._earlier.restart(int(step)), None
            if restart:
                warnings.warn(restart, RunIdReusedWarning, stacklevel=2)
        given = locals()
        tensors = {k: given[k] for k in TENSOR_ARG_NAMES if given[k] is not None}
        for k, v in tensors.items():
            if not isinstance(v, torch.Tensor):
                tensors[k] = torch.as_tensor(v)
        plan = self._plan(tensors, alignment or {})
        snap = Snapshot(int(step), int(minibatch), int(n_minibatches), host_copies(tensors, plan), plan)
        if seq_id is None:
            snap.seq_id = torch.arange(self._next_seq_id, self._next_seq_id + plan.batch_size)
            self._next_seq_id += plan.batch_size
        if plan.cuda_device is not None:  # the writer waits on this event; the training stream never does
            snap.event = torch.cuda.Event()
            snap.event.record(torch.cuda.current_stream(plan.cuda_device))
        self._put(snap)
        self.records += 1
        self.record_seconds += time.perf_counter() - started

    def _plan(self, tensors: dict[str, torch.Tensor], alignment: Mapping[str, str]) -> CallPlan:
        """The checked plan of a call: cached by signature, so only a call of a new signature pays the
        full shape check (which raises `HookShapeError` on any mismatch, every time it is met)."""
        signature = (
            tuple(alignment.items()),
            *((k, t.shape, t.dtype, t.device) for k, t in tensors.items()),
        )
        try:
            plan = self._plans.get(signature)
        except TypeError:  # an unhashable alignment value: let the full check name it
            signature, plan = None, None
        if plan is None:
            plan = make_plan(tensors, alignment)
            if signature is not None:
                if len(self._plans) >= MAX_PLANS:
                    self._plans.clear()
                self._plans[signature] = plan
        return plan

    def flush(self) -> None:
        """Wait until everything recorded so far is written to files."""
        marker = _Flush()
        self._put(marker)
        while not marker.done.wait(0.05):
            self._raise_pending()
        self._raise_pending()

    def close(self) -> None:
        """Write what is buffered, stop the writer, and raise its error if not yet raised."""
        if not self._closed:
            self._closed = True
            if self._error is None:
                self._put(None)
            self._thread.join()
        if not self._error_reported:
            self._raise_pending()

    def __enter__(self) -> TokenLogHook:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
            return
        with contextlib.suppress(HookWriterError):  # keep the good rows, never hide the caller's exception
            self.close()

    def _put(self, item: Snapshot | _Flush | None) -> None:
        if not isinstance(item, Snapshot):
            self._wake.set()  # flush and close want the writer now
        while True:  # blocks while the writer is behind (backpressure), wakes if it died
            self._raise_pending()
            with self._put_lock:  # a C lock and queue: far cheaper per call than queue.Queue's Condition
                if self._queue.qsize() < self._max_pending:
                    self._queue.put(item)
                    return
            self._room.clear()
            if self._queue.qsize() >= self._max_pending:  # still full after the clear: wait for a get
                self._wake.set()
                self._room.wait(0.05)

    def _raise_pending(self) -> None:
        if self._error is not None and not self._error_reported:
            self._error_reported = True
            raise HookWriterError(f"the token log writer failed: {self._error}") from self._error
        if self._error is not None:
            raise HookWriterError("the token log writer failed earlier; nothing more is recorded")

    # ---- writer thread -------------------------------------------------------------------------------
    def _run(self) -> None:
        """Poll rather than wake on every call: a thread woken per call would take the GIL from the
        trainer at every `record`; this one takes it about every `poll_seconds`, for a batch of calls."""
        try:
            while True:
                self._wake.wait(self.poll_seconds)
                self._wake.clear()
                started = time.thread_time()
                done = self._drain()
                self.writer_seconds += time.thread_time() - started
                if done:
                    return
        except BaseException as error:  # surfaced to the caller by _raise_pending
            self._error = error

    def _drain(self) -> bool:
        """Handle every waiting item; True once the closing marker came."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return False
            self._room.set()
            if item is None:
                self._write_buffer()
                return True
            if isinstance(item, _Flush):
                self._write_buffer()
                item.done.set()
                continue
            if item.event is not None:
                item.event.synchronize()  # waits for the copies, in this thread only
            self._add(item)

    def _add(self, snap: Snapshot) -> None:
        if snap.step not in self._buffered_steps and len(self._buffered_steps) >= self.steps_per_file:
            self._write_buffer()
        self._pending.append(snap)
        self._buffered_tokens += snap.plan.tokens
        self._buffered_steps.add(snap.step)
        if self._buffered_tokens >= self.tokens_per_file:
            self._write_buffer()

    def _write_buffer(self) -> None:
        table = rows_table(self._pending, self.run_id).sort_by(SORT_KEYS) if self._pending else None
        self._pending, self._buffered_tokens, self._buffered_steps = [], 0, set()
        if table is None or table.num_rows == 0:
            return
        steps = table.column("step")
        first, last = pa.compute.min(steps).as_py(), pa.compute.max(steps).as_py()
        path = self.out_dir / f"{self.run_id}-step{first:06d}-{last:06d}-{self._n_file:04d}.parquet"
        write_log_atomic(table, path)
        self.files.append(path)
        self.rows_written += table.num_rows
        self._n_file += 1
