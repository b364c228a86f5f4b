"""The hook's data path: a call's checked plan, its host copies (`Snapshot`), and the schema v1 rows the
writer thread builds from them (numpy; the padded calls of one plan are aligned in one pass).

Caller side, per call: `make_plan` (once per call signature) and `host_copies` (one `cat` per group of
tensors with the same dtype, device and shape after dim 0; on CUDA then one non-blocking copy to pinned
memory). Writer side, per file: `rows_table`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from evaluator.hook.layout import TOKEN_COLUMNS, check_shapes, gather, locate_rows
from evaluator.logio import token_table
from schemas.token_log import COLUMNS


@dataclass(frozen=True)
class CallPlan:
    """What a `record` call of one signature (names, shapes, dtypes, devices, alignment) needs: the checks
    passed once, then reused by every call of the same signature."""

    batch_size: int
    alignment: dict[str, str]
    packed: bool
    per_sequence: frozenset[str]
    groups: tuple[tuple[tuple[str, int, int], ...], ...]
    """Tensors copied together by one `cat` along dim 0, as (name, start, stop) rows of the copy: one
    dtype, device and trailing shape per group."""
    on_host: tuple[bool, ...]
    """Per group: its tensors are on the CPU already (the `cat` is the copy)."""
    tokens: int
    """Every position of the largest tensor: an upper bound on the call's rows."""
    cuda_device: torch.device | None


@dataclass(slots=True)
class Snapshot:
    """Host copies of one `record` call, waiting for the writer thread."""

    step: int
    minibatch: int
    n_minibatches: int
    parts: list[torch.Tensor]
    """One host copy per group of `plan.groups`."""
    plan: CallPlan
    seq_id: torch.Tensor | None = None
    """Fresh ids made on the host when the caller gave none."""
    event: torch.cuda.Event | None = None

    def arrays(self) -> dict[str, np.ndarray]:
        """The call's tensors as numpy arrays (views into the copies), by name."""
        arrays = {} if self.seq_id is None else {"seq_id": self.seq_id.numpy()}
        for group, part in zip(self.plan.groups, self.parts, strict=True):
            values = _numpy(part)
            for name, start, stop in group:
                arrays[name] = values[start:stop]
        return arrays


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """A detached host copy; from CUDA into pinned memory without waiting (the caller's stream keeps going:
    a non-blocking device-to-host `to` allocates a pinned destination). One op, so cheap on CPU too."""
    return t.detach().to("cpu", non_blocking=True, copy=True)


def make_plan(tensors: dict[str, torch.Tensor], alignment: Mapping[str, str]) -> CallPlan:
    """Check a call's shapes (raises `HookShapeError`) and group its tensors by dtype, device and shape
    after dim 0 (the groups a `cat` can join)."""
    alignment = dict(alignment)
    packed = "cu_seqlens" in tensors
    B, per_sequence = check_shapes(tensors, alignment, packed=packed)
    groups: dict[tuple, list[tuple[str, int, int]]] = {}
    for name, t in tensors.items():
        group = groups.setdefault((t.dtype, t.device, t.shape[1:]), [])
        start = group[-1][2] if group else 0
        group.append((name, start, start + t.shape[0]))
    return CallPlan(
        batch_size=B,
        alignment={k: v for k, v in alignment.items() if k in tensors},  # a trainer may declare all at once
        packed=packed,
        per_sequence=per_sequence,
        groups=tuple(tuple(g) for g in groups.values()),
        on_host=tuple(device.type == "cpu" for _, device, _ in groups),
        tokens=max(t.numel() for t in tensors.values()),
        cuda_device=next((t.device for t in tensors.values() if t.is_cuda), None),
    )


