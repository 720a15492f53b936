"""LoRA adapters on a `Transformer`'s linear layers, and the merged model they make.

An adapter adds `(x A^T) B^T * alpha / r` to its layer's output (A: (r, in), B: (out, r), B zero at
the start, so an attached model computes exactly what it did). Adapters hook the layers' forward
(`register_forward_hook`): the model's parameters and state-dict keys stay as they are, and the
adapters live wherever the caller registers the returned `ModuleDict` (a LightningModule: then they
are trained and checkpointed with it). Hooks run on the layers' own calls, i.e. unpacked; attaching
drops any packed inference copy. `merged` folds the adapters into a fresh copy of the model, the
form it is decoded and exported in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from warpdecode.errors import ConfigError
from warpdecode.models.transformer import Transformer

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


class LoRA(nn.Module):
    def __init__(self, in_features: int, out_features: int, rank: int, alpha: float) -> None:
        super().__init__()
        self.A = nn.Parameter(torch.empty(rank, in_features))  # (r, in)
        self.B = nn.Parameter(torch.zeros(out_features, rank))  # (out, r): zero, so training starts at the model
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))
        self.scale = alpha / rank

    def forward(self, x: Tensor) -> Tensor:
        """(..., in) → (..., out) update of the layer's output."""
        return F.linear(F.linear(x, self.A), self.B) * self.scale

    def delta(self) -> Tensor:
        """(out, in) weight update the adapter is equivalent to."""
        return (self.B @ self.A) * self.scale


def adapter_key(layer_name: str) -> str:
    """`blocks.0.attn.q_proj` → `blocks/0/attn/q_proj` (ModuleDict keys cannot contain dots)."""
    return layer_name.replace(".", "/")


def attach_lora(model: Transformer, rank: int, alpha: float, targets: Sequence[str] = ATTENTION) -> nn.ModuleDict:
    """Hook a fresh adapter onto every linear layer of `model` whose name ends in one of `targets`
    (on the model's device and dtype); returns them keyed by `adapter_key`."""
    if rank < 1 or alpha <= 0:
        raise ConfigError(f"LoRA needs rank >= 1 and alpha > 0, got {rank}, {alpha}")
    unknown = set(targets) - set(ATTENTION + MLP)
    if unknown or not targets:
        raise ConfigError(f"LoRA targets must be among {', '.join(ATTENTION + MLP)}, got {list(targets)}")
    model.unpack()
    adapters = nn.ModuleDict()
    for name, layer in model.named_modules():
        if isinstance(layer, nn.Linear) and name.rsplit(".", 1)[-1] in targets:
            adapter = LoRA(layer.in_features, layer.out_features, rank, alpha).to(layer.weight.device, layer.weight.dtype)
            layer.register_forward_hook(lambda _layer, args, out, adapter=adapter: out + adapter(args[0]))
            adapters[adapter_key(name)] = adapter
    return adapters


def merged(model: Transformer, adapters: nn.ModuleDict) -> Transformer:
    """A new `Transformer` with `model`'s weights plus every adapter's update (no hooks, eval mode)."""
    copy = Transformer(model.config).to(model.embed.weight.device, model.embed.weight.dtype)
    copy.load_state_dict(model.state_dict())
    layers = dict(copy.named_modules())
    with torch.no_grad():
        for key, adapter in adapters.items():
            assert isinstance(adapter, LoRA)
            layer = layers[key.replace("/", ".")]
            assert isinstance(layer, nn.Linear)
            layer.weight += adapter.delta().to(layer.weight.dtype)
    return copy.eval()
