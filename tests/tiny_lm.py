"""A tiny causal LM for the tests that run AReaL's and verl's own training code on CPU.

It takes packed sequences the way their engines feed a model (`input_ids [1, N]` with `position_ids` and
the sequences' `cu_seqlens`) and never mixes two sequences, so a per-sequence forward of the same weights is
an independent recompute of every log-prob the trainer's packed forward produced.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import torch
from torch import nn

VOCAB = 11


class TinyLM(nn.Module):
    """Embeddings, a causal mean over the sequence so far, a linear head: `logits [1, N, VOCAB]`."""

    def __init__(self, seed: int, d: int = 8) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed, self.pos = nn.Embedding(VOCAB, d), nn.Embedding(64, d)
        self.head = nn.Linear(d, VOCAB)

    def forward(self, input_ids, position_ids=None, cu_seq_lens_q=None, **_model_kwargs) -> SimpleNamespace:
        ids = input_ids.reshape(-1).long()  # (N,)
        N = ids.shape[0]
        cu = torch.tensor([0, N]) if cu_seq_lens_q is None else cu_seq_lens_q.reshape(-1).long()
        seq_of = torch.repeat_interleave(torch.arange(len(cu) - 1), cu.diff())  # (N,)
        local = torch.arange(N) - cu[:-1][seq_of]  # (N,) position in its sequence
        h = self.embed(ids) + self.pos(local.clamp(max=63))  # (N, d); only padding is longer
        total = torch.cumsum(h, 0)  # (N, d)
        before = torch.cat([torch.zeros_like(h[:1]), total])[cu[:-1]][seq_of]  # (N, d) sum before the seq
        mean = (total - before) / (local + 1)[:, None]  # (N, d) causal mean within the sequence
        return SimpleNamespace(logits=self.head(torch.tanh(h + mean))[None])  # (1, N, VOCAB)


@torch.no_grad()
def token_logps(model: nn.Module, tokens: list[int]) -> torch.Tensor:
    """log p(token i | tokens before i) for i >= 1 of ONE sequence, by a forward of it alone: `[len - 1]`."""
    ids = torch.tensor(tokens)
    logits = model(ids[None]).logits[0, :-1].float()  # (L - 1, V)
    return torch.log_softmax(logits, -1).gather(-1, ids[1:, None])[:, 0]


def perturbed(model: TinyLM, seed: int, scale: float = 0.3) -> TinyLM:
    """Another version of the weights (an older policy that generated some tokens)."""
    other = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator))
    return other


@torch.no_grad()
def sample(models: list[TinyLM], prompt: list[int], switch: int, length: int, seed: int):
    """Sample `length` response tokens: the first `switch` from `models[0]`, the rest from `models[1]` (a
    generation interrupted by a weight update and resumed); return the tokens and each one's log-prob under
    the model that sampled it."""
    generator = torch.Generator().manual_seed(seed)
    tokens, logps = list(prompt), []
    for i in range(length):
        model = models[0] if i < switch else models[1]
        logits = model(torch.tensor(tokens)[None]).logits[0, -1]  # (V,)
        token = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=generator))
        logps.append(float(torch.log_softmax(logits, -1)[token]))
        tokens.append(token)
    return tokens[len(prompt) :], logps
