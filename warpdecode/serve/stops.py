"""Stop sequences on streamed text: what can be sent now, and where the answer ends.

Text that could still become the start of a stop sequence is held back until the next increment
decides it: with stop `"END"`, increments `"ab E"`, `"N"`, `"D!"` send `"ab "`, nothing, and then stop
(the answer is `"ab "`, the stop sequence itself is never sent, as in OpenAI's API).
"""

from __future__ import annotations


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
