"""`echo` on `/v1/completions`: the prompt comes back before the completion, with its tokens'
log-probabilities when `logprobs` is set (the first token has none: `null`, as OpenAI's API answers),
and `max_tokens: 0` scores a prompt without generating (the request evaluation harnesses send for a
text's log-likelihood). Streamed, each choice's first chunk is the prompt. The prompt is scored by its
own forwards (`decoding/scoring.prompt_logprobs`), `SCORE_CHUNK` tokens at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from warpdecode.decoding.scoring import TokenLogprob, prompt_logprobs
from warpdecode.models.backbone import Backbone
from warpdecode.serve.logprobs import LogprobsFormat


@dataclass(frozen=True)
class Echo:
    """A completion's echoed prompt."""

    text: str
    ids: list[int]
    scored: list[TokenLogprob] | None
    """The log-probabilities of the prompt's tokens after the first (None: no `logprobs` asked)."""

    @classmethod
    def of(cls, target: Backbone, text: str, ids: list[int], top: int | None) -> Echo:
        """The echo of prompt `text` (tokens `ids`), scored with `top` alternatives when `top` is not None
        (a model forward: run it off the event loop)."""
        return cls(text, list(ids), None if top is None else prompt_logprobs(target, ids, top))

    def choice(self, text: str, generated: list[TokenLogprob] | None,
               fmt: LogprobsFormat | None) -> tuple[str, dict[str, Any] | None]:
        """A choice's text and `logprobs` with this prompt before its own (`generated`: its new tokens'
        log-probabilities; None: none asked, or no new tokens)."""
        if fmt is None or self.scored is None:
            return self.text + text, None
        rest = fmt(generated, len(self.text)) if generated else None
        return self.text + text, fmt.echoed(self.ids, self.scored, rest)
