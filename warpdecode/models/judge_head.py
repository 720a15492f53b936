"""Judge decoding's judge: is a drafted token an acceptable continuation, even where the target's
argmax is another token?

Standard verification rejects every draft token that is not the target's own choice, even a correct
one worded differently ("So" for "Therefore", " 2" for " two"). The judge is a compact module on the
target's own embedding of the drafted token (Bachmann et al. 2025): the target's final normed hidden
state at the drafted token's position, which the verify forward computes anyway. To it we add three
signals of the target's distribution at the position that predicted the token: the token's log
probability, the top-1 log probability and the entropy (what typical acceptance reads). One linear
layer maps them to the logit of "acceptable". The `judge` verifier (`decoding/verifiers/judge.py`)
accepts a token the target agrees with or the judge approves; labels come from the target's own
rollouts (`datamodules/judge.py`).
"""

from __future__ import annotations

import dataclasses
from typing import Self

import torch
from torch import Tensor, nn

from warpdecode.errors import ConfigError
from warpdecode.models.net_config import NetConfig

NUM_SIGNALS = 3


def judge_signals(logits: Tensor, tokens: Tensor) -> Tensor:
    """(N, V) target logits at the positions that predict `tokens` (N,) → (N, 3) fp32
    [log p(token), top-1 log probability, entropy in nats]."""
    logp = logits.float().log_softmax(-1)
    token_logp = logp.gather(-1, tokens[:, None].to(logp.device))[:, 0]
    return torch.stack([token_logp, logp.max(-1).values, -(logp.exp() * logp).sum(-1)], dim=-1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class JudgeHeadConfig(NetConfig):
    """A `judge` package's head."""

    kind = "judge head"
    d_model: int


class JudgeHead(nn.Module):
    @classmethod
    def from_config(cls, config: JudgeHeadConfig) -> Self:
        return cls(config.d_model)

    def __init__(self, d_model: int) -> None:
        super().__init__()
        if d_model < 1:
            raise ConfigError(f"d_model must be positive, got {d_model}")
        self.d_model = d_model
        self.linear = nn.Linear(d_model + NUM_SIGNALS, 1)

    def forward(self, features: Tensor, signals: Tensor) -> Tensor:
        """(N, C) target hidden states at the drafted tokens, (N, 3) `judge_signals` → (N,) logits of
        "acceptable"."""
        if features.shape[-1] != self.d_model:
            raise ConfigError(f"this judge reads {self.d_model}-wide hidden states, got {features.shape[-1]}")
        return self.linear(torch.cat([features.float(), signals.float()], dim=-1))[..., 0]
