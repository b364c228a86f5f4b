"""Verifiable tasks of the reference trainer: prompts of one fixed length `P`, a response budget `R`, and
a rule-based reward in [0, 1] per response.

- `DigitReversal` (the tiny policy): `d1 .. dk =`, answer the digits reversed then EOS; reward: the
  fraction of answer positions right.
- `ThreeSentences` (SmolLM2-135M-Instruct): "Write three short sentences about the X." in the model's
  chat format; reward: 1/3 per finished sentence (up to 3), and only if the response ends (EOS) within
  the budget. The instruct model starts around 0.2 (it rambles past the budget) and learns to be concise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from evaluator.trainer.policy import Tokenizer


@dataclass(frozen=True)
class DigitReversal:
    digits: int
    eos: int = 10
    sep: int = 11
    vocab_size: int = 12

    @property
    def P(self) -> int:
        return self.digits + 1

    @property
    def R(self) -> int:
        return self.digits + 1

    def prompts(self, g: torch.Generator, n: int) -> torch.Tensor:
        """`n` prompts `d1 .. dk =` `(n, P)`."""
        ds = torch.randint(0, 10, (n, self.digits), generator=g)  # (n, k)
        return torch.cat([ds, torch.full((n, 1), self.sep)], 1)  # (n, P)

    def rewards(self, prompt: torch.Tensor, response: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        """Fraction of answer positions right: the reversed digits, then EOS `(n,)`."""
        target = torch.cat([prompt[:, :-1].flip(1), torch.full((len(prompt), 1), self.eos)], 1)  # (n, R)
        made = torch.arange(self.R)[None, :] < length[:, None]  # (n, R) positions actually generated
        return ((response[:, : self.R] == target) & made).float().mean(1)  # (n,)


TOPICS = (
    "cat", "dog", "sea", "moon", "robot", "river", "king", "apple", "tree", "train", "bird", "house", "rain",
    "snow", "city", "car", "book", "music", "garden", "winter", "summer", "forest", "horse", "ship", "star",
)  # fmt: skip
"""Single-token nouns in SmolLM2's vocabulary, so that every prompt has the same length."""
CHAT = "<|im_start|>user\nWrite three short sentences about the {topic}.<|im_end|>\n<|im_start|>assistant\n"
SENTENCE_END = re.compile(r"[.!?](\s|$)")


@dataclass(frozen=True)
class ThreeSentences:
    tokenizer: Tokenizer
    R: int = 48

    def __post_init__(self) -> None:
        lengths = {len(self.tokenizer.encode(CHAT.format(topic=t))) for t in TOPICS}
        if len(lengths) != 1:
            raise ValueError(f"prompts of different lengths {sorted(lengths)}: pick single-token topics")

    @property
    def eos(self) -> int:
        return self.tokenizer.eos

    @property
    def P(self) -> int:
        return len(self.tokenizer.encode(CHAT.format(topic=TOPICS[0])))

    def prompts(self, g: torch.Generator, n: int) -> torch.Tensor:
        """`n` prompts on random topics `(n, P)`."""
        picks = torch.randint(0, len(TOPICS), (n,), generator=g).tolist()
        return torch.tensor([self.tokenizer.encode(CHAT.format(topic=TOPICS[i])) for i in picks])

    def rewards(self, prompt: torch.Tensor, response: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        """1/3 per sentence (up to 3) of a response that ended within the budget, else 0 `(n,)`."""
        out = []
        for row, n in zip(response.tolist(), length.tolist(), strict=True):  # per response, not per token
            ended = n > 0 and row[n - 1] == self.eos
            text = self.tokenizer.decode(row[:n])
            out.append(float(ended) * min(1.0, len(SENTENCE_END.findall(text)) / 3))
        return torch.tensor(out)
