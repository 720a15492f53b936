"""Context-aware decoding (Shi et al. 2023, "Trusting Your Evidence: Hallucinate Less with
Context-aware Decoding"): the next token comes from (1 + α)·logits(y | c, x) − α·logits(y | x), the
logits with the context c (a document, retrieved passages) amplified against those without it, so the
model leans on the context over its prior.

The context-free prompt x is given as the text the rule removes from the request's prompt
(`context=`), or as a whole prompt (`contrast_prompt=`); it is made into ids as the request's prompt
is (chat template, BOS). Both run batched as two rows of one cache (`rules/paired.py`): a step costs
one forward of two rows instead of one. Greedy or sampled: the penalties, the caller's hooks and the
sampling filters apply to the contrasted logits; α = 0 is plain decoding.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

from torch import Tensor

from warpdecode.decoding.registry import register
from warpdecode.decoding.rules.paired import decode_paired
from warpdecode.decoding.rules.protocols import Decoded, DecodingRule, Emitter
from warpdecode.decoding.sampler import Sampler
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone


def cad_logits(logits: Tensor, alpha: float) -> Tensor:
    """(1 + α)·logits[0] − α·logits[1].

    Args:
        logits: (2, V) float32, after the prompt with its context (row 0) and without it (row 1).
    Returns:
        (1, V) float32.
    """
    return (1 + alpha) * logits[:1] - alpha * logits[1:]


def context_free(prompt: str | list[int], context: str) -> str:
    """`prompt` with its first occurrence of `context` removed (a ConfigError when it has none)."""
    if not isinstance(prompt, str):
        raise ConfigError("cad context= needs a text prompt; for token ids give contrast_prompt= (the ids without it)")
    at = prompt.find(context)
    if at < 0:
        raise ConfigError(f"cad context= ({context[:40]!r}...) is not in the prompt; give the text exactly as the "
                          "prompt holds it, or contrast_prompt=")
    return prompt[:at] + prompt[at + len(context) :]


@register("rule", "cad")
class ContextAwareDecoding(DecodingRule):
    def __init__(self, alpha: float = 0.5, context: str | None = None,
                 contrast_prompt: str | list[int] | None = None) -> None:
        if not (alpha >= 0 and math.isfinite(alpha)):
            raise ConfigError(f"cad alpha must be a finite number >= 0, got {alpha}")
        if (context is None) == (contrast_prompt is None):
            raise ConfigError("cad needs one of context=TEXT (the part of the prompt the context-free prompt "
                              "lacks) and contrast_prompt=TEXT (the context-free prompt)")
        if context is not None and not context:
            raise ConfigError("cad context= is empty: name the text the context-free prompt lacks")
        self.alpha = alpha
        self.context = context
        self.contrast_prompt = contrast_prompt
        self.contrast_ids: list[int] | None = None

    def for_prompt(self, prompt: str | list[int], encode: Callable[[str | list[int]], list[int]]) -> DecodingRule:
        bound = copy.copy(self)
        if self.contrast_prompt is not None:
            bound.contrast_ids = encode(self.contrast_prompt)
        else:
            assert self.context is not None
            bound.contrast_ids = encode(context_free(prompt, self.context))
        return bound

    def decode(self, target: Backbone, prompt_ids: list[int], sampler: Sampler, emit: Emitter) -> Decoded:
        if self.contrast_ids is None:
            raise ConfigError("cad has no context-free prompt: decode the rule `for_prompt` returns (generate() does)")
        return decode_paired(target, prompt_ids, self.contrast_ids, sampler, emit,
                             lambda logits: cad_logits(logits, self.alpha))
