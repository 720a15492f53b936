"""What every search strategy does with its rows: one prefill shared by n cache rows, the per-row
processing of next-token log-probabilities (penalties, banned n-grams), and the tokens' text."""

from __future__ import annotations

import torch
from torch import Tensor

from warpdecode.decoding.outputs import Candidate
from warpdecode.decoding.processors import TokenHistory
from warpdecode.decoding.sampler import Sampler
from warpdecode.models.backbone import Backbone
from warpdecode.models.cache import KVCache
from warpdecode.models.tokenizer import Tokenizer

MAX_ROWS = 256
"""The most rows (beams, samples) a search keeps: each is a row of the KV cache."""


def prefill_rows(model: Backbone, prompt: list[int], rows: int, max_len: int) -> tuple[KVCache, Tensor]:
    """Run the prompt once and give each of `rows` cache rows its keys and values.

    Returns:
        the cache (`rows` rows of the prompt, room for `max_len` positions) and the (V,) float32 logits
        after the prompt's last token.
    """
    device = model.embed.weight.device
    model.pack_for_cpu_inference()
    cache = model.new_cache(rows, max_len)
    one = cache if rows == 1 else model.new_cache(1, len(prompt))
    out = model(torch.tensor([prompt], device=device), cache=one, logits_slice=slice(-1, None))
    if rows > 1:
        cache.fill_from_row(one)
    return cache, out.logits[0, -1].float()


def next_row_logits(model: Backbone, cache: KVCache, tokens: list[list[int]], active: list[int],
                    still: list[int]) -> tuple[list[int], Tensor]:
    """Keep only the cache rows `still` (positions in `active`) and run each one's last token.

    Args:
        tokens: every row's tokens so far (the last one not yet in the cache).
        active: the rows in the cache, in cache order; still: the indices into `active` that go on.
    Returns:
        the rows left in the cache, in cache order, and their (B, V) next-token logits (one forward).
    """
    if len(still) < len(active):
        cache.keep_rows(still)
    active = [active[j] for j in still]
    pending = torch.tensor([[tokens[i][-1]] for i in active], device=model.embed.weight.device)
    return active, model(pending, cache=cache).logits[:, -1]


def banned_ngrams(tokens: Tensor, n: int) -> Tensor:
    """Which next tokens would repeat an n-gram already in each row (Hugging Face's `no_repeat_ngram_size`,
    prompt included): a window whose first n-1 tokens equal the row's last n-1 tokens bans its last token.

    Args:
        tokens: (B, T) int64 rows of prompt and generated tokens.
    Returns:
        (B, V_seen) bool where V_seen = max token id + 2; column t bans token t (the last column is a spare).
    Example: n=2, row [5 7 5] → windows (5,7) (7,5); the suffix (5,) matches (5,7): token 7 is banned.
    """
    B, T = tokens.shape
    width = int(tokens.max()) + 2
    banned = torch.zeros(B, width, dtype=torch.bool)
    if T < n:
        return banned
    windows = tokens.unfold(1, n, 1)  # (B, T-n+1, n)
    suffix = tokens[:, T + 1 - n :]  # (B, n-1)
    matches = (windows[..., :-1] == suffix[:, None]).all(-1)  # (B, T-n+1)
    banned.scatter_(1, torch.where(matches, windows[..., -1], width - 1), True)
    banned[:, -1] = False
    return banned


def process_logprobs(logprobs: Tensor, sampler: Sampler, tokens: Tensor, prompt_len: int,
                     no_repeat_ngram_size: int) -> Tensor:
    """The processed log-probabilities beam search ranks: the sampler's penalties (each row with its own
    context) and banned n-grams (`-inf`), in Hugging Face's order (penalties, then n-grams).

    Args:
        logprobs: (B, V) float32 log-softmax of the target's logits.
        tokens: (B, T) int64 each row's prompt (its first `prompt_len`, the same in every row) and
            generated tokens.
    Returns:
        (B, V) float32.
    """
    if sampler.penalties:
        generated = tuple(tuple(row) for row in tokens[:, prompt_len:].tolist())
        history = TokenHistory(tokens[0, :prompt_len], prompt_len, generated)
        logprobs = sampler.penalize(logprobs, history)
    if no_repeat_ngram_size:
        banned = banned_ngrams(tokens, no_repeat_ngram_size)
        width = min(banned.shape[1], logprobs.shape[1])
        mask = torch.zeros_like(logprobs, dtype=torch.bool)
        mask[:, :width] = banned[:, :width].to(logprobs.device)
        logprobs = logprobs.masked_fill(mask, float("-inf"))
    return logprobs


def with_text(candidates: list[Candidate], tokenizer: Tokenizer | None, stops: tuple[str, ...] = ()) -> list[Candidate]:
    """The candidates with their text decoded (empty without a tokenizer); a candidate that ended at a stop
    string (finish reason "stop") has its text end before it, as `generate`'s does."""
    if tokenizer is not None:
        for c in candidates:
            c.text = tokenizer.decode(c.token_ids)
            if c.finish_reason == "stop":
                c.text = c.text[: min((i for i in (c.text.find(s) for s in stops) if i >= 0), default=len(c.text))]
    return candidates
