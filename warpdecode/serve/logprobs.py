"""A request's log-probabilities: where the scheduler takes them from, and OpenAI's `logprobs` of a choice.

`RequestLogprobs` (the scheduler's side): a request decoded in the batch from its first token on takes
them from the logits its tokens were picked from (its row `keep_logits`); one that decoded alone first
has them scored by a `TokenScorer` (`decoding/scoring.py`), the same numbers (docs/serve.md).

Chat completions: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
"bytes"}, ...]}, ...]}`, `top_logprobs` holding the `top_logprobs` most likely tokens. Completions
(OpenAI's legacy shape): `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`, each
`top_logprobs` entry a `{token: logprob}` dict of the `logprobs` most likely tokens and the chosen
one (so up to `logprobs + 1` entries; tokens whose text is the same share one key), `text_offset` the
character offset of each token's text in the choice's text.

A token's text is the tokenizer's decoding of that token alone (a piece of a multi-byte character
decodes as U+FFFD); its `bytes` are the token's own bytes, so that a client can join a character that
spans tokens. Every new token has its entry, the stop token included: there are
`usage.completion_tokens` of them.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Literal

import torch

from warpdecode.decoding.constraints.llguidance_matcher import ll_tokenizer
from warpdecode.decoding.scoring import TokenLogprob, TokenScorer, scores
from warpdecode.models.backbone import Backbone
from warpdecode.models.tokenizer import Tokenizer


class RequestLogprobs:
    """One request's log-probabilities, step by step: handed over with each step's tokens (`stream`) or
    gathered for its end."""

    def __init__(self, target: Backbone, prompt: list[int], *, max_new_tokens: int, top: int, stream: bool,
                 prefill_chunk: int | None = None) -> None:
        self.top, self.stream = top, stream
        self.scorer: TokenScorer | None = TokenScorer(target, prompt, max_new_tokens=max_new_tokens, top=top,
                                                      prefill_chunk=prefill_chunk)
        """Scores the tokens that come without their logits (None once they come with them)."""
        self.carried: list[TokenLogprob] = []
        """The log-probabilities so far of a request that is not streamed, taken from its logits."""

    def step(self, tokens: list[int], logits: torch.Tensor | None) -> list[TokenLogprob] | None:
        """`tokens`' log-probabilities to hand over with them (streamed), or None. `logits`: (len(tokens), V)
        the raw logits each token was picked from (a batch row that keeps them; the same for every step of
        a request once given, from its first token on), or None."""
        if logits is not None:
            self.scorer = None
            scored = scores(logits, torch.tensor(tokens, device=logits.device), self.top)
        elif self.stream:
            assert self.scorer is not None, "a request's steps come all with their logits or all without"
            scored = self.scorer.score(tokens)
        else:
            return None  # scored at the end, in one forward
        if self.stream:
            return scored
        self.carried.extend(scored)
        return None

    def end(self, produced: list[int]) -> list[TokenLogprob] | None:
        """Every new token's log-probability (`produced`: the request's new tokens), or None when streamed."""
        if self.stream:
            return None
        return self.carried if self.scorer is None else self.scorer.score(produced)


class TokenStrings:
    """Each token id's text and bytes (cached)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, stop_ids: set[int]) -> None:
        self.tokenizer, self.vocab_size, self.stop_ids = tokenizer, vocab_size, frozenset(stop_ids)
        self.text = lru_cache(maxsize=1 << 16)(self._text)
        self.bytes = lru_cache(maxsize=1 << 16)(self._bytes)

    def ready(self) -> None:
        """Build the byte table now (~0.2 s on a 49k vocabulary, once per tokenizer), off the event loop."""
        ll_tokenizer(self.tokenizer, self.vocab_size, self.stop_ids)

    def _text(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False)

    def _bytes(self, token: int) -> list[int]:
        return list(ll_tokenizer(self.tokenizer, self.vocab_size, self.stop_ids).decode_bytes([token]))


_LEGACY_KEYS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")


class LogprobsFormat:
    """The `logprobs` object of a choice (or of a stream chunk) in `kind`'s shape (module docstring)."""

    def __init__(self, kind: Literal["completion", "chat"], strings: TokenStrings) -> None:
        self.kind, self.strings = kind, strings

    def span(self, scored: list[TokenLogprob]) -> int:
        """Characters of text the tokens' `text_offset`s advance by."""
        return sum(len(self.strings.text(s.token)) for s in scored)

    def __call__(self, scored: list[TokenLogprob], offset: int = 0) -> dict[str, Any]:
        """`scored`'s logprobs; `offset`: characters of the choice's text before their first token."""
        text = self.strings.text
        if self.kind == "chat":
            return {"content": [{**self._entry(s.token, s.logprob),
                                 "top_logprobs": [self._entry(t, lp) for t, lp in s.top]} for s in scored]}
        offsets = []
        for s in scored:
            offsets.append(offset)
            offset += len(text(s.token))
        return {"tokens": [text(s.token) for s in scored], "token_logprobs": [s.logprob for s in scored],
                "top_logprobs": [{**{text(t): lp for t, lp in s.top}, text(s.token): s.logprob} for s in scored],
                "text_offset": offsets}

    def echoed(self, prompt: list[int], scored: list[TokenLogprob], generated: dict[str, Any] | None) -> dict[str, Any]:
        """A completion's `logprobs` with its echoed prompt first (`echo`): the prompt's tokens, the first
        without a log-probability (`null`, as OpenAI's), then `generated`'s (from `__call__` with the prompt's
        characters as offset; None: no new tokens)."""
        head = self(scored, len(self.strings.text(prompt[0]))) if scored else {key: [] for key in _LEGACY_KEYS}
        first = {"tokens": [self.strings.text(prompt[0])], "token_logprobs": [None], "top_logprobs": [None],
                 "text_offset": [0]}
        rest = generated or {key: [] for key in _LEGACY_KEYS}
        return {key: first[key] + head[key] + rest[key] for key in _LEGACY_KEYS}

    def _entry(self, token: int, logprob: float) -> dict[str, Any]:
        return {"token": self.strings.text(token), "logprob": logprob, "bytes": self.strings.bytes(token)}


class HeldLogprobs:
    """A stream's logprobs that wait for their chunk: a chunk carries those of the tokens that came since
    the job's last chunk (a token whose text is held back sends its logprobs with the next text)."""

    def __init__(self, fmt: LogprobsFormat | None) -> None:
        self.fmt = fmt
        self.held: dict[int, list[TokenLogprob]] = {}
        self.offsets: dict[int, int] = {}
        """Job → characters of its tokens' text sent so far."""

    def add(self, job: int, scored: list[TokenLogprob] | None) -> None:
        self.held.setdefault(job, []).extend(scored or ())

    def take(self, job: int) -> dict[str, Any] | None:
        """The `logprobs` of `job`'s next chunk (None: no tokens came, or none were asked for)."""
        scored = self.held.pop(job, [])
        if self.fmt is None or not scored:
            return None
        offset = self.offsets.get(job, 0)
        self.offsets[job] = offset + self.fmt.span(scored)
        return self.fmt(scored, offset)
