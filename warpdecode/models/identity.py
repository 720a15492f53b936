"""Which model is this? A fingerprint of architecture and weights that trained drafters and caches record.

A drafter is trained for one target: its heads read that target's hidden states and its LM head.
Loading it next to another model runs without error and silently drafts garbage, so the drafter
stores the fingerprint of the target it was trained on, and loading compares it.

The fingerprint hashes the architecture fields and a strided sample of every weight tensor (at most
`SAMPLE` values each), so it costs milliseconds on a 135M model and still changes with any
finetuning step, a different quantisation or another checkpoint.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from warpdecode.models.transformer import Transformer

SAMPLE = 4096
"""Values hashed per weight tensor (evenly strided over the flattened tensor)."""


def model_fingerprint(model: Transformer) -> str:
    """A 16-hex-digit fingerprint of `model`'s architecture and weights as they are (hashed as float32,
    so the fp32 and bf16 values of one checkpoint differ, but two loads of one checkpoint agree;
    `Transformer.fingerprint` answers a half-precision copy made by `to_precision` with its checkpoint's)."""
    digest = hashlib.sha256()
    fields = dataclasses.asdict(model.config)
    fields.pop("eos_token_ids", None)  # filled in from the tokenizer by some loaders; not architecture
    if fields.get("mask_token_id") is None:  # added for diffusion LMs: autoregressive fingerprints stay as they were
        fields.pop("mask_token_id", None)
    digest.update(json.dumps(fields, sort_keys=True, default=str).encode())
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().reshape(-1)
        step = max(1, flat.numel() // SAMPLE)
        digest.update(name.encode())
        digest.update(flat[::step][:SAMPLE].to(device="cpu", dtype=torch.float32).numpy().tobytes())
    return digest.hexdigest()[:16]
