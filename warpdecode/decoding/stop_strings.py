"""Stop strings (OpenAI's `stop`, Hugging Face's `stop_strings`): where the tokens end, what text can
be streamed now, and where the answer's text ends.

`StopStrings` is the decode loop's stop check: fed each batch of emitted tokens, it says how many of
them to keep, up to the token whose text completes the first stop string (Hugging Face keeps the same
tokens). `StopMatcher` cuts streamed text: text that could still become the start of a stop string
is held back until the next increment decides it: with stop `"END"`, increments `"ab E"`, `"N"`,
`"D!"` send `"ab "`, nothing, and then stop (the answer is `"ab "`, the stop string itself is never
sent, as in OpenAI's API). Stop strings are looked for in the generated text only, never in the prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

from warpdecode.errors import ConfigError
from warpdecode.models.tokenizer import Tokenizer


def stop_tuple(stop: str | Sequence[str] | None) -> tuple[str, ...]:
    """One stop string or several as a tuple; ConfigError for an empty one."""
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if any(not isinstance(s, str) or not s for s in stops):
        raise ConfigError(f"stop strings must be non-empty strings, got {list(stops)!r}")
    return stops


class StopStrings:
    """The stop check of one request: `check(emitted)` after each batch of emitted tokens."""

    def __init__(self, tokenizer: Tokenizer, stops: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        self.stops = stops
        self.tokens: list[int] = []

    def _found(self, tokens: list[int]) -> bool:
        text = self.tokenizer.decode(tokens)
        return any(stop in text for stop in self.stops)

    def check(self, emitted: list[int]) -> int | None:
        """Take the next emitted tokens; return how many of them to keep when the generated text now
        holds a stop string (through the token that completes the first one), None to go on."""
        start = len(self.tokens)
        self.tokens.extend(emitted)
        if not self._found(self.tokens):
            return None
        keep = next(k for k in range(1, len(emitted) + 1) if self._found(self.tokens[: start + k]))
        del self.tokens[start + keep :]
        return keep


class StopMatcher:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.text = ""
        self.sent = 0
        self.stopped = False

    def push(self, delta: str) -> str:
        """Take a text increment; return the text that is safe to send (sets `stopped` at a stop sequence)."""
        if self.stopped:
            return ""
        self.text += delta
        if not self.stops:
            return self._send(len(self.text))
        longest = max(len(s) for s in self.stops)
        window = max(0, self.sent - longest + 1)  # a match may begin in text already sent
        hits = [i for i in (self.text.find(s, window) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            return self._send(max(min(hits), self.sent))
        held = 0
        for stop in self.stops:  # the longest tail that is a proper prefix of some stop sequence
            for n in range(min(len(stop) - 1, len(self.text)), held, -1):
                if self.text.endswith(stop[:n]):
                    held = n
                    break
        return self._send(max(len(self.text) - held, self.sent))

    def flush(self) -> str:
        """The held-back text, once the answer has ended without a stop sequence."""
        return "" if self.stopped else self._send(len(self.text))

    def _send(self, end: int) -> str:
        out = self.text[self.sent : end]
        self.sent = end
        return out
