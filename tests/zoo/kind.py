"""One kind of bug of the zoo, as data: where it was reported, what it breaks, how to plant it and what
finds it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa


@dataclass(frozen=True)
class Kind:
    name: str
    """What the trainer or adapter did wrong, in a few words."""
    rule: str
    """The finding (or file rule) that catches it."""
    column: str
    """The column the evidence must name."""
    citation: str
    """Where it was reported or fixed: `owner/repo#number`, or `owner/repo path@commit`."""
    invariant: str
    """What a correct log guarantees that this bug breaks."""
    plant: Callable[[pa.Table], pa.Table]
    """Plants the bug in a clean log (whole sequences sorted by step, minibatch, seq_id, pos)."""
    bases: tuple[str, ...] = ("synthetic", "smollm2")
    """The clean logs it is planted in (`tests.zoo.bases`): a base where the data cannot show it is left out
    with its reason in `why_not`."""
    epochs: bool = False
    """Planted in a log with two PPO epochs (every response recorded again in a later minibatch)."""
    max_staleness: int | None = None
    """validate's --max-staleness for it."""
    why_not: str = ""
    """Why a real-LM base is left out, where one is."""
