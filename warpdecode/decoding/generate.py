"""Plain autoregressive generation (one target forward per token) with timing statistics.

This is the reference every faster algorithm is measured and tested against: it knows nothing
about drafting, only prefill → select → append until EOS or the token budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Literal

import torch

from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.errors import ConfigError
from warpdecode.models.cache import KVCache
from warpdecode.models.tokenizer import StreamDecoder, Tokenizer
from warpdecode.models.transformer import Transformer

FinishReason = Literal["eos", "length", "context"]


@dataclass
class DecodeStats:
    """Counters of one generation; definitions in docs/metrics.md."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    target_forwards: int = 0
    """Backbone forwards after the prefill (the prefill itself is not counted)."""
    seconds: float = 0.0
    """Wall time from the start of the prefill to the last token."""
    time_to_first_token: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self) | {"tokens_per_second": self.tokens_per_second}


@dataclass
class GenerateOutput:
    token_ids: list[int]
    """New tokens only (the prompt is not repeated)."""
    text: str
    finish_reason: FinishReason
    stats: DecodeStats = field(default_factory=DecodeStats)


def encode_prompt(tokenizer: Tokenizer, prompt: str, *, chat: bool | None) -> list[int]:
    """Token ids of `prompt`, wrapped in the chat template when `chat` (None: if the model has one)."""
    use_chat = tokenizer.chat_template is not None if chat is None else chat
    if use_chat:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
        return tokenizer.encode(text, add_special_tokens=False)
    return tokenizer.encode(prompt)


def stop_token_ids(model: Transformer, tokenizer: Tokenizer | None) -> set[int]:
    ids = set(model.config.eos_token_ids)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


@torch.inference_mode()
def generate(
    model: Transformer,
    tokenizer: Tokenizer | None,
    prompt: str | list[int],
    *,
    max_new_tokens: int = 128,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    chat: bool | None = None,
    stop_at_eos: bool = True,
    streamer: Callable[[str], None] | None = None,
) -> GenerateOutput:
    """Generate a continuation of `prompt` (text, or token ids used as they are).

    Keyword names follow Hugging Face `generate()`. Greedy unless `do_sample`. `streamer` receives
    text increments as tokens are produced. Without a tokenizer the prompt must be token ids and the
    output text is empty.
    """
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ConfigError("a text prompt needs a tokenizer")
        prompt = encode_prompt(tokenizer, prompt, chat=chat)
    ids = list(prompt)
    if max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    sampler = Sampler(SamplingConfig(do_sample, temperature, top_k, top_p, seed), device=model.embed.weight.device)
    context = model.config.max_seq_len
    if not ids:
        raise ConfigError("the prompt is empty")
    if len(ids) >= context:
        raise ConfigError(f"the prompt has {len(ids)} tokens but the model's context is {context} tokens")
    device = model.embed.weight.device
    budget = min(max_new_tokens, context - len(ids))
    cache = KVCache.for_model(model.config, 1, len(ids) + budget, dtype=model.embed.weight.dtype, device=device)
    stops = stop_token_ids(model, tokenizer) if stop_at_eos else set()
    stream = StreamDecoder(tokenizer) if streamer is not None and tokenizer is not None else None
    stats = DecodeStats(prompt_tokens=len(ids))

    start = time.perf_counter()
    logits = model(torch.tensor([ids], device=device), cache=cache, logits_slice=slice(-1, None)).logits[:, -1]
    new: list[int] = []
    finish: FinishReason = "length" if budget == max_new_tokens else "context"
    while True:
        token = int(sampler.select(logits)[0])
        new.append(token)
        if len(new) == 1:
            stats.time_to_first_token = time.perf_counter() - start
        if stream is not None:
            assert streamer is not None
            streamer(stream.push([token]))
        if token in stops:
            finish = "eos"
            break
        if len(new) == budget:
            break
        logits = model(torch.tensor([[token]], device=device), cache=cache).logits[:, -1]
        stats.target_forwards += 1
    stats.seconds = time.perf_counter() - start
    stats.new_tokens = len(new)
    return GenerateOutput(token_ids=new, text=tokenizer.decode(new) if tokenizer else "", finish_reason=finish, stats=stats)
