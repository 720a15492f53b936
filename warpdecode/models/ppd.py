"""Parallel prompt decoding (PPD, Chen et al. 2024): K trained prompt tokens let the frozen target
guess the tokens after the one it is about to emit.

The prompt tokens p_1..p_K are input embeddings (K, C) outside the vocabulary. Appended after a token
x_t at positions t+1..t+K, prompt p_j seeing the context up to x_t and p_1..p_j, they run through the
target's own layers; the target's final feature at p_j predicts x_{t+1+j}, j places after the token
x_{t+1} that the target predicts from x_t:

    x_t ──► target ─► x_{t+1}
     └─ p_1 ─ p_2 ─ p_3 ──► target ─► x_{t+2}, x_{t+3}, x_{t+4}

Only the K·C embeddings are trained; the target, its LM head and the frozen reduced-vocabulary head
the guesses are ranked over (`draft_head.DraftVocabNet`) are not.
"""

from __future__ import annotations

import dataclasses
from typing import Self

import torch
from torch import Tensor, nn

from warpdecode.kernels.packed_linear import Linear
from warpdecode.models.config import ModelConfig
from warpdecode.models.draft_head import DraftVocabNet
from warpdecode.models.net_config import NetConfig
from warpdecode.models.transformer import Transformer


@dataclasses.dataclass(frozen=True, kw_only=True)
class PPDConfig(NetConfig):
    """A PPD package's prompt tokens."""

    kind = "PPD prompt tokens"
    draft_vocab_size: int
    num_prompts: int


class PromptTokens(DraftVocabNet):
    """The K prompt embeddings and the frozen reduced-vocabulary head their features are read through."""

    head_key = "head.weight"
    config_class = PPDConfig

    def __init__(self, d_model: int, draft_vocab_size: int, num_prompts: int) -> None:
        super().__init__(draft_vocab_size)
        if num_prompts < 1:
            raise ValueError(f"need num_prompts >= 1, got {num_prompts}")
        self.prompts = nn.Parameter(torch.zeros(num_prompts, d_model))  # (K, C)
        self.head = Linear(d_model, draft_vocab_size, bias=False)

    @classmethod
    def from_config(cls, target: ModelConfig, config: PPDConfig) -> Self:
        return cls(target.d_model, config.draft_vocab_size, config.num_prompts)

    @property
    def num_prompts(self) -> int:
        return self.prompts.shape[0]

    def init_from_target(self, target: Transformer, draft_vocab: Tensor) -> None:
        """Every prompt starts as the mean input embedding of the draft vocabulary `draft_vocab` (N,)
        (a token-like input the target has seen the statistics of); the head is tied to the target."""
        with torch.no_grad():
            self.draft_vocab.copy_(draft_vocab)
            mean = target.embed.weight[draft_vocab.to(target.embed.weight.device)].float().mean(0)
            self.prompts.copy_(mean.to(self.prompts.device).expand_as(self.prompts))
        self.tie_head(target)

    def pack(self) -> None:
        """oneDNN-packed copy of the head (`packed_linear`); the prompts are inputs, not weights."""
        self.head.pack()


def appended_prompt_layout(T: int, starts: Tensor, num_prompts: int) -> tuple[Tensor, Tensor]:
    """Positions and attention mask of one cache-free forward over T context tokens followed by a
    group of K prompt rows after each start (training: every group in one forward).

    Args:
        T: context length.
        starts: (B, S) int64 context index t of each group (its prompts continue x_t).
        num_prompts: K.
    Returns:
        positions: (B, T + S*K) int64: 0..T-1, then t+1..t+K for each group in turn.
        mask: (B, T + S*K, T + S*K) bool: causal over the context (which never sees a prompt); prompt
            j of a group sees the context up to its start and its group's prompts 1..j.

    Example: T=3, starts [[1]], K=2 → positions [[0, 1, 2, 2, 3]]; row 3 (p_1) sees keys {0, 1, 3},
    row 4 (p_2) sees {0, 1, 3, 4}.
    """
    B, S = starts.shape
    K = num_prompts
    device = starts.device
    offsets = torch.arange(1, K + 1, device=device)  # (K,)
    prompt_positions = (starts[:, :, None] + offsets).reshape(B, S * K)
    positions = torch.cat([torch.arange(T, device=device).expand(B, T), prompt_positions], dim=1)
    N = T + S * K
    mask = torch.zeros(B, N, N, dtype=torch.bool, device=device)
    mask[:, :T, :T] = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    context_seen = torch.arange(T, device=device)[None, None] <= starts[:, :, None]  # (B, S, T)
    mask[:, T:, :T] = context_seen[:, :, None].expand(B, S, K, T).reshape(B, S * K, T)
    mask[:, T:, T:] = torch.block_diag(*[torch.ones(K, K, dtype=torch.bool, device=device).tril()] * S)
    return positions, mask
