"""Logits processors: the penalties and filters that define the distribution tokens come from.

Two kinds, applied in this order:

* **Penalties** depend on the tokens so far (`TokenHistory`) and apply in greedy and sampled
  decoding alike: repetition (Hugging Face's CTRL-style rule, over prompt and output), frequency
  and presence (the OpenAI / vLLM rule, over the generated tokens only).
* **Warpers** depend only on the logits and apply when sampling, in Hugging Face's order:
  temperature, top-k, top-p, min-p, typical-p. Removed tokens get logit `-inf`.

Each processor is a pure function of its inputs; every row of a tree verification gets the
penalties of its own context (the committed tokens plus its root-to-node path), so speculative
decoding with penalties stays token-identical to plain decoding with the same penalties.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

NEG_INF = float("-inf")


@dataclass(frozen=True)
class TokenHistory:
    """The token contexts of `N` logits rows sharing a prefix: row r follows `prefix + extra[r]`.

    Example (a tree verification): prefix = prompt and generated tokens up to the pending one; row 0
    (after the pending token) has no extra tokens, row i+1 (after tree node i) has node i's
    root-to-node path.
    """

    prefix: Tensor  # (P,) int64
    prompt_len: int
    """The first `prompt_len` tokens of `prefix` are the prompt (not counted as generated)."""
    extra: tuple[tuple[int, ...], ...]  # N rows of generated tokens after the prefix

    @classmethod
    def single(cls, tokens: list[int], prompt_len: int) -> TokenHistory:
        return cls(torch.tensor(tokens, dtype=torch.int64), prompt_len, ((),))

    def context(self, row: int) -> Tensor:
        """(P + len(extra[row]),) int64: every token row `row` follows, prompt first."""
        return torch.cat([self.prefix, torch.tensor(self.extra[row], dtype=torch.int64)])

    def tail(self, row: int, n: int) -> list[int]:
        """The last `n` tokens (fewer when the context is shorter) row `row` follows."""
        extra = list(self.extra[row][-n:]) if n else []
        need = n - len(extra)
        return (self.prefix[max(0, len(self.prefix) - need) :].tolist() if need > 0 else []) + extra

    def counts(self, *, generated_only: bool) -> tuple[Tensor, Tensor]:
        """Occurrences of every token seen in any row's context.

        Returns:
            ids: (U,) int64 distinct token ids; counts: (N, U) float32, row r's count of each id.
        """
        base = self.prefix[self.prompt_len :] if generated_only else self.prefix
        rows = torch.tensor([r for r, toks in enumerate(self.extra) for _ in toks], dtype=torch.int64)
        extra = torch.tensor([t for toks in self.extra for t in toks], dtype=torch.int64)
        ids = torch.unique(torch.cat([base, extra]))  # sorted
        counts = torch.zeros(len(self.extra), ids.numel())
        counts += torch.bincount(torch.searchsorted(ids, base), minlength=ids.numel()).float()
        counts.index_put_((rows, torch.searchsorted(ids, extra)), torch.ones(extra.numel()), accumulate=True)
        return ids, counts


class Penalty(Protocol):
    def __call__(self, logits: Tensor, history: TokenHistory) -> Tensor:
        """(N, V) float logits → (N, V) penalised logits for the N contexts of `history`."""
        ...


class Warper(Protocol):
    def __call__(self, logits: Tensor) -> Tensor:
        """(N, V) float logits → (N, V) logits, `-inf` where a token is filtered out."""
        ...


def _apply_to_seen(logits: Tensor, ids: Tensor, counts: Tensor, rule: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    """Replace the logits of the seen ids by `rule(seen_logits, counts)` where counts > 0."""
    index = ids.to(logits.device).expand(logits.shape[0], -1)  # (N, U)
    seen = logits.gather(1, index)
    counts = counts.to(logits.device)
    return logits.scatter(1, index, torch.where(counts > 0, rule(seen, counts), seen))


@dataclass(frozen=True)
class RepetitionPenalty:
    """Divide positive / multiply negative logits of tokens already in the context (prompt included)
    by `penalty` (> 1 discourages repeats), as Hugging Face's `repetition_penalty`."""

    penalty: float

    def __call__(self, logits: Tensor, history: TokenHistory) -> Tensor:
        ids, counts = history.counts(generated_only=False)
        p = self.penalty
        return _apply_to_seen(logits, ids, counts, lambda seen, _: torch.where(seen > 0, seen / p, seen * p))


