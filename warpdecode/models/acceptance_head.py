"""SpecDec++'s acceptance-prediction head: how likely the target is to accept the token just drafted.

The head reads what the drafter knows when it proposes a token: its final normed hidden state at the
position that predicts the token, plus two signals of its own distribution there (the top-1
probability and the entropy). It returns one logit: the probability that the target accepts the
drafted token given that every earlier draft token of the step was accepted. A drafter with a head
stops a chain once the predicted probability that some token of it is rejected passes a threshold
(`decoding/drafters/draft_model.py`), so it drafts long where the target will agree and short where
it will not. Trained with BCE on the drafter's predictions along the target's own greedy answers
(`datamodules/acceptance.py`, `modules/acceptance.py`).
"""

from __future__ import annotations

import dataclasses
from typing import Self

import torch
from torch import Tensor, nn

from warpdecode.errors import ConfigError
from warpdecode.models.net_config import NetConfig

NUM_SIGNALS = 2


def draft_signals(logits: Tensor) -> Tensor:
    """(N, V) draft logits → (N, 2) fp32 [top-1 probability, entropy in nats] of each row's softmax."""
    logp = logits.float().log_softmax(-1)
    return torch.stack([logp.max(-1).values.exp(), -(logp.exp() * logp).sum(-1)], dim=-1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AcceptanceHeadConfig(NetConfig):
    """An `acceptance_head` package's head."""

    kind = "acceptance head"
    d_model: int
    hidden: int = 256


class AcceptanceHead(nn.Module):
    @classmethod
    def from_config(cls, config: AcceptanceHeadConfig) -> Self:
        return cls(config.d_model, config.hidden)

    def __init__(self, d_model: int, hidden: int = 256) -> None:
        super().__init__()
        if d_model < 1 or hidden < 1:
            raise ConfigError(f"d_model and hidden must be positive, got {d_model}, {hidden}")
        self.d_model = d_model
        self.net = nn.Sequential(nn.Linear(d_model + NUM_SIGNALS, hidden), nn.SiLU(), nn.Linear(hidden, hidden),
                                 nn.SiLU(), nn.Linear(hidden, 1))

    def forward(self, features: Tensor, signals: Tensor) -> Tensor:
        """(N, C) draft hidden states, (N, 2) `draft_signals` → (N,) logits of "accepted"."""
        if features.shape[-1] != self.d_model:
            raise ConfigError(f"this acceptance head reads {self.d_model}-wide features, got {features.shape[-1]}")
        return self.net(torch.cat([features.float(), signals.float()], dim=-1))[..., 0]
