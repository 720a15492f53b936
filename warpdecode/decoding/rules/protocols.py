"""What a decoding rule is: a one-sequence loop of its own that chooses each next token by a rule
other than the target's processed argmax or sample (contrastive search, Mirostat).

Rules share the backbone, cache, `Sampler` (penalties and the caller's logits hooks) and stats types
with the engine, and the same stop handling (stop tokens, stop strings, streaming). They change the
output distribution by design (`lossless = False`) and do not compose with a drafter: `generate`
refuses a speculative method together with a rule (docs/decoding-rules.md says why for each).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import torch
from torch import Tensor

from warpdecode.decoding.outputs import DecodeStats, FinishReason
from warpdecode.decoding.processors import TokenHistory
from warpdecode.decoding.sampler import Sampler
from warpdecode.models.backbone import Backbone
from warpdecode.models.tokenizer import Tokenizer

Decoded = tuple[list[int], FinishReason, DecodeStats]
"""(new tokens, finish reason, stats), as `engine.run` returns them."""


@dataclass
class Emitter:
    """Where a rule's loop puts each chosen token: streaming, stop strings, stop tokens and the budget."""

    stop_ids: set[int]
    max_new_tokens: int
    on_tokens: Callable[[list[int]], None] | None = None
    stop_check: Callable[[list[int]], int | None] | None = None
    tokenizer: Tokenizer | None = None
    """The request's tokenizer, for a rule that reads token texts (None: the prompt was token ids)."""
    new: list[int] = field(default_factory=list)
    finish: FinishReason | None = None

    def decoded(self, stats: DecodeStats, start: float) -> Decoded:
        """What a rule's loop returns once `push` said to stop: the tokens, the finish reason and `stats`
        with its time since `start` (`time.perf_counter()`) and its token count."""
        stats.seconds = time.perf_counter() - start
        stats.new_tokens = len(self.new)
        assert self.finish is not None
        return self.new, self.finish, stats

    def push(self, token: int) -> bool:
        """Take the next token; False once decoding has ended (a stop string wins over a stop token)."""
        self.new.append(token)
        if self.stop_check is not None and self.stop_check([token]) is not None:
            self.finish = "stop"
        elif token in self.stop_ids:
            self.finish = "eos"
        elif len(self.new) >= self.max_new_tokens:
            self.finish = "length"
        if self.on_tokens is not None:
            self.on_tokens([token])
        return self.finish is None


class DecodingRule(Protocol):
    name: ClassVar[str] = ""
    lossless: ClassVar[bool] = False
    """A rule chooses other tokens than the target's distribution by design."""
    needs_training: ClassVar[bool] = False
    needs_sampling: ClassVar[bool] = False
    """Whether it draws samples (needs `do_sample`, a random generator in the sampler)."""

    def for_prompt(self, prompt: str | list[int], encode: Callable[[str | list[int]], list[int]]) -> DecodingRule:
        """This rule for one request, which `generate()` decodes with instead of the rule itself: `prompt`
        as the caller gave it, and `encode`, which makes the ids of a text or id prompt the way the
        request's were made (chat template, BOS, the context check). A rule that decodes against a second
        prompt (context-aware decoding's context-free one, USCD's lame one) returns a copy that holds its
        ids; the default is the rule itself."""
        return self

    def decode(self, target: Backbone, prompt_ids: list[int], sampler: Sampler, emit: Emitter) -> Decoded:
        """Decode after `prompt_ids` (which fit the context with `emit.max_new_tokens` more tokens) until
        `emit.push` says to stop."""
        ...


def one_token_per_forward(target: Backbone, prompt_ids: list[int], sampler: Sampler, emit: Emitter,
                          choose: Callable[[Tensor], int]) -> Decoded:
    """The loop of a rule that picks each token from the target's next-token logits alone (Mirostat,
    momentum decoding): one forward per token over one KV cache.

    `choose` gets the (1, V) float32 logits after the text so far, penalties and hooks applied, and
    returns the next token.
    """
    device = target.embed.weight.device
    target.pack_for_cpu_inference()
    cache = target.new_cache(1, len(prompt_ids) + emit.max_new_tokens)
    stats = DecodeStats(prompt_tokens=len(prompt_ids))
    start = time.perf_counter()
    with torch.inference_mode():
        logits = target(torch.tensor([prompt_ids], device=device), cache=cache, logits_slice=slice(-1, None)).logits[:, -1]
        tokens = list(prompt_ids)
        while True:
            token = choose(sampler.penalize(logits, TokenHistory.single(tokens, len(prompt_ids))).float())
            tokens.append(token)
            if not stats.time_to_first_token:
                stats.time_to_first_token = time.perf_counter() - start
            if not emit.push(token):
                break
            logits = target(torch.tensor([[token]], device=device), cache=cache).logits[:, -1]
            stats.target_forwards += 1
            stats.accepted_per_step.append(0)
            stats.proposed_per_step.append(0)
    return emit.decoded(stats, start)
