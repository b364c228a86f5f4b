"""The reference trainer's inference engine: its own copy of the policy, decoding while the trainer trains.

As in a real asynchronous system (AReaL with SGLang or vLLM): the engine's weights are rounded to bf16 (so
its log-probs differ slightly from the fp32 trainer's); at each weight update it aborts every response in
flight, loads version `step + 1` and resumes with a prefill of what was generated so far, which also gives
each token generated under the version just replaced its log-prob under the new one (`proximal_t`,
DOMAIN.md section 4); finished groups wait in a FIFO rollout buffer; admission control keeps at most
`(version + max_staleness + 1) * groups_per_step` groups ever started.

Responses are decoded in waves: a few groups in lockstep with one decoding state (a key-value cache for
SmolLM2), several waves in flight, a new wave admitted at most once per tick so that they stagger.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn


@dataclass
class EngineConfig:
    group_size: int
    """responses per prompt (GRPO group)"""
    groups_per_step: int
    """groups the trainer takes per step (for admission control)"""
    engine_groups: int
    """groups in flight at most"""
    wave_groups: int
    """groups decoded in lockstep as one wave"""
    max_staleness: int
    bf16: bool
    """round the engine's weights to bf16"""


@dataclass(eq=False)  # a wave is itself: the engine removes it from its list by identity
class Wave:
    """`n` responses decoded in lockstep: the buffers of what was generated and the decoding state."""

    ids: torch.Tensor  # (n, P + R) prompt, then response (EOS-padded)
    seq_id: torch.Tensor  # (n,)
    length: torch.Tensor  # (n,) response tokens generated
    done: torch.Tensor  # (n,) finished: EOS or the budget R
    versions: torch.Tensor  # (n, R) version that generated each token
    behave: torch.Tensor  # (n, R) its log-prob under that version
    prox_t: torch.Tensor  # (n, R) proximal_t: the log-prob under behave_version + 1 (or own)
    prox_t_version: torch.Tensor  # (n, R)
    logits: torch.Tensor  # (n, V) predicting the next token
    state: Any = None
    ticks: int = 0


def token_logp(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token], without forming the whole log-softmax: `(..., V)`, `(...)` -> `(...)`."""
    logits = logits.float()
    return logits.gather(-1, tokens[..., None]).squeeze(-1) - torch.logsumexp(logits, -1)


@dataclass
class Engine:
    model: nn.Module
    task: Any
    config: EngineConfig
    g: torch.Generator
    version: int = 0
    admitted: int = 0
    next_seq_id: int = 0
    buffer: deque = field(default_factory=deque)
    waves: list[Wave] = field(default_factory=list)
    tokens_generated: int = 0

    def load(self, state: dict, version: int) -> None:
        """Publish trainer weights; responses in flight are aborted and resumed under the new version."""
        with torch.no_grad():
            for name, p in self.model.state_dict().items():
                w = state[name]
                p.copy_(w.to(torch.bfloat16).float() if self.config.bf16 else w)
        self.version = version
        for wave in self.waves:
            self._resume(wave)

    @torch.no_grad()
    def _resume(self, wave: Wave) -> None:
        """Resume prefill under the new weights. Only tokens of version `version - 1` of responses still in
        flight take its log-probs as proximal_t (seeds/001); older tokens, and responses that already
        ended (their rows wait in the wave for its other rows), keep theirs."""
        P, k = self.task.P, wave.ticks
        logits, wave.state = self.model.prefill(wave.ids[:, : P + k])  # (n, P + k, V)
        wave.logits = logits[:, -1]
        if k == 0:
            return
        logp = token_logp(logits[:, P - 1 : P + k - 1], wave.ids[:, P : P + k])  # (n, k) response tokens
        update = (wave.versions[:, :k] == self.version - 1) & ~wave.done[:, None]  # (n, k)
        wave.prox_t[:, :k] = torch.where(update, logp, wave.prox_t[:, :k])
        wave.prox_t_version[:, :k] = torch.where(update, self.version, wave.prox_t_version[:, :k])

    @torch.no_grad()
    def _admit(self) -> None:
        """Start one wave if a slot is free and admission control allows it."""
        c, G = self.config, self.config.group_size
        allowed = (self.version + c.max_staleness + 1) * c.groups_per_step - self.admitted
        n_groups = min(c.wave_groups, c.engine_groups - c.wave_groups * len(self.waves), allowed)
        if n_groups < c.wave_groups:
            return
        prompts = self.task.prompts(self.g, n_groups).repeat_interleave(G, 0)  # (n, P) G samples each
        n, P, R = len(prompts), self.task.P, self.task.R
        ids = torch.full((n, P + R), self.task.eos)
        ids[:, :P] = prompts
        logits, state = self.model.prefill(prompts)
        wave = Wave(
            ids=ids,
            seq_id=torch.arange(self.next_seq_id, self.next_seq_id + n),
            length=torch.zeros(n, dtype=torch.long),
            done=torch.zeros(n, dtype=torch.bool),
            versions=torch.full((n, R), -1),
            behave=torch.zeros(n, R),
            prox_t=torch.zeros(n, R),
            prox_t_version=torch.full((n, R), -1),
            logits=logits[:, -1],
            state=state,
        )
        self.next_seq_id += n
        self.admitted += n_groups
        self.waves.append(wave)

    @torch.no_grad()
    def tick(self) -> None:
        """Decode one token of every response in flight; move finished waves' groups to the buffer."""
        self._admit()
        for wave in list(self.waves):
            j, live = wave.ticks, ~wave.done  # (n,)
            probs = torch.softmax(wave.logits.float(), -1)  # (n, V)
            tok = torch.multinomial(probs, 1, generator=self.g).squeeze(1)  # (n,)
            tok = torch.where(live, tok, self.task.eos)
            P = self.task.P
            wave.ids[:, P + j] = tok
            logp = token_logp(wave.logits, tok)  # (n,)
            wave.versions[live, j], wave.behave[live, j] = self.version, logp[live]
            wave.prox_t[live, j], wave.prox_t_version[live, j] = logp[live], self.version
            wave.length += live
            wave.ticks += 1
            wave.done |= (tok == self.task.eos) | (wave.ticks == self.task.R)
            self.tokens_generated += int(live.sum())
            if wave.done.all():
                self._harvest(wave)
            else:
                wave.logits, wave.state = self.model.extend(tok, wave.state)

    def _harvest(self, wave: Wave) -> None:
        self.waves.remove(wave)
        G = self.config.group_size
        for rows in torch.arange(len(wave.seq_id)).split(G):
            self.buffer.append(
                {
                    "ids": wave.ids[rows],
                    "n_gen": wave.length[rows],
                    **{k: getattr(wave, k)[rows] for k in ("versions", "behave", "prox_t", "prox_t_version")},
                    "seq_id": wave.seq_id[rows],
                }
            )
