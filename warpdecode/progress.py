"""Progress as log lines, for long work that no terminal watches (nohup, CI, batch jobs), where
progress bars draw nothing: one line at most every `every` seconds and one at the end, with the time
spent and an estimate of the time left.

    lines = ProgressLines("self-distill", total=2048, unit="prompts")
    for ...:
        lines.update(done, tok_s="480")   # self-distill: 512/2048 prompts (25 %), 3.1 min, ~9.3 min left, tok_s 480
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable


def no_terminal() -> bool:
    """Whether stderr, where progress bars draw, is not a terminal."""
    return not sys.stderr.isatty()


def log_line(line: str) -> None:
    """Write one line to stderr now (not buffered until the process ends)."""
    print(line, file=sys.stderr, flush=True)


class ProgressLines:
    def __init__(self, what: str, total: float, unit: str, *, every: float = 60.0, done: float = 0,
                 emit: Callable[[str], None] = log_line, clock: Callable[[], float] = time.monotonic) -> None:
        """Args:
        what: what is progressing, the start of every line.
        total: the amount of work (`inf` or 0: unknown; the lines then give no share and no estimate).
        unit: what `total` counts.
        every: seconds between lines at least.
        done: work already done before this run (the estimate counts only what this run does).
        emit: where lines go (default: stderr).
        clock: seconds, monotonic (tests pass their own).
        """
        self.what, self.total, self.unit, self.every, self.emit, self.clock = what, total, unit, every, emit, clock
        self.started, self.first, self.last = clock(), done, -math.inf

    def update(self, done: float, **extra: object) -> None:
        """Report `done` (cumulative) if `every` seconds have passed since the last line, or if the work is done."""
        now = self.clock()
        finished = math.isfinite(self.total) and self.total > 0 and done >= self.total
        if now - self.last < self.every and not finished:
            return
        self.last = now
        self.emit(self.line(done, now - self.started, extra))

    def line(self, done: float, elapsed: float, extra: dict[str, object]) -> str:
        parts = [f"{self.what}: {done:g}"]
        known = math.isfinite(self.total) and self.total > 0
        if known:
            parts[0] += f"/{self.total:g} {self.unit} ({100 * done / self.total:.0f} %)"
        else:
            parts[0] += f" {self.unit}"
        parts.append(f"{elapsed / 60:.1f} min")
        rate = (done - self.first) / elapsed if elapsed > 0 else 0.0
        if known and rate > 0 and done < self.total:
            parts.append(f"~{(self.total - done) / rate / 60:.1f} min left")
        parts += [f"{name} {value}" for name, value in extra.items()]
        return ", ".join(parts)