def host_copies(tensors: dict[str, torch.Tensor], plan: CallPlan) -> list[torch.Tensor]:
    """One host copy per group: a `cat` (always a new tensor; on the device for CUDA, then one non-blocking
    copy to pinned memory), so a call costs a few ops rather than two per tensor."""
    parts = []
    with torch.no_grad():  # the copies are never part of the caller's autograd graph
        for group, on_host in zip(plan.groups, plan.on_host, strict=True):
            part = torch.cat([tensors[name] for name, _, _ in group])
            parts.append(part if on_host else host_copy(part))
    return parts


def _numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.float()  # numpy has no bfloat16; float32 holds every bf16 value exactly
    return t.numpy()


def stacked_arrays(snaps: list[Snapshot]) -> dict[str, np.ndarray]:
    """The arrays of calls of one padded plan as one batch: each tensor's calls joined along dim 0."""
    if len(snaps) == 1:
        return snaps[0].arrays()
    arrays = {} if snaps[0].seq_id is None else {"seq_id": np.concatenate([s.seq_id.numpy() for s in snaps])}
    for g, group in enumerate(snaps[0].plan.groups):
        stacked = np.stack([_numpy(s.parts[g]) for s in snaps])  # (calls, group rows, ...)
        for name, start, stop in group:
            arrays[name] = stacked[:, start:stop].reshape(-1, *stacked.shape[2:])
    return arrays


def snapshot_columns(snaps: list[Snapshot]) -> dict[str, np.ndarray]:
    """One value per response token for every column the calls gave (and the keys), in (call, seq, pos)
    order. The calls share one plan; several are aligned in one pass only when padded."""
    plan = snaps[0].plan
    arrays = stacked_arrays(snaps)
    rows = locate_rows(arrays, plan.alignment, plan.packed)
    n, seq_of_call = len(rows.pos), rows.seq // plan.batch_size  # (n,) the call each row came from
    columns = {
        "step": np.array([s.step for s in snaps])[seq_of_call],
        "minibatch": np.array([s.minibatch for s in snaps])[seq_of_call],
        "n_minibatches": np.array([s.n_minibatches for s in snaps])[seq_of_call],
        "seq_id": arrays["seq_id"][rows.seq],
        "pos": rows.pos,
        "loss_mask": np.ones(n, dtype=bool),
    }
    for name in TOKEN_COLUMNS:
        if name in plan.per_sequence:
            columns[name] = arrays[name][rows.seq]
        elif name in arrays:
            columns[name] = gather(name, arrays[name], plan.alignment.get(name, "token"), rows)
    columns["loss_mask"] = columns["loss_mask"] != 0
    return columns


def rows_table(snaps: list[Snapshot], run_id: str) -> pa.Table:
    """The schema v1 rows of several calls in one table (null where a call gave no such tensor).

    Built in one pass when a file is due rather than per call, and the padded calls of one plan (same
    names, shapes and alignment) aligned together: fewer, larger operations keep the writer thread's hold
    on the GIL (which the trainer's own Python needs) short.
    """
    by_plan: dict[int, list[Snapshot]] = {}
    for s in snaps:  # a packed call's rows depend on its own cu_seqlens: aligned alone
        by_plan.setdefault(id(s) if s.plan.packed else id(s.plan), []).append(s)
    parts = [snapshot_columns(group) for group in by_plan.values()]
    sizes = [len(p["pos"]) for p in parts]
    n = sum(sizes)
    columns: dict[str, object] = {"run_id": pa.array(np.full(n, run_id, dtype=object), pa.string())}
    for c in (c for c in COLUMNS if c.name != "run_id"):
        given = [p[c.name] for p in parts if c.name in p]
        if not given:
            columns[c.name] = pa.nulls(n, c.type)
        elif len(given) == len(parts):
            columns[c.name] = np.concatenate(given)
        else:
            pairs = list(zip(parts, sizes, strict=True))
            values = np.concatenate([p.get(c.name, np.zeros(k, given[0].dtype)) for p, k in pairs])
            missing = np.concatenate([np.full(k, c.name not in p) for p, k in pairs])
            columns[c.name] = pa.array(values, c.type, mask=missing)
    return token_table(columns)
