"""What a commit policy sees at each denoising step and what it returns.

At every step the diffusion LM predicts all masked positions at once; a commit policy decides which
of the masked positions of each row's current block are final now (and with which token). The
decoder (`decoder.py`) owns the loop, the blocks and end-of-text handling; policies own only the
choice, so every policy runs under the same loop and is compared on equal terms.

One kind of policy cannot be a per-step choice: a draft-and-verify decoder (FreeDave) runs several
candidate states in one batched forward and keeps the longest run the one-token-per-step decoder
would have produced. Such a policy sets `replaces_loop = True` and implements `decode`
(`LoopDecoder`); `diffusion_generate` then hands it the whole generation. Its output is tested
token for token against `fixed`, so it is still compared on equal terms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

from torch import Tensor

from warpdecode.decoding.diffusion.layout import DiffusionOutput
from warpdecode.models.backbone import Backbone


@dataclass(frozen=True)
class StepView:
    """One denoising step of a batch of B rows over L positions (prompt + answer region + padding)."""

    logits: Tensor
    """(B, L, V) fp32 logits at every position."""
    tokens: Tensor
    """(B, L) int64 top-1 prediction at every position."""
    confidence: Tensor
    """(B, L) fp32 probability of the top-1 prediction."""
    active: Tensor
    """(B, L) bool: the masked positions of each row's current block (what may be committed)."""
    masked: Tensor
    """(B, L) bool: every still-masked answer position (later blocks included)."""
    block: Tensor
    """(B, L) bool: every position of each row's current block, committed or not."""
    answer: Tensor
    """(B, L) bool: the answer region (gen_length positions after each row's prompt)."""
    step: int
    """Forwards done before this one in the current generation."""


@dataclass(frozen=True)
class Commit:
    positions: Tensor
    """(B, L) bool: positions made final now; within `active`, except a policy that commits ahead
    (Prophet's all-in) may take any `masked` position. Every row with an active position commits one."""
    tokens: Tensor
    """(B, L) int64: the token written at each committed position."""


class CommitPolicy(Protocol):
    lossless: bool
    """Whether the output is always that of one-token-per-step decoding (`fixed` with 1 token)."""
    needs_training: ClassVar[bool]
    """Runs a trained package (`path=`), made with `warpdecode fit` (learn2pd's filter)."""
    replaces_loop: bool
    """Whether the policy decodes a whole generation itself (`LoopDecoder.decode`) instead of
    choosing commits inside the shared loop."""

    def prepare(self, model: Backbone) -> None:
        """Check the policy fits `model` (a trained policy names the model it was trained for)."""
        ...

    def reset(self, batch: int, length: int) -> None:
        """A new generation of `batch` rows over `length` positions starts (clear per-position state)."""
        ...

    def select(self, view: StepView) -> Commit:
        ...


class LoopDecoder(CommitPolicy, Protocol):
    """A policy with `replaces_loop = True`: it runs the generation itself."""

    def decode(self, model: Backbone, prompts: list[list[int]], *, gen_length: int, block_length: int,
               eos_token_id: int, eot_stop: bool, kv_cache: str, temperature: float) -> DiffusionOutput:
        """The answers of `prompts`, as `diffusion_generate` returns them; a setting the decoder cannot
        honour is a ConfigError."""
        ...


class StatelessPolicy:
    """Base of policies that need no model check and keep nothing between steps."""

    replaces_loop = False
    needs_training: ClassVar[bool] = False

    def prepare(self, model: Backbone) -> None:
        """Nothing ties these policies to one model."""

    def reset(self, batch: int, length: int) -> None:
        """Nothing carries over from one step to the next."""
