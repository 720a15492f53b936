"""Acceptance labels for SpecDec++: where would the target accept the drafter's token?

For greedy speculative decoding the target accepts a drafted token exactly when it equals the
target's own greedy token, given that every earlier token of the step was accepted, i.e. given a
prefix that *is* the target's greedy output. So running the drafter teacher-forced along the
target's greedy answers (`SelfDistillDataModule`'s cache) labels every position of a real rollout
with the acceptance the verifier would decide, in one drafter forward per answer instead of a
speculative decode: label[t] = (drafter's argmax after tokens[:t+1] == tokens[t+1]).

The drafter is the target's own weight-only quantised copy (`int4_self` / `int8_self`). Each sample is
(the drafter's final normed hidden state (C,), `draft_signals` (2,), label); batches are
`features` (B, C) float32, `signals` (B, 2) float32, `labels` (B,) float32. The samples are cached
on disk next to the self-distillation data, keyed by it and by the drafter (`AnswerSamplesDataModule`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor
from tqdm.auto import tqdm

from warpdecode.datamodules.answer_samples import AnswerSamplesDataModule
from warpdecode.datamodules.self_distill import Example
from warpdecode.errors import ConfigError
from warpdecode.models.acceptance_head import draft_signals
from warpdecode.models.quantized import Bits, quantized_copy
from warpdecode.models.transformer import Transformer

CACHE_VERSION = 1


@torch.inference_mode()
def label_examples(draft: Transformer, examples: list[Example], desc: str) -> dict[str, Tensor]:
    """`features` (N, C) float16, `signals` (N, 2) float32 and `labels` (N,) bool of every answer
    position of `examples` (positions prompt_length - 1 .. T - 2, each predicting the next token)."""
    L = draft.config.n_layer
    features, signals, labels = [], [], []
    for example in tqdm(examples, desc=desc, unit="answer", disable=None):
        tokens = torch.from_numpy(example.tokens.astype("int64"))
        start, end = example.prompt_length - 1, len(tokens) - 1
        if end <= start:
            continue
        out = draft(tokens[None], hidden_layers=(L,), logits_slice=slice(start, end))
        logits = out.logits[0]  # (T_answer, V)
        features.append(out.hidden_states[L][0, start:end].to(torch.float16))
        signals.append(draft_signals(logits))
        labels.append(logits.argmax(-1) == tokens[start + 1 : end + 1])
    if not labels:
        raise ConfigError(f"{desc}: no answer token to label (the split holds no answer)")
    return {"features": torch.cat(features), "signals": torch.cat(signals), "labels": torch.cat(labels)}


class AcceptanceDataModule(AnswerSamplesDataModule):
    cache_name: ClassVar[str] = "acceptance"
    sample_keys: ClassVar[tuple[str, ...]] = ("features", "signals", "labels")

    def __init__(
        self,
        target: str = "smollm2-135m-instruct",
        bits: Bits = 4,
        prompts: list[str] | None = None,
        max_prompts: int = 2048,
        max_new_tokens: int = 192,
        max_length: int = 512,
        val_fraction: float = 0.05,
        max_train_answers: int = 384,
        max_val_answers: int = 64,
        batch_size: int = 512,
        cache_dir: str | None = None,
    ) -> None:
        """
        Args:
            target: The model to draft for (the drafter is its quantised copy).
            bits: 4 (`int4_self`) or 8 (`int8_self`).
            prompts, max_prompts, max_new_tokens, max_length, val_fraction, cache_dir: the self-distillation data
                (`SelfDistillDataModule`; the defaults reuse the drafter recipes' cache).
            max_train_answers: Label at most this many answers of the train split (one drafter
                forward each).
            max_val_answers: ... and of the val split.
            batch_size: Samples (answer positions) per batch.
        """
        super().__init__(target, prompts, max_prompts, max_new_tokens, max_length, val_fraction, max_train_answers,
                         max_val_answers, batch_size, cache_dir)
        self.save_hyperparameters()
        self.bits = bits

    def cache_key(self) -> dict[str, Any]:
        return {"version": CACHE_VERSION, "bits": self.bits}

    def make_samples(self, target: Transformer, examples: list[Example], desc: str) -> dict[str, Tensor]:
        return label_examples(quantized_copy(target, self.bits), examples, desc)

    def summarize(self, splits: dict[str, Any]) -> dict[str, float]:
        return {"train_samples": len(splits["train"]["labels"]),
                "accept_rate": round(float(splits["train"]["labels"].float().mean()), 4)}
