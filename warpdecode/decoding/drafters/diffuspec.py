"""DiffuSpec: a masked diffusion LM drafts the next tokens of an autoregressive target in parallel.

Each step the diffusion LM reads the sequence so far (prompt plus every generated token, `pending`
last) followed by `num_tokens` mask positions and fills them in `steps` denoising steps, committing
its most confident positions first (`fixed` commit policy, `ceil(num_tokens / steps)` per step);
the filled positions are proposed as a chain and the target verifies them in one forward. One
diffusion call drafts the whole chain, whatever its length, where an autoregressive draft model
runs once per drafted token.

Adaptive draft length (DiffuSpec's ADL, simplified): with `min_confidence` set, the chain is cut
before the first position whose committed probability falls below it (at least one token stays).

The diffusion LM must share the target's tokenizer; its mask token may lie beyond the target's
vocabulary (an adapted autoregressive model: `configs/diffusion/smollm2-adapt.yaml`). It has no KV
cache (bidirectional attention: every key changes with every token), so a draft re-reads the
sequence; `context` bounds how many of the latest tokens it reads. Greedy verification keeps the
target's output token for token; drafts are deterministic, so speculative sampling stays lossless.
"""

from __future__ import annotations

import math
from typing import ClassVar

from warpdecode.decoding.diffusion.decoder import diffusion_generate
from warpdecode.decoding.diffusion.layout import check_diffusion_model
from warpdecode.decoding.diffusion.policies.fixed import FixedCommit
from warpdecode.decoding.protocols import AcceptResult, DecodeState, Drafter
from warpdecode.decoding.registry import register
from warpdecode.decoding.tree import DraftTree
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.transformer import Transformer


def confident_prefix(confidence: list[float], min_confidence: float | None) -> int:
    """How many leading draft positions to keep: up to (not including) the first below `min_confidence`,
    at least one. Example: [0.9, 0.8, 0.3, 0.9] with 0.5 → 2."""
    if min_confidence is None:
        return len(confidence)
    keep = next((i for i, c in enumerate(confidence) if c < min_confidence), len(confidence))
    return max(keep, 1)


@register("drafter", "diffuspec")
class DiffuSpecDrafter(Drafter):
    needs_training: ClassVar[bool] = True

    def __init__(self, model: str | None = None, num_tokens: int = 8, steps: int = 2,
                 min_confidence: float | None = None, context: int | None = None) -> None:
        """Args:
        model: the diffusion LM (a model directory or name) sharing the target's tokenizer.
        num_tokens: chain length drafted per step (the diffusion LM's answer region).
        steps: denoising steps per draft (1: every position from one forward).
        min_confidence: cut the chain before the first position committed with a lower probability.
        context: read at most this many of the latest tokens (default: as many as the model holds).
        """
        if model is None:
            raise ConfigError("diffuspec needs model= (a masked diffusion LM sharing the target's tokenizer)")
        if num_tokens < 1 or not 1 <= steps <= num_tokens:
            raise ConfigError(f"diffuspec needs num_tokens >= 1 and 1 <= steps <= num_tokens, got {num_tokens}, {steps}")
        if min_confidence is not None and not 0 < min_confidence < 1:
            raise ConfigError(f"diffuspec min_confidence must be in (0, 1), got {min_confidence}")
        if context is not None and context < 1:
            raise ConfigError(f"diffuspec context must be >= 1, got {context}")
        self.source, self.num_tokens, self.steps = model, num_tokens, steps
        self.min_confidence, self.context = min_confidence, context
        self.policy = FixedCommit(math.ceil(num_tokens / steps))
        self.dlm: Transformer | None = None
        self.eos_token_id = -1

    def prepare(self, target: Backbone) -> None:
        if self.dlm is not None:
            return
        dlm, tokenizer = load_pretrained(self.source, device=target.embed.weight.device)
        check_diffusion_model(dlm)
        if dlm.config.vocab_size < target.config.vocab_size:
            raise ConfigError(f"diffuspec model {self.source!r} has {dlm.config.vocab_size} tokens but the target "
                              f"{target.config.vocab_size}: the drafter must share the target's tokenizer")
        if tokenizer.eos_token_id is None:
            raise ConfigError(f"diffuspec model {self.source!r} has no end-of-text token")
        limit = dlm.config.max_seq_len - self.num_tokens
        if limit < 1:
            raise ConfigError(f"diffuspec num_tokens {self.num_tokens} leaves no context in the model's "
                              f"{dlm.config.max_seq_len} positions")
        self.context = min(self.context or limit, limit)
        self.vocab_size = target.config.vocab_size
        self.eos_token_id = tokenizer.eos_token_id
        self.dlm = dlm.eval()

    def start(self, state: DecodeState) -> None:
        """Nothing to set up: every draft re-reads the sequence (no drafter cache)."""

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        assert self.dlm is not None and self.context is not None, "prepare() first"
        length = min(self.num_tokens, budget)
        if length < 1:
            return DraftTree.chain([])
        out = diffusion_generate(self.dlm, [state.tokens[-self.context :]], self.policy, gen_length=self.num_tokens,
                                 block_length=self.num_tokens, eos_token_id=self.eos_token_id)
        start = out.sequences.shape[1] - self.num_tokens
        draft = out.sequences[0, start:].tolist()
        assert out.confidence is not None
        keep = confident_prefix(out.confidence[0, start:].tolist(), self.min_confidence)
        chain = draft[: min(keep, length)]
        # a token the target cannot score (the diffusion LM's own mask token) ends the chain
        cut = next((i for i, t in enumerate(chain) if t >= self.vocab_size), len(chain))
        return DraftTree.chain(chain[:cut])

    def observe(self, state: DecodeState, result: AcceptResult) -> None:
        """Nothing to update: the next draft reads the committed tokens from `state`."""

