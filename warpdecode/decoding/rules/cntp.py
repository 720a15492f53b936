"""Cautious next-token prediction (Wang et al. 2025, "Cautious Next Token Prediction"; the authors'
`_sample_reflect_perplexity`, wyzjack/CNTP).

Sampling, except where the model is unsure: at a step whose processed distribution p (penalties,
hooks and the sampling warpers applied) has entropy H (nats), it samples

    n = floor(1 + (max_trials - 1) · clamp((H - entropy_low) / (entropy_high - entropy_low), 0, 1))

trials independently from that step, each until it samples a punctuation token (or a stop token, or
the budget ends), and keeps the trial of lowest perplexity exp(mean -log p(token)) under the
distributions it was sampled from (the first one on a tie). n = 1 is one ordinary sampled token. The
defaults are the authors': 10 trials at most, entropy from 0.01 to 1.5 nats, and their ten marks
`. , ? ! : ; ) ] }` and the line break (`newline`); a punctuation token is one whose text is made of
those marks and whitespace (a byte-level BPE merges ".\\n", which the authors' single-character ids
would miss).

The trials run as one batch: rows of one KV cache (`prefill_rows`), each step one forward of n rows.
Row 0 carries the text; rows 1.. are brought up to it (a copy of the positions they lack) only when a
step needs them, and the kept trial's positions are copied back to row 0. Every token is drawn by
inverse CDF from one uniform of the request's generator per row and step, so a seed fixes the output.
"""

from __future__ import annotations

import math
import time

import torch
from torch import Tensor

from warpdecode.decoding.outputs import DecodeStats
from warpdecode.decoding.processors import TokenHistory
from warpdecode.decoding.registry import register
from warpdecode.decoding.rules.protocols import Decoded, DecodingRule, Emitter
from warpdecode.decoding.sampler import Sampler
from warpdecode.decoding.search.rows import prefill_rows
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.cache import KVCache
from warpdecode.models.tokenizer import Tokenizer


def trial_count(entropy: float, entropy_low: float, entropy_high: float, max_trials: int) -> int:
    """How many trials a step of this entropy (nats) samples: 1 up to `entropy_low`, rising linearly to
    `max_trials` at `entropy_high` (floored, as the authors' int())."""
    normalized = min(max((entropy - entropy_low) / (entropy_high - entropy_low), 0.0), 1.0)
    return int(1 + (max_trials - 1) * normalized)


def entropy(probs: Tensor) -> float:
    """Entropy in nats of a (V,) distribution, with the authors' 1e-10 inside the log."""
    return float(-(probs * torch.log(probs + 1e-10)).sum())


def inverse_cdf(probs: Tensor, uniforms: Tensor) -> Tensor:
    """The token each row's uniform picks. probs: (N, V) float; uniforms: (N,) in [0, 1). Returns (N,) int64."""
    cdf = probs.double().cumsum(-1)
    cdf = cdf / cdf[:, -1:]
    index = torch.searchsorted(cdf, uniforms.double()[:, None].to(cdf.device), right=True)[:, 0]
    return index.clamp(max=probs.shape[-1] - 1)


def punctuation_ids(tokenizer: Tokenizer, marks: str) -> frozenset[int]:
    """Tokens whose text holds at least one of `marks` and nothing but marks and whitespace (a "\\n" in
    `marks` makes line breaks marks)."""
    out = set()
    for i in range(tokenizer.vocab_size):
        text = tokenizer.decode([i])
        if any(c in marks for c in text) and all(c in marks or c.isspace() for c in text):
            out.add(i)
    return frozenset(out)


def _bring_up(cache: KVCache, rows: int) -> None:
    """Rows 1..rows-1 take row 0's positions they lack (each row's length is the prefix it shares with row 0)."""
    end = int(cache.lengths[0])
    begin = int(cache.lengths[1:rows].min())
    cache.k[:, 1:rows, :, begin:end] = cache.k[:, 0:1, :, begin:end]
    cache.v[:, 1:rows, :, begin:end] = cache.v[:, 0:1, :, begin:end]
    cache.lengths[1:rows] = end


