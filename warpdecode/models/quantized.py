"""Weight-only quantised copies of a backbone, for drafting: the target quantised drafts for itself.

The weights and their matmuls are `kernels/quantized.py` (int8 per channel, int4 in groups of 32).
A decode step is memory-bound, so fewer weight bytes is a faster draft. The copies are lossy and
inference-only: they draft, and the fp32 target verifies, so the output stays exact.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from warpdecode.errors import CapabilityError
from warpdecode.kernels.packed_linear import Linear
from warpdecode.kernels.quantized import QUANTIZERS, Bits, Int8Weight, quantized_available
from warpdecode.models.transformer import MLP, Attention, Transformer

__all__ = ["Bits", "quantized_available", "quantized_copy"]


def quantized_copy(model: Transformer, bits: Bits = 8) -> Transformer:
    """An inference-only copy of `model` with `bits`-bit weights in every linear layer of its blocks
    (q/k/v and gate/up stacked into one matrix each) and int8 weights in the LM head (the head
    decides the draft token outright; it stays at 8 bits, which is also how Q4 checkpoints ship it).
    Embeddings, norms, attention and the KV cache stay in the model's dtype. The copy's dense linear
    weights are freed; `model` is unchanged. A model without a token embedding (a drafter's backbone
    that is fed `inputs_embeds`) is copied without one."""
    if bits not in QUANTIZERS:
        raise CapabilityError(f"weight-only quantised copies support bits=4 or bits=8, got {bits}")
    if next(model.parameters()).device.type != "cpu":
        raise CapabilityError(f"int{bits} weight-only drafting runs on CPU only (torch's CPU weight-only kernels)")
    for needed in {bits, 8}:
        if not quantized_available(needed):
            raise CapabilityError(f"this torch build has no CPU int{needed} weight-only matmul")
    block_quantizer = QUANTIZERS[bits]
    with torch.device("meta"):
        draft = Transformer(model.config)
    if not hasattr(model, "embed"):  # a drafter's backbone fed `inputs_embeds` (the distilled draft model)
        del draft.embed
    draft.load_state_dict(model.state_dict(), assign=True)  # shares the tensors until replaced below
    if model.config.position == "rope":
        draft.inv_freq = model.inv_freq
    if draft.lm_head is None:
        draft.lm_head = Linear(model.config.d_model, model.config.vocab_size, bias=False, device="meta")
        draft.lm_head.weight = nn.Parameter(model.embed.weight.detach(), requires_grad=False)
        draft.config = dataclasses.replace(model.config, tie_embeddings=False)
    for module in draft.modules():
        if isinstance(module, (Attention, MLP)):
            fused = module.qkv if isinstance(module, Attention) else module.gate_up
            biases: list[Tensor] = [layer.bias for layer in fused.layers if layer.bias is not None]
            fused.quantized = block_quantizer.of(torch.cat([layer.weight for layer in fused.layers]),
                                                 torch.cat(biases) if biases else None)
    for module in draft.modules():
        if isinstance(module, Linear):
            quantizer = Int8Weight if module is draft.lm_head else block_quantizer
            module.quantized = quantizer.of(module.weight, module.bias)
            module.weight = nn.Parameter(torch.empty(0, module.in_features), requires_grad=False)
    return draft.eval()
