"""A distilled draft model drafts for its target (`models/distilled_draft.py`, trained with
`configs/drafters/distilled.yaml`).

It is a draft model like any other (`draft_model.py`): its own KV cache over the committed tokens,
a chain of `num_tokens`, a top-k "chain of fans" (`top_k`) or a DySpec dynamic tree (`num_nodes`),
rolled back to the accepted prefix after every verification. What differs is where it comes from:
a drafter package trained for this exact target (refused on another model), whose few blocks read
the target's own token embedding and score only the draft vocabulary; its logits are spread over
the target's vocabulary with -inf elsewhere, so sampled drafts carry a full-vocabulary q and every
lossless verifier stays lossless. With `bits=4` (or 8) the network drafts from a weight-only quantised
copy, as `int4_self` does for the whole target. On an ONNX Runtime target it runs its step graph from the inference
package (`runtime.onnx_drafters.OnnxDistilled`) when the package has one.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, cast

import torch
from torch import Tensor

from warpdecode.decoding.drafters.draft_model import DraftModelDrafter
from warpdecode.decoding.drafters.learned import to_target_vocab
from warpdecode.decoding.registry import register
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.cache import KVCache
from warpdecode.models.distilled_draft import DistilledDraftNet
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.models.quantized import Bits, quantized_copy
from warpdecode.models.transformer import Transformer
from warpdecode.runtime.onnx_drafters import OnnxDistilled


@register("drafter", "distilled")
class DistilledDrafter(DraftModelDrafter):
    needs_training: ClassVar[bool] = True
    net_class = DistilledDraftNet
    onnx_graphs = True
    kind: ClassVar[str] = "distilled"

    def __init__(self, path: str, num_tokens: int = 4, top_k: int = 1, replacement: bool = True,
                 num_nodes: int | None = None, bits: int | None = None) -> None:
        """Args:
        path: a drafter package trained with `warpdecode fit --config configs/drafters/distilled.yaml`.
        num_tokens: draft depth per step (the chain length when `top_k=1`).
        top_k: siblings per level; above 1 the draft is a tree of `top_k * num_tokens` nodes.
        replacement: when sampling, draw siblings independently; false: without replacement.
        num_nodes: grow a dynamic tree of this many nodes instead (DySpec; greedy decoding only).
        bits: draft with a weight-only int4 or int8 copy of the network (`models/quantized.py`; CPU,
            PyTorch network only): a cheaper draft step, verified by the unchanged target.
        """
        if bits not in (None, 4, 8):
            raise ConfigError(f"{self.kind} bits must be 4 or 8, got {bits}")
        if not Path(path).exists():
            raise ConfigError(f"{self.kind} drafter package {path!r} not found")
        self.path, self.bits = path, bits
        self.model_source, self.layers = None, None
        self.init_drafting(num_tokens, top_k, replacement, num_nodes)
        self.net: DistilledDraftNet | None = None
        self.graphs: OnnxDistilled | None = None
        """The network's ONNX graph, used when the target is not a PyTorch model and it exists."""

    def load_net(self, target: Backbone) -> DistilledDraftNet:
        """The package's trained network for `target` (checked to be the target it was trained for)."""
        return DrafterPackage.load(self.path, self.kind).load_net(target, DistilledDraftNet, self.path)

    def prepare(self, target: Backbone) -> None:
        """Load the package once per target and pack it (or find its ONNX graph for an ONNX Runtime target)."""
        if self.net is None or self.source is not target:
            net = self.load_net(target)
            with torch.inference_mode(False):
                if self.bits is None:
                    net.pack()
                else:
                    net.model = quantized_copy(net.model, cast(Bits, self.bits))
            self.net, self.source = net, target
            onnx = not isinstance(target, Transformer) and self.bits is None
            self.graphs = OnnxDistilled.find(Path(self.path), net) if onnx else None
        if self.top_k > self.net.draft_vocab.numel():
            raise ConfigError(f"{self.name} top_k {self.top_k} exceeds the draft vocabulary of "
                              f"{self.net.draft_vocab.numel()} tokens")

    def new_draft_cache(self, max_len: int) -> KVCache:
        assert self.net is not None and self.source is not None, "prepare() must run first"
        weight = self.source.embed.weight
        return KVCache.for_model(self.net.config, 1, max_len, dtype=weight.dtype, device=weight.device)

    def run_draft(self, tokens: list[int]) -> Tensor:
        """Feed `tokens` after the draft's cached positions; (1, V) target-vocabulary logits after the last one."""
        assert self.net is not None and self.cache is not None and self.source is not None
        embed = self.source.embed
        inputs = torch.tensor([tokens], device=embed.weight.device)
        network = self.graphs or self.net
        logits = network(inputs, embed, cache=self.cache, logits_slice=slice(-1, None))[0]  # (1, N)
        return to_target_vocab(logits, self.net.draft_vocab, self.source.config.vocab_size)
