"""What the AReaL and verl integrations share: the warning for a log-prob the trainer's config makes a copy
of another, and fresh `seq_id`s for one data-parallel rank's hook."""

from __future__ import annotations

import torch

from evaluator.hook.earlier import EarlierFiles
from evaluator.hook.recorder import TokenLogHook


class FakeProxWarning(UserWarning):
    """The trainer's config makes a log-prob a copy of another: the copy is not recorded."""


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of this process in torch.distributed; (0, 1) outside it."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class SeqIds:
    """`seq_id`s `rank + world * k` for the hook of one rank (each rank writes its own folder, one run_id):
    unique over the ranks, and after every id of the rank's earlier files (a resumed run)."""

    def __init__(self, hook: TokenLogHook) -> None:
        self.rank, self.world = rank_and_world()
        self.next = -(-EarlierFiles.scan(hook.out_dir, hook.run_id).next_seq_id // self.world)

    def take(self, n: int, device: torch.device | None = None) -> torch.Tensor:
        """`n` fresh ids, `[n]` int64."""
        k = torch.arange(self.next, self.next + n, device=device)  # (n,)
        self.next += n
        return self.rank + self.world * k
