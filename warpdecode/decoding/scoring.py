"""The target's log-probabilities at a request's new tokens, scored after they were chosen.

A `TokenScorer` follows one request on a one-row cache of its own: it prefills the prompt, then reads
each batch of new tokens in one forward and returns, for every token, `log_softmax` of the target's
raw logits at its position (before temperature, top-k/top-p, penalties or a grammar's mask: the
model's own distribution, as OpenAI's `logprobs` report it) and the `top` most likely tokens.

The scores do not depend on how the tokens were chosen (plain or speculative steps, whatever else was
in the batch) nor on how they are handed in (all at once, or one step's tokens at a time): the prefill
is the batch's own (one forward over the prompt, or its chunks, last position), and every new token's forward runs
batch-invariantly (`kernels/invariance.py`): each position computes what a one-token step at it
computes alone. So a request decoded plainly in the batch is scored with the very numbers it was
decoded with, and the same tokens score the same with speculation on or off.

Example: prompt `p`, new tokens `[a, b]` then `[c]`: the prefill of `p` gives the logits before `a`;
the forward of `[a, b]` gives those before `b` and before `c`; the forward of `[c]` those after `c`
(kept for a next token).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from warpdecode.errors import ConfigError
from warpdecode.kernels.invariance import batch_invariant
from warpdecode.models.backbone import Backbone
from warpdecode.models.cache import KVCache

SCORE_CHUNK = 128
"""Most new tokens one forward reads: a longer batch is scored in pieces (the same numbers) so that its
(T, V) logits stay small (128 x 49k fp32: 25 MB)."""


@dataclass(frozen=True)
class TokenLogprob:
    """The target's log-probability of one new token and of its `top` most likely alternatives."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]
    """(token, logprob) of the most likely tokens at this position, most likely first (ties: lower id first)."""


class TokenScorer:
    """Scores a request's new tokens under `target`, batch by batch (module docstring)."""

    def __init__(self, target: Backbone, prompt: list[int], *, max_new_tokens: int, top: int = 0,
                 prefill_chunk: int | None = None) -> None:
        """`max_new_tokens`: new tokens at most (the cache holds the prompt and them); `top`: alternatives
        returned per token (0: only the token's own log-probability); `prefill_chunk`: prefill a longer
        prompt this many tokens per forward, as a `ContinuousBatch` with that `prefill_chunk` does."""
        if not prompt:
            raise ConfigError("scoring needs a non-empty prompt")
        if top < 0 or max_new_tokens < 1:
            raise ConfigError(f"top must be >= 0 and max_new_tokens >= 1, got {top} and {max_new_tokens}")
        self.target, self.prompt, self.top, self.prefill_chunk = target, list(prompt), top, prefill_chunk
        self.room = len(prompt) + max_new_tokens
        self.scored = 0
        self._cache: KVCache | None = None
        self._next: torch.Tensor | None = None  # (V,) logits before the next token

    def score(self, tokens: list[int]) -> list[TokenLogprob]:
        """The log-probabilities of the request's next `tokens` (those after the ones scored so far)."""
        if len(self.prompt) + self.scored + len(tokens) > self.room:
            raise ConfigError(f"{self.scored + len(tokens)} new tokens exceed the scorer's "
                              f"{self.room - len(self.prompt)}")
        return [s for i in range(0, len(tokens), SCORE_CHUNK) for s in self._score(tokens[i : i + SCORE_CHUNK])]

    @torch.inference_mode()
    def _score(self, tokens: list[int]) -> list[TokenLogprob]:
        device = self.target.embed.weight.device
        if self._cache is None:
            self.target.pack_for_cpu_inference()  # the weights the batch decodes with (packing rounds apart)
            self._cache = KVCache.for_model(self.target.config, 1, self.room, dtype=self.target.embed.weight.dtype,
                                            device=device, zeroed=False)
            step = len(self.prompt) if self.prefill_chunk is None else self.prefill_chunk
            for i in range(0, len(self.prompt), step):
                out = self.target(torch.tensor([self.prompt[i : i + step]], device=device), cache=self._cache,
                                  logits_slice=slice(-1, None))
            self._next = out.logits[0, -1]
        assert self._next is not None
        T = len(tokens)
        chain = torch.ones(T, T, dtype=torch.bool, device=device).tril()[None]  # (1, T, T) causal
        with batch_invariant():
            out = self.target(torch.tensor([tokens], device=device), cache=self._cache,
                              attention_mask=None if T == 1 else chain)
        logits = torch.cat([self._next[None], out.logits[0, :-1]])  # (T, V): before each token
        self._next = out.logits[0, -1].clone()  # not a view that keeps all T rows
        self.scored += T
        return scores(logits, torch.tensor(tokens, device=device), self.top)


@torch.inference_mode()
def prompt_logprobs(target: Backbone, prompt: list[int], top: int = 0) -> list[TokenLogprob]:
    """The log-probability of every prompt token after the ones before it (the first has none: not in
    the list) and of the `top` most likely tokens there: what OpenAI's `echo` reports for a prompt. The
    prompt is read `SCORE_CHUNK` tokens per forward, so only a chunk's (T, V) logits exist at a time."""
    if not prompt:
        raise ConfigError("scoring needs a non-empty prompt")
    device = target.embed.weight.device
    cache = KVCache.for_model(target.config, 1, len(prompt), dtype=target.embed.weight.dtype, device=device,
                              zeroed=False)
    scored: list[TokenLogprob] = []
    for i in range(0, len(prompt) - 1, SCORE_CHUNK):
        chunk = prompt[i : i + SCORE_CHUNK]
        logits = target(torch.tensor([chunk], device=device), cache=cache).logits[0]  # (T, V): before each next token
        following = prompt[i + 1 : i + 1 + len(chunk)]
        scored += scores(logits[: len(following)], torch.tensor(following, device=device), top)
    return scored


def scores(logits: torch.Tensor, tokens: torch.Tensor, top: int) -> list[TokenLogprob]:
    """Every token's log-probability under its row of raw `logits` and the `top` most likely tokens.

    Args:
        logits: (T, V) float logits before each token.
        tokens: (T,) int64 the tokens.
        top: alternatives per token.
    """
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # (T, V)
    chosen = logprobs.gather(1, tokens[:, None])[:, 0].tolist()  # (T,)
    pairs: list[tuple[tuple[int, float], ...]] = [()] * len(chosen)
    if top:
        # ordered by (logprob descending, id), so that ties come out the same whatever the top-k kernel
        # does with them; one more than asked for shows whether a tie straddles the cut (then, rarely, the
        # whole row is read: every token at least as likely as the top-th)
        values, ids = logprobs.topk(min(top + 1, logprobs.shape[1]), dim=-1)  # (T, top + 1)
        for t, (row_values, row_ids) in enumerate(zip(values.tolist(), ids.tolist(), strict=True)):
            if len(row_values) > top and row_values[top] == row_values[top - 1]:
                tied = (logprobs[t] >= row_values[top - 1]).nonzero()[:, 0]
                row_values, row_ids = logprobs[t, tied].tolist(), tied.tolist()
            ranked = sorted(zip(row_values, row_ids, strict=True), key=lambda p: (-p[0], p[1]))
            pairs[t] = tuple((i, v) for v, i in ranked[:top])
    return [TokenLogprob(t, lp, alt) for t, lp, alt in zip(tokens.tolist(), chosen, pairs, strict=True)]
