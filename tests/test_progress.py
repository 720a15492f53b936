"""Progress lines for logs no terminal watches."""

from __future__ import annotations

import math

from warpdecode.progress import ProgressLines


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_lines_are_throttled_and_estimate_the_time_left():
    clock, lines = Clock(), []
    progress = ProgressLines("fit", 100, "steps", every=60, emit=lines.append, clock=clock)
    clock.now = 30
    progress.update(10, loss="2.5")  # the first line comes at once
    clock.now = 60
    progress.update(20)  # 30 s after the first: held back
    clock.now = 120
    progress.update(40)
    assert lines == ["fit: 10/100 steps (10 %), 0.5 min, ~4.5 min left, loss 2.5",
                     "fit: 40/100 steps (40 %), 2.0 min, ~3.0 min left"]
    clock.now = 121
    progress.update(100)  # the end always reports, without an estimate
    assert lines[-1] == "fit: 100/100 steps (100 %), 2.0 min"


def test_work_done_before_does_not_count_toward_the_rate():
    clock, lines = Clock(), []
    progress = ProgressLines("self-distill", 100, "prompts", done=50, emit=lines.append, clock=clock)
    clock.now = 60
    progress.update(60)  # 10 prompts a minute from here: 4 minutes left
    assert lines == ["self-distill: 60/100 prompts (60 %), 1.0 min, ~4.0 min left"]


def test_an_unknown_total_gives_counts_only():
    clock, lines = Clock(), []
    progress = ProgressLines("fit", math.inf, "steps", emit=lines.append, clock=clock)
    clock.now = 90
    progress.update(7)
    assert lines == ["fit: 7 steps, 1.5 min"]
