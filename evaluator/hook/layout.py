"""How the hook finds its rows: shape checks (caller side, metadata only) and the alignment of padded or
packed, `token` or `next_token` tensors to one value per response token (writer side, numpy).

Padded tensors are `[B, T]` (a `next_token` one may be `[B, T - 1]`); packed ones `[N]` with
`cu_seqlens [B + 1]`. `next_token` means value i belongs to token i + 1 (after `torch.roll(x, -1)`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from schemas.token_log import COLUMNS

Alignment = Literal["token", "next_token"]
ALIGNMENTS = ("token", "next_token")
KEY_COLUMNS = ("run_id", "step", "minibatch", "n_minibatches", "seq_id", "pos")
TOKEN_COLUMNS = tuple(c.name for c in COLUMNS if c.name not in KEY_COLUMNS)
"""The schema v1 columns a `record` call gives as tensors (the keys come from its other arguments)."""
PER_SEQUENCE_OK = ("advantage", "reward")
"""Columns that may also be given once per sequence, `[B]`, and are repeated on each of its tokens."""
LAYOUT_TENSORS = ("response_mask", "attention_mask")


class HookShapeError(ValueError):
    """Tensors of one `record` call do not fit together (the message names both shapes)."""


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def check_shapes(
    tensors: Mapping[str, torch.Tensor], alignment: Mapping[str, str], packed: bool
) -> tuple[int, frozenset[str]]:
    """Check that every tensor fits the batch; return B and the columns given once per sequence.

    Shapes only (metadata), so this never waits for the device.
    """
    for name, how in alignment.items():
        if name not in TOKEN_COLUMNS and name not in LAYOUT_TENSORS:
            raise HookShapeError(f"alignment names {name!r}, which is not a per-token tensor of record()")
        if how not in ALIGNMENTS:
            raise HookShapeError(f"alignment of {name} must be one of {ALIGNMENTS}, not {how!r}")
    per_token = {k: v for k, v in tensors.items() if k in TOKEN_COLUMNS or k in LAYOUT_TENSORS}
    check = _check_packed if packed else _check_padded
    B, per_sequence = check(tensors, per_token, alignment)
    for name in ("seq_id", "prompt_lengths"):
        if name in tensors and _shape(tensors[name]) != (B,):
            raise HookShapeError(f"{name} has shape {_shape(tensors[name])} but the batch has {B} sequences")
    return B, per_sequence


def _check_packed(tensors, per_token, alignment) -> tuple[int, frozenset[str]]:
    cu = tensors["cu_seqlens"]
    if cu.dim() != 1 or cu.shape[0] < 2:
        raise HookShapeError(f"cu_seqlens must be [B + 1] with B >= 1, got shape {_shape(cu)}")
    B, N = cu.shape[0] - 1, tensors["theta_logp"].shape[0]
    per_sequence = frozenset(
        n for n in PER_SEQUENCE_OK if n in per_token and _shape(per_token[n]) == (B,) != (N,)
    )
    for name, t in per_token.items():
        if name not in per_sequence and _shape(t) != (N,):
            raise HookShapeError(
                f"{name} has shape {_shape(t)} but the packed batch is ({N},) (from theta_logp); "
                f"packed tensors are [total_tokens]"
                + (f" or [{B}] per sequence" if name in PER_SEQUENCE_OK else "")
            )
    return B, per_sequence


def _check_padded(tensors, per_token, alignment) -> tuple[int, frozenset[str]]:
    ref = next((n for n in LAYOUT_TENSORS if n in tensors), None)
    if ref is None:  # the widest [B, T] tensor: next_token tensors may be one shorter
        ref = max(
            (n for n, t in per_token.items() if t.dim() == 2),
            key=lambda n: per_token[n].shape[1],
            default=None,
        )
    if ref is None or per_token[ref].dim() != 2:
        raise HookShapeError(
            f"padded tensors must be [B, T]; got shapes { {n: _shape(t) for n, t in per_token.items()} }"
        )
    B, T = _shape(per_token[ref])
    per_sequence = frozenset(n for n in PER_SEQUENCE_OK if n in per_token and _shape(per_token[n]) == (B,))
    for name, t in per_token.items():
        allowed = [(B, T)] + ([(B, T - 1)] if alignment.get(name) == "next_token" else [])
        if name not in per_sequence and _shape(t) not in allowed:
            raise HookShapeError(
                f"{name} has shape {_shape(t)} but the batch is {(B, T)} (from {ref}); "
                f"{alignment.get(name, 'token')}-aligned {name} must be "
                + " or ".join(map(str, allowed + ([(B,)] if name in PER_SEQUENCE_OK else [])))
            )
    return B, per_sequence


@dataclass
class Rows:
    """Where the response tokens are: sequence `seq`, offset `col` in it, rank `pos` among its responses."""

    seq: np.ndarray
    col: np.ndarray
    pos: np.ndarray
    start: np.ndarray | None
    """Packed only: the flat index where each sequence starts."""


def _token_aligned(mask: np.ndarray, how: str) -> np.ndarray:
    """A padded `[B, W]` boolean mask moved to token alignment, `[B, W + 1]` for next_token."""
    return mask if how == "token" else np.pad(mask, ((0, 0), (1, 0)))


def locate_rows(arrays: Mapping[str, np.ndarray], alignment: Mapping[str, str], packed: bool) -> Rows:
    """The response tokens of one call, in (sequence, position) order."""
    if packed:
        return _locate_packed(arrays, alignment)
    B, T = next(
        arrays[n].shape for n in (*LAYOUT_TENSORS, "theta_logp") if n in arrays and arrays[n].ndim == 2
    )
    T = max(T, max(a.shape[1] for n, a in arrays.items() if n in TOKEN_COLUMNS and a.ndim == 2))
    resp = np.ones((B, T), dtype=bool)  # (B, T)
    for name in LAYOUT_TENSORS:
        if name in arrays:
            resp &= _token_aligned(arrays[name] != 0, alignment.get(name, "token"))[:, :T]
    if "response_mask" not in arrays and "prompt_lengths" in arrays:
        resp &= np.arange(T)[None, :] >= arrays["prompt_lengths"][:, None]
    seq, col = np.nonzero(resp)  # (n,), (n,): by sequence, then position
    pos = (np.cumsum(resp, axis=1) - 1)[seq, col]  # (n,)
    return Rows(seq, col, pos, None)


def _locate_packed(arrays: Mapping[str, np.ndarray], alignment: Mapping[str, str]) -> Rows:
    cu, N = arrays["cu_seqlens"].astype(np.int64), arrays["theta_logp"].shape[0]
    lengths = np.diff(cu)
    if cu[0] != 0 or (lengths < 0).any() or cu[-1] != N:
        raise HookShapeError(f"cu_seqlens must rise from 0 to total_tokens {N}, got {cu.tolist()}")
    seq_of = np.repeat(np.arange(len(lengths)), lengths)  # (N,)
    local = np.arange(N) - cu[:-1][seq_of]  # (N,) offset in its sequence
    resp = np.ones(N, dtype=bool)  # (N,)
    for name in LAYOUT_TENSORS:
        if name in arrays:
            shift = 1 if alignment.get(name) == "next_token" else 0
            resp &= (local >= shift) & (arrays[name][np.maximum(np.arange(N) - shift, 0)] != 0)
    if "response_mask" not in arrays and "prompt_lengths" in arrays:
        resp &= local >= arrays["prompt_lengths"][seq_of]
    flat = np.flatnonzero(resp)  # (n,)
    before = np.concatenate([[0], np.cumsum(resp)])  # response tokens before each flat index
    seq = seq_of[flat]
    return Rows(seq, local[flat], before[flat] - before[cu[:-1]][seq], cu[:-1])


def gather(name: str, values: np.ndarray, how: str, rows: Rows) -> np.ndarray:
    """One value per response token from a per-token array declared with alignment `how`."""
    col = rows.col - (1 if how == "next_token" else 0)  # (n,) source offset in the sequence
    orphans = int((col < 0).sum())
    if orphans:
        raise HookShapeError(
            f"{name} is next_token-aligned, but {orphans} response tokens are the first token of their "
            "sequence, so no value of it belongs to them (is it really rolled? is the prompt included?)"
        )
    if rows.start is None:
        return values[rows.seq, col]
    return values[rows.start[rows.seq] + col]