@dataclass(frozen=True)
class FrequencyPresencePenalty:
    """Subtract `frequency * count + presence * [count > 0]` from the logits of generated tokens,
    as the OpenAI API and vLLM's `frequency_penalty` / `presence_penalty`."""

    frequency: float
    presence: float

    def __call__(self, logits: Tensor, history: TokenHistory) -> Tensor:
        ids, counts = history.counts(generated_only=True)
        f, pr = self.frequency, self.presence
        return _apply_to_seen(logits, ids, counts, lambda seen, c: seen - f * c - pr * (c > 0).float())


@dataclass(frozen=True)
class Temperature:
    temperature: float

    def __call__(self, logits: Tensor) -> Tensor:
        return logits / self.temperature


@dataclass(frozen=True)
class TopK:
    k: int

    def __call__(self, logits: Tensor) -> Tensor:
        kth = torch.topk(logits, min(self.k, logits.shape[-1]), dim=-1).values[:, -1:]  # (N, 1)
        return logits.masked_fill(logits < kth, NEG_INF)


@dataclass(frozen=True)
class TopP:
    """Keep the smallest set of most likely tokens whose probability mass reaches `p` (at least
    `min_tokens_to_keep` of them), by Hugging Face's `TopPLogitsWarper` rule.

    The mass is summed from the least likely token up (sort ascending, softmax, cumsum) and a token
    is dropped when the mass up to and including it is <= 1 - p. Summing the many tiny
    probabilities first keeps the float32 cumsum within rounding of the float64 one; a descending
    cumsum over a 49,152-token vocabulary drifts by ~1e-7 and keeps another set in about one row in
    a hundred.
    """

    p: float
    min_tokens_to_keep: int = 1

    def __post_init__(self) -> None:
        if self.min_tokens_to_keep < 1:
            raise ValueError(f"min_tokens_to_keep must be >= 1, got {self.min_tokens_to_keep}")

    def __call__(self, logits: Tensor) -> Tensor:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=False)  # (N, V), least likely first
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # (N, V)
        drop_sorted = cumulative <= 1 - self.p
        drop_sorted[..., -self.min_tokens_to_keep :] = False  # the most likely tokens always stay
        return logits.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), NEG_INF)


@dataclass(frozen=True)
class MinP:
    """Keep tokens with probability at least `p` times the most likely token's (Nguyen et al. 2024)."""

    p: float

    def __call__(self, logits: Tensor) -> Tensor:
        probs = torch.softmax(logits, dim=-1)
        return logits.masked_fill(probs < self.p * probs.amax(dim=-1, keepdim=True), NEG_INF)


@dataclass(frozen=True)
class TypicalP:
    """Locally typical sampling (Meister et al. 2023): keep the tokens whose surprisal is closest to
    the entropy, in that order, until their mass reaches `p` (Hugging Face's `typical_p`)."""

    p: float

    def __call__(self, logits: Tensor) -> Tensor:
        logp = torch.log_softmax(logits, dim=-1)  # (N, V)
        entropy = -(logp.exp() * logp).nansum(-1, keepdim=True)  # (N, 1)
        distance, order = (-logp - entropy).abs().sort(dim=-1)  # closest to typical first
        mass = logp.gather(-1, order).exp().cumsum(-1)
        last = (mass < self.p).sum(-1, keepdim=True).clamp(max=logits.shape[-1] - 1)  # (N, 1)
        drop_sorted = distance > distance.gather(-1, last)
        return logits.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), NEG_INF)
