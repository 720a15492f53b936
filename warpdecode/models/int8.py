"""Int8 weight-only copies of a backbone, for drafting: the target quantised drafts for itself.

Weights are quantised per output channel (symmetric absmax, `w ≈ q * scale`, `q` int8) and
multiplied with bf16 activations by `torch.ops.aten._weight_int8pack_mm`; the weights take a
quarter of their fp32 bytes, which is what a memory-bound decode step pays for. The copy is lossy
and inference-only: it drafts, and the fp32 target verifies, so the output stays exact.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from warpdecode.errors import CapabilityError
from warpdecode.models.packed_linear import Linear
from warpdecode.models.transformer import MLP, Attention, Transformer

ACTIVATION_DTYPE = torch.bfloat16
"""Activations enter the int8 product in bf16 (the kernel's fast path); results return in fp32."""
K_MULTIPLE = 16
"""`_weight_int8pack_mm` reads the reduction dimension in blocks of 16 (other sizes return garbage
or crash), so weights are zero-padded to a multiple of it and activations padded per call."""


@dataclass(frozen=True)
class Int8Weight:
    """Per-output-channel int8 weight `(out, in)` with its `(out,)` scales."""

    qweight: Tensor  # (out, in padded to a multiple of 16) int8
    scales: Tensor  # (out,) bf16
    bias: Tensor | None  # (out,) bf16 or None, added to the bf16 product
    in_features: int

    @classmethod
    def of(cls, weight: Tensor, bias: Tensor | None = None) -> Int8Weight:
        """Quantise an `(out, in)` float weight."""
        w = weight.detach().float()
        scales = (w.abs().amax(dim=1) / 127).clamp_min(1e-12)  # (out,)
        q = (w / scales[:, None]).round().clamp(-127, 127).to(torch.int8)
        q = F.pad(q, (0, -q.shape[1] % K_MULTIPLE))  # (out, in rounded up to a multiple of 16)
        b = None if bias is None else bias.detach().to(ACTIVATION_DTYPE)
        return cls(q.contiguous(), scales.to(ACTIVATION_DTYPE), b, weight.shape[1])

    def dequantized(self) -> Tensor:
        """(out, in) float32, the reference the int8 kernel is tested against."""
        return self.qweight[:, : self.in_features].float() * self.scales.float()[:, None]

    def __call__(self, x: Tensor) -> Tensor:
        """(..., in) → (..., out) in x's dtype (the product itself runs with bf16 activations)."""
        flat = x.reshape(-1, x.shape[-1]).to(ACTIVATION_DTYPE)
        if self.qweight.shape[1] != self.in_features:
            flat = F.pad(flat, (0, self.qweight.shape[1] - self.in_features))
        y = torch.ops.aten._weight_int8pack_mm(flat, self.qweight, self.scales)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], y.shape[-1]).to(x.dtype)


def int8_available() -> bool:
    try:
        Int8Weight.of(torch.ones(2, 32))(torch.ones(1, 32))
    except (RuntimeError, NotImplementedError):
        return False
    return True


def int8_copy(model: Transformer) -> Transformer:
    """An inference-only copy of `model` with int8 weights in every linear layer and the LM head
    (q/k/v and gate/up stacked into one matrix each); embeddings, norms, attention and the KV cache
    stay in the model's dtype. The copy's dense linear weights are freed; `model` is unchanged."""
    if model.embed.weight.device.type != "cpu":
        raise CapabilityError("int8 weight-only drafting runs on CPU only (torch's _weight_int8pack_mm)")
    if not int8_available():
        raise CapabilityError("this torch build has no CPU int8 weight-only matmul (_weight_int8pack_mm)")
    with torch.device("meta"):
        draft = Transformer(model.config)
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
            fused.int8 = Int8Weight.of(torch.cat([layer.weight for layer in fused.layers]),
                                       None if fused.layers[0].bias is None else
                                       torch.cat([layer.bias for layer in fused.layers if layer.bias is not None]))
    for module in draft.modules():
        if isinstance(module, Linear):
            module.int8 = Int8Weight.of(module.weight, module.bias)
            module.weight = nn.Parameter(torch.empty(0, module.in_features), requires_grad=False)
    return draft.eval()
