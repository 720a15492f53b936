"""Weight-only quantised copies of a backbone: the target decoding from quantised weights (`--dtype
q8|q4`), and the target's own quantised copy drafting for it (`int4_self` / `int8_self`).

The weights and their matmuls are `kernels/quantized.py` (int8 per channel, int4 in groups of 32).
A decode step is memory-bound, so fewer weight bytes is a faster step. The copies are lossy and
inference-only: as a draft they propose and the target verifies, so the output stays the target's;
as the target (`quantized_target`) they are the model that lossless methods reproduce.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses

import torch
from torch import Tensor, nn

from warpdecode.errors import CapabilityError
from warpdecode.kernels.packed_linear import Linear, QuantizedMatmul
from warpdecode.kernels.quantized import QUANTIZERS, Bits, Int8Weight, quantized_available
from warpdecode.models.transformer import MLP, Attention, Transformer

__all__ = ["Bits", "quantized_available", "quantized_copy", "quantized_target"]


def _dense(held: QuantizedMatmul | None, weights: list[Tensor], biases: list[Tensor]) -> tuple[Tensor, Tensor | None]:
    """The float `(out, in)` weight and `(out,)` bias to quantise: the dense ones, or those of `held`,
    an int8 weight of an already quantised model (an int4 one is never re-quantised: see `quantized_copy`)."""
    if held is None:
        return torch.cat(weights), torch.cat(biases) if biases else None
    assert isinstance(held, Int8Weight), "only int8 weights are re-quantised"
    return held.dequantized(), held.bias_float


def quantized_copy(model: Transformer, bits: Bits = 8) -> Transformer:
    """An inference-only copy of `model` with `bits`-bit weights in every linear layer of its blocks
    (q/k/v and gate/up stacked into one matrix each) and int8 weights in the LM head (the head
    decides the token outright; it stays at 8 bits, which is also how Q4 checkpoints ship it).
    Embeddings, norms, attention and the KV cache stay in the model's dtype. The copy's dense linear
    weights are freed; `model` is unchanged. A model without a token embedding (a drafter's backbone
    that is fed `inputs_embeds`) is copied without one.

    An already quantised `model` (a `--dtype q8|q4` target, or a layer view of one) is its own
    `bits`-bit copy when it holds `bits`-bit weights; an int8 one is re-quantised to int4 from its
    int8 weights; an int4 one has no int8 copy (CapabilityError: it would read more bytes than it)."""
    if bits not in QUANTIZERS:
        raise CapabilityError(f"weight-only quantised copies support bits=4 or bits=8, got {bits}")
    held_bits = model.weight_bits
    if held_bits == bits:
        return model
    if held_bits is not None and held_bits < bits:
        raise CapabilityError(f"an int{bits} copy of an int{held_bits} model would read more weight bytes than "
                              "the model itself")
    if next(model.parameters()).device.type != "cpu":
        raise CapabilityError(f"int{bits} weight-only weights run on CPU only (the native block matmul or torch's CPU kernels)")
    for needed in {bits, 8}:
        if not quantized_available(needed):
            raise CapabilityError(f"this torch build has no CPU int{needed} weight-only matmul")
    block_quantizer = QUANTIZERS[bits]
    with torch.device("meta"):
        draft = Transformer(model.config)
    if not hasattr(model, "embed"):  # a drafter's backbone fed `inputs_embeds` (the distilled draft model)
        del draft.embed
    # shares the tensors until replaced below; a quantised model's emptied weights stay meta until then
    state = {k: v for k, v in model.state_dict().items() if v.numel() or not k.endswith(".weight")}
    draft.load_state_dict(state, assign=True, strict=held_bits is None)
    if model.config.position == "rope":
        draft.inv_freq = model.inv_freq
    if draft.lm_head is None:
        draft.lm_head = Linear(model.config.d_model, model.config.vocab_size, bias=False, device="meta")
        draft.lm_head.weight = nn.Parameter(model.embed.weight.detach(), requires_grad=False)
        draft.config = dataclasses.replace(model.config, tie_embeddings=False)
    sources = dict(model.named_modules())
    in_fused: set[int] = set()
    for name, module in draft.named_modules():
        if isinstance(module, (Attention, MLP)):
            fused = module.qkv if isinstance(module, Attention) else module.gate_up
            source = sources[name]
            held = (source.qkv if isinstance(source, Attention) else source.gate_up).quantized  # type: ignore[union-attr]
            biases: list[Tensor] = [layer.bias for layer in fused.layers if layer.bias is not None]
            fused.quantized = block_quantizer.of(*_dense(held, [layer.weight for layer in fused.layers], biases))
            if len(fused.layers) == 1:  # a non-gated MLP calls its up_proj directly: the same weight
                fused.layers[0].quantized = fused.quantized
            in_fused.update(id(layer) for layer in fused.layers)
    for name, module in draft.named_modules():
        if isinstance(module, Linear):
            # a layer of a fused group runs inside its group's stacked weight: it holds no copy of its own
            if id(module) not in in_fused:
                held = getattr(sources.get(name), "quantized", None)
                if module is draft.lm_head and isinstance(held, Int8Weight):
                    module.quantized = held  # the int8 head is shared as it is
                else:
                    quantizer = Int8Weight if module is draft.lm_head else block_quantizer
                    module.quantized = quantizer.of(*_dense(held, [module.weight], [] if module.bias is None else [module.bias]))
            module.weight = nn.Parameter(torch.empty(0, module.in_features), requires_grad=False)
    draft.weight_bits = bits
    return draft.eval()


def quantized_target(model: Transformer, bits: Bits) -> Transformer:
    """`model` as a `bits`-bit target (`--dtype q8|q4`): its `quantized_copy`, answering `fingerprint()` with
    the float32 checkpoint's (drafters trained for the checkpoint run on it, compared with plain decoding
    of the quantised target). The caller drops `model`, which frees its dense linear weights: one copy of
    each weight stays."""
    fingerprint = model.fingerprint()
    target = exact_rows(quantized_copy(model, bits))
    target.checkpoint_fingerprint = fingerprint
    # The float tensors it keeps (embeddings, norms, biases) are copied off `model`'s storage: a checkpoint
    # loaded from safetensors maps the whole file, and each kept tensor would keep that mapping resident.
    for module in target.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if param.numel() and not param.is_meta:
                setattr(module, name, nn.Parameter(param.detach().clone(), requires_grad=False))
    return target


def release_freed_memory() -> None:
    """Hand the heap pages that loading freed back to the system (glibc's `malloc_trim`; a no-op
    elsewhere). Quantising a checkpoint frees its float32 weights and temporaries, which glibc keeps
    mapped for reuse otherwise (40 MB of the default model's resident size, measured)."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        trim = None
    if trim is not None:
        trim(0)


def exact_rows(target: Transformer) -> Transformer:
    """`target` with row-by-row attention in its decode and verify steps (`Attention.row_by_row`): a
    quantised target then computes a verified row exactly as a one-token step, so lossless methods
    reproduce its plain greedy decoding token for token."""
    for module in target.modules():
        if isinstance(module, Attention):
            module.row_by_row = True
    return target
