"""Peer implementations measured next to warpdecode on the same weights and threads.

Peers are optional: each one imports its library lazily and raises `CapabilityError` when it is
missing, so a benchmark can skip it with a reason instead of failing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from warpdecode.errors import CapabilityError


@dataclass
class PeerResult:
    token_ids: list[int]
    seconds: float


class TransformersGenerate:
    """Hugging Face `generate()` (greedy, KV cache) on the same checkpoint directory, fp32."""

    name = "transformers.generate"

    def __init__(self, model_dir: Path) -> None:
        try:
            import transformers
        except ImportError as e:
            raise CapabilityError("the transformers peer needs the [hf] extra") from e
        transformers.logging.set_verbosity_error()
        self.model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()

    @torch.inference_mode()
    def generate(self, ids: list[int], max_new_tokens: int, device: str = "cpu") -> PeerResult:
        start = time.perf_counter()
        out = self.model.generate(
            torch.tensor([ids], device=device), max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0,
            attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=device),
        )
        seconds = time.perf_counter() - start
        return PeerResult(token_ids=out[0, len(ids):].tolist(), seconds=seconds)
