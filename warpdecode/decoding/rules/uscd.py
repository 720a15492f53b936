"""USCD (Wang et al. 2024, "Improving Code Generation of LLMs by Uncertainty-Aware Selective
Contrastive Decoding"): contrast the request's prompt against a "lame prompt", the same prompt without
its input-output examples, at the steps where the prompt's own next-token distribution is uncertain.

With the authors' rule (`EnsembleLogitsProcessor` in their CodeGen-USCD code): p is the distribution
after the prompt, q after the lame prompt.

* Uncertainty: the spread of p over the vocabulary. The authors contrast when the standard deviation
  of p is at most 0.005, which depends on the vocabulary size V (std(p) ≈ sqrt(Σp² / V)): at their
  CodeLlama's 32,016 tokens it is Σp² ≤ 0.80, at Qwen2.5's 151,936 it holds at every step. This rule
  gates on Σp² itself (the chance two draws from p agree; 1 for a point mass, 1/V for uniform):
  `threshold` 0.8 is their gate on their vocabulary, on any vocabulary.
* Contrast, at an uncertain step: the tokens with p ≥ `plausibility` / V (2/3 of the mean
  probability) keep p − β·q (β = 0.7), the rest and every token where it is not positive get −inf;
  at a certain step, log p. The penalties, the caller's hooks and the sampling filters apply after.

The lame prompt is `lame_prompt=` or, by default, the request's prompt with the examples of its last
docstring removed (`data.humaneval.without_examples`, HumanEval's form). Both prompts run batched as two
rows of one cache (`rules/paired.py`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import torch
from torch import Tensor

from warpdecode.decoding.registry import register
from warpdecode.decoding.rules.paired import decode_paired
from warpdecode.decoding.rules.protocols import Decoded, DecodingRule, Emitter
from warpdecode.decoding.sampler import Sampler
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone


def uscd_scores(logits: Tensor, threshold: float, beta: float, plausibility: float) -> Tensor:
    """The scores one USCD step chooses from.

    Args:
        logits: (2, V) float32, after the prompt (row 0) and after the lame prompt (row 1).
    Returns:
        (1, V) float32: log p where Σp² > `threshold` (certain), else log(p − β·q) on the plausible
        tokens and −inf elsewhere (log p when no token keeps a positive difference).
    """
    probs = torch.softmax(logits.float(), dim=-1)  # (2, V)
    standard, lame = probs[0], probs[1]
    if float((standard * standard).sum()) > threshold:
        return standard.log()[None]
    plausible = standard >= plausibility / standard.numel()
    contrast = torch.where(plausible, standard - beta * lame, torch.zeros_like(standard))
    if not bool((contrast > 0).any()):
        return standard.log()[None]
    return contrast.clamp_min(0).log()[None]  # log 0 = -inf


@register("rule", "uscd")
class SelectiveContrast(DecodingRule):
    def __init__(self, lame_prompt: str | list[int] | None = None, threshold: float = 0.8, beta: float = 0.7,
                 plausibility: float = 2 / 3) -> None:
        if not 0 <= threshold <= 1:
            raise ConfigError(f"uscd threshold (on the sum of squared probabilities) must be in [0, 1], got {threshold}")
        if not (beta >= 0 and math.isfinite(beta)):
            raise ConfigError(f"uscd beta must be a finite number >= 0, got {beta}")
        if not (plausibility >= 0 and math.isfinite(plausibility)):
            raise ConfigError(f"uscd plausibility must be a finite number >= 0, got {plausibility}")
        self.lame_prompt = lame_prompt
        self.threshold, self.beta, self.plausibility = threshold, beta, plausibility
        self.lame_ids: list[int] | None = None

    def for_prompt(self, prompt: str | list[int], encode: Callable[[str | list[int]], list[int]]) -> DecodingRule:
        bound = copy.copy(self)
        if self.lame_prompt is not None:
            bound.lame_ids = encode(self.lame_prompt)
        elif isinstance(prompt, str):
            from warpdecode.data.humaneval import without_examples

            bound.lame_ids = encode(without_examples(prompt))
        else:
            raise ConfigError("uscd on token ids needs lame_prompt= (it removes examples from a text prompt)")
        return bound

    def decode(self, target: Backbone, prompt_ids: list[int], sampler: Sampler, emit: Emitter) -> Decoded:
        if self.lame_ids is None:
            raise ConfigError("uscd has no lame prompt: decode the rule `for_prompt` returns (generate() does)")
        return decode_paired(target, prompt_ids, self.lame_ids, sampler, emit,
                             lambda logits: uscd_scores(logits, self.threshold, self.beta, self.plausibility))
