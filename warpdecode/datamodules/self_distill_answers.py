"""An autoregressive target's own answers laid out for a masked diffusion LM (AR → diffusion adaptation).

The same regenerated data as the drafter recipes (`SelfDistillDataModule`: the target's greedy
answers to the prompt sources, cached on disk), served in the layout `MaskedDiffusionModule` trains on:
`tokens` (B, T) prompt then answer then end-of-text up to the batch's longest example,
`prompt_lengths` (B,) and `lengths` (B,) (all T). As in LLaDA's supervised fine-tuning, the
end-of-text padding belongs to the answer region and is masked and predicted like any answer
token, so the model learns to end its answer inside a fixed-length region.

A diffusion LM adapted on its target's own answers is the drafter DiffuSpec wants: it imitates the
model it drafts for. A drafter sees a different layout, though: the sequence so far (prompt plus
part of the answer) and a short region of `num_tokens` masks after it, with nothing beyond. With
`draft_region` set, every example is cut that way: a random point of its answer ends the prefix and
the next `draft_region` tokens are the region (end-of-text after an answer that ends sooner);
validation cuts each example at a point fixed by its content, so validations compare.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from warpdecode.datamodules.self_distill import Example, SelfDistillDataModule
from warpdecode.errors import ConfigError


class AnswerRegions:
    """Collate examples into answer regions padded with `eos_token_id` (picklable for workers).

    `draft_region` None: prompt, then the whole answer and end-of-text up to the batch's longest
    example (every row's length is the batch width). Otherwise: a prefix cut at a point of the answer
    (random, or fixed by the example's content when `fixed_cuts`) and the next `draft_region`
    tokens; rows are right-padded, `lengths` says where each ends.
    """

    def __init__(self, eos_token_id: int, draft_region: int | None = None, fixed_cuts: bool = False) -> None:
        self.eos_token_id, self.draft_region, self.fixed_cuts = eos_token_id, draft_region, fixed_cuts
        self.rng = np.random.default_rng()

    def cut(self, example: Example) -> int:
        """Where the prefix of `example` ends: a point in [prompt length, answer end)."""
        rng = np.random.default_rng(zlib.crc32(example.tokens.tobytes())) if self.fixed_cuts else self.rng
        return int(rng.integers(example.prompt_length, max(len(example.tokens), example.prompt_length + 1)))

    def __call__(self, examples: list[Example]) -> dict[str, Tensor]:
        if self.draft_region is None:
            rows = [(e.tokens, e.prompt_length) for e in examples]
            width = max(len(t) for t, _ in rows)
            lengths = [width] * len(rows)
        else:
            cuts = [self.cut(e) for e in examples]
            rows = [(e.tokens[: c + self.draft_region], c) for e, c in zip(examples, cuts)]
            lengths = [c + self.draft_region for c in cuts]
            width = max(lengths)
        tokens = torch.full((len(rows), width), self.eos_token_id, dtype=torch.int64)
        for row, (ids, _) in enumerate(rows):
            tokens[row, : len(ids)] = torch.from_numpy(ids.astype(np.int64))
        return {"tokens": tokens, "prompt_lengths": torch.tensor([p for _, p in rows]),
                "lengths": torch.tensor(lengths, dtype=torch.int64)}


class SelfDistillAnswersDataModule(SelfDistillDataModule):
    """`SelfDistillDataModule`'s examples as answer regions for `MaskedDiffusionModule` (see the module docstring)."""

    def __init__(self, *args: Any, draft_region: int | None = None, **kwargs: Any) -> None:
        """
        Args:
            draft_region: Train for drafting: regions of this many tokens after a random point of
                the answer (DiffuSpec's `num_tokens`); None: whole answers (LLaDA SFT).
            args, kwargs: `SelfDistillDataModule`'s arguments.
        """
        if draft_region is not None and draft_region < 1:
            raise ConfigError(f"draft_region must be >= 1, got {draft_region}")
        super().__init__(*args, **kwargs)
        self.draft_region = draft_region

    def batch_collate(self, split: str) -> Callable[[list[Example]], dict[str, Tensor]]:
        if self.tokenizer is None or self.tokenizer.eos_token_id is None:
            raise RuntimeError("call setup() first: the answer regions are padded with the target's end-of-text")
        return AnswerRegions(self.tokenizer.eos_token_id, self.draft_region, fixed_cuts=split != "train")
