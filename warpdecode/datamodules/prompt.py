"""The prompt record of the self-distillation sources."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class DistillPrompt:
    id: str
    """Where the prompt comes from, e.g. `gsm8k_train/17` or `stdlib/json/decoder.py:33:py_scanstring`."""
    messages: tuple[tuple[str, str], ...]
    """(role, content) turns ending with a user turn; a plain prompt is one user turn."""

    @property
    def key(self) -> str:
        """The prompt text that decides its train/val split."""
        return json.dumps(self.messages)