@register("rule", "cntp")
class CautiousNextToken(DecodingRule):
    needs_sampling = True

    def __init__(self, max_trials: int = 10, entropy_low: float = 0.01, entropy_high: float = 1.5,
                 punctuation: str = ".,?!:;)]}", newline: bool = True) -> None:
        if max_trials < 1:
            raise ConfigError(f"cntp max_trials must be >= 1, got {max_trials}")
        if not (0 <= entropy_low < entropy_high and math.isfinite(entropy_high)):
            raise ConfigError(f"cntp needs 0 <= entropy_low < entropy_high (finite), got {entropy_low} and {entropy_high}")
        if not (punctuation and not punctuation.isspace()) and not newline:
            raise ConfigError("cntp needs marks that end a trial: a punctuation that is not whitespace, or newline")
        self.max_trials, self.entropy_low, self.entropy_high = max_trials, entropy_low, entropy_high
        self.marks = "".join(c for c in punctuation if not c.isspace()) + ("\n" if newline else "")
        self._ids: tuple[Tokenizer, frozenset[int]] | None = None

    def _stops(self, tokenizer: Tokenizer | None) -> frozenset[int]:
        if tokenizer is None:
            raise ConfigError("cntp stops its trials at punctuation: it needs a tokenizer (the prompt was token ids)")
        if self._ids is None or self._ids[0] is not tokenizer:
            self._ids = (tokenizer, punctuation_ids(tokenizer, self.marks))
        return self._ids[1]

    @torch.inference_mode()
    def decode(self, target: Backbone, prompt_ids: list[int], sampler: Sampler, emit: Emitter) -> Decoded:
        marks = self._stops(emit.tokenizer)
        generator = sampler.generator
        assert generator is not None  # needs_sampling: generate() refuses greedy decoding
        device = target.embed.weight.device
        stats = DecodeStats(prompt_tokens=len(prompt_ids))
        start = time.perf_counter()
        cache, logits = prefill_rows(target, prompt_ids, self.max_trials, len(prompt_ids) + emit.max_new_tokens)
        tokens = list(prompt_ids)
        row0 = logits[None]  # (1, V): after the text so far
        while True:
            history = TokenHistory.single(tokens, len(prompt_ids))
            probs = sampler.probs(sampler.penalize(row0, history))  # (1, V)
            n = trial_count(entropy(probs[0]), self.entropy_low, self.entropy_high, self.max_trials)
            budget = emit.max_new_tokens - len(emit.new)
            if n == 1 or budget == 1:
                chosen = inverse_cdf(probs, torch.rand(1, generator=generator, device=generator.device)).tolist()
            else:
                chosen, row0 = self._trials(target, cache, tokens, len(prompt_ids), probs, n, budget, marks,
                                            sampler, emit.stop_ids, stats)
            if not stats.time_to_first_token:
                stats.time_to_first_token = time.perf_counter() - start
            tokens += chosen
            if not all(emit.push(t) for t in chosen):
                break
            if n == 1 or budget == 1:
                view = cache.rows(0, 1)
                row0 = target(torch.tensor([chosen], device=device), cache=view).logits[:, -1].float()
                cache.set_rows(0, view)
                stats.target_forwards += 1
            stats.accepted_per_step += [0] * len(chosen)
            stats.proposed_per_step += [0] * len(chosen)
        return emit.decoded(stats, start)

    def _trials(self, target: Backbone, cache: KVCache, tokens: list[int], prompt_len: int, probs: Tensor, n: int,
                budget: int, marks: frozenset[int], sampler: Sampler, stop_ids: set[int],
                stats: DecodeStats) -> tuple[list[int], Tensor]:
        """Sample `n` trials from `probs` (1, V) as rows 0..n-1 of `cache`; keep the lowest-perplexity one in
        row 0. Returns its tokens and the (1, V) logits after it."""
        generator = sampler.generator
        assert generator is not None
        device = target.embed.weight.device
        _bring_up(cache, n)
        begin = int(cache.lengths[0])
        first = inverse_cdf(probs.expand(n, -1), torch.rand(n, generator=generator, device=generator.device))  # (n,)
        trials = [[int(t)] for t in first]
        nll = [[-math.log(float(probs[0, t]))] for t in first.tolist()]
        done = [t in marks or t in stop_ids or budget == 1 for t in first.tolist()]
        after: list[Tensor | None] = [None] * n
        view = cache.rows(0, n)
        while True:
            out = target(torch.tensor([[t[-1]] for t in trials], device=device), cache=view).logits[:, -1].float()
            stats.target_forwards += 1
            for r in range(n):
                if done[r] and after[r] is None:
                    after[r] = out[r : r + 1]
            if all(done):
                break
            history = TokenHistory(torch.tensor(tokens, dtype=torch.int64), prompt_len, tuple(map(tuple, trials)))
            step = sampler.probs(sampler.penalize(out, history))  # (n, V)
            picked = inverse_cdf(step, torch.rand(n, generator=generator, device=generator.device)).tolist()
            for r in range(n):
                if not done[r]:
                    trials[r].append(picked[r])
                    nll[r].append(-math.log(float(step[r, picked[r]])))
                    done[r] = picked[r] in marks or picked[r] in stop_ids or len(trials[r]) >= budget
        cache.set_rows(0, view)
        perplexity = [sum(x) / len(x) for x in nll]  # log perplexity: the same order
        best = min(range(n), key=lambda r: perplexity[r])
        end = begin + len(trials[best])
        if best:
            cache.k[:, 0, :, begin:end] = cache.k[:, best, :, begin:end]
            cache.v[:, 0, :, begin:end] = cache.v[:, best, :, begin:end]
        lengths = cache.lengths.clone()
        lengths[0], lengths[1:n] = end, begin
        cache.truncate(lengths)
        kept = after[best]
        assert kept is not None
        return trials[best], kept
