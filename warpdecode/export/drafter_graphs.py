"""Writing the ONNX graphs of the trained drafter networks (Medusa and Hydra heads, the EAGLE layer, the
distilled draft model, Clover); `runtime.onnx_drafters` runs them.

An inference package stores them beside each drafter package (`drafters/<kind>/`):

    heads.onnx         Medusa: features (M, C) → logits (M, K, N), every head at once
    head_<k>.onnx      Hydra head k = 1..K: features (M, C), embeds (M, k, C) → logits (M, N)
    eagle_layer.onnx   EAGLE: features (B, T, C), embeds (B, T, C), position_ids (B, T),
                       attention_mask (B, 1, T, S + T), past_key_0 / past_value_0 (B, Hkv, S, D)
                       → hidden (B, T, C) predicted features, new_keys / new_values (1, B, Hkv, T, D)
                       (the backbone's step graph form, `export.step_graph`, on the pair inputs)
    eagle_head.onnx    EAGLE: features (M, C) → logits (M, N)
    distilled_step.onnx  distilled draft model: embeds (B, T, C) (the target's token embeddings),
                       position_ids (B, T), attention_mask (B, 1, T, S + T), logit_index (K,),
                       past_key_i / past_value_i (B, Hkv, S, D) per block
                       → logits (B, K, N), new_keys / new_values (L, B, Hkv, T, D)
    clover_augment.onnx  Clover's augmenting block: features (B, T, C), position_ids (B, T),
                       attention_mask (B, 1, T, S + T), past_key_0 / past_value_0 (B, Hkv, S, D)
                       → states (B, T, C), new_keys / new_values (1, B, Hkv, T, D), and the
                       decoder's context_keys / context_values (B, Hkv, T, D) of the new states
    clover_step.onnx   Clover's decoder step: states (M, C), embeds (M, C), position_ids (M,),
                       keys / values (Hkv, S, D) (the context) → next_states (M, C), logits (M, N)

(N: the draft vocabulary; the graphs hold the frozen head rows, so they need nothing from the
target but its features and its token embeddings.) Each network names its files (`graph_files`);
its writer here is registered for its class (`writes_graphs`), and `export_drafter_graphs` runs it.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from warpdecode.errors import ConfigError
from warpdecode.export.onnx_graph import (
    OPSET,
    cache_shapes,
    export_optimized,
    quiet_exporter,
)
from warpdecode.export.step_graph import StepGraph
from warpdecode.models.clover import CloverNet
from warpdecode.models.distilled_draft import DistilledDraftNet
from warpdecode.models.draft_head import DraftVocabNet
from warpdecode.models.eagle import EagleNet, mix_pair
from warpdecode.models.medusa import HydraHeads, MedusaHeads

GraphWriter = Callable[[Any, Path], None]
"""`(net, directory)`: write the graphs `net.graph_files()` names into `directory`."""
_WRITERS: dict[type[DraftVocabNet], GraphWriter] = {}
WriterT = TypeVar("WriterT", bound=GraphWriter)


def writes_graphs(net_class: type[DraftVocabNet]) -> Callable[[WriterT], WriterT]:
    """Register the decorated function as the graph writer of the networks of exactly `net_class`."""

    def wrap(writer: WriterT) -> WriterT:
        _WRITERS[net_class] = writer
        return writer

    return wrap


def export_drafter_graphs(net: DraftVocabNet, directory: Path) -> list[str]:
    """Write the graphs of `net` (fp32, as `DrafterPackage.load_net` gives it) into `directory` with the
    writer registered for its class; the file names written (`net.graph_files()`)."""
    writer = _WRITERS.get(type(net))
    if writer is None:
        raise ConfigError(f"no ONNX graph writer is registered for {type(net).__name__} (`writes_graphs`)")
    writer(net, directory)
    return net.graph_files()


class _HydraStep(nn.Module):
    def __init__(self, net: HydraHeads, k: int) -> None:
        super().__init__()
        self.net, self.k = net, k

    def forward(self, features: Tensor, embeds: Tensor) -> Tensor:
        return self.net.step(self.k, features, embeds)


class _EagleHead(nn.Module):
    def __init__(self, net: EagleNet) -> None:
        super().__init__()
        self.net = net

    def forward(self, features: Tensor) -> Tensor:
        return self.net.head(features)


class EagleStepGraph(StepGraph):
    """The EAGLE layer's step: fc over the (feature, token embedding) pairs (EAGLE-3's shape: the pairs
    themselves), then the one block and norm exactly as the backbone's step graph runs its blocks."""

    def __init__(self, net: EagleNet) -> None:
        super().__init__(net.layer, ())
        self.fc = net.fc

    def input_names(self) -> list[str]:
        return ["features", "embeds", "position_ids", "attention_mask", "past_key_0", "past_value_0"]

    def output_names(self) -> list[str]:
        return ["hidden", "new_keys", "new_values"]

    def forward(self, features: Tensor, embeds: Tensor, position_ids: Tensor, attention_mask: Tensor,  # type: ignore[override]
                *past: Tensor) -> tuple[Tensor, ...]:
        x = mix_pair(self.fc, features, embeds)
        hidden, new_keys, new_values, _ = self.run_blocks(x, position_ids, attention_mask, past)
        return hidden, new_keys, new_values


@writes_graphs(EagleNet)
def export_eagle_graphs(net: EagleNet, directory: Path) -> None:
    """Write the EAGLE layer's step graph and its head's graph into `directory`."""
    from torch.export import Dim

    net.unpack()  # the export traces the dense weights
    config, C = net.config, net.config.d_model
    B, T, S = 2, 3, 5  # distinct sizes > 1: the exporter keeps every dimension dynamic
    inputs = (torch.zeros(B, T, C), torch.zeros(B, T, C), (S + torch.arange(T)).expand(B, T).contiguous(),
              torch.ones(B, 1, T, S + T, dtype=torch.bool),
              *(torch.zeros(B, config.kv_head_count, S, config.head_width) for _ in range(2)))
    batch, new = Dim("batch"), Dim("new_tokens")
    shapes = {"features": {0: batch, 1: new}, "embeds": {0: batch, 1: new}, "position_ids": {0: batch, 1: new},
              "attention_mask": {0: batch, 2: new, 3: Dim.AUTO}, "past": cache_shapes(1, batch)}
    layer, head = net.graph_files()
    export_optimized(EagleStepGraph(net).eval(), inputs, shapes, directory / layer, external_data=False)
    _export(_EagleHead(net), (torch.zeros(2, C),), ["features"], directory / head)


class DistilledStepGraph(StepGraph):
    """The distilled draft model's step: its blocks and norm over the target's token embeddings exactly
    as the backbone's step graph runs its blocks, then the reduced head at `logit_index`."""

    def __init__(self, net: DistilledDraftNet) -> None:
        super().__init__(net.model, ())

    def input_names(self) -> list[str]:
        return ["embeds", *super().input_names()[1:]]

    def forward(self, embeds: Tensor, position_ids: Tensor, attention_mask: Tensor,  # type: ignore[override]
                logit_index: Tensor, *past: Tensor) -> tuple[Tensor, ...]:
        x, new_keys, new_values, _ = self.run_blocks(embeds, position_ids, attention_mask, past)
        return self.model.head(x.index_select(1, logit_index)), new_keys, new_values


@writes_graphs(DistilledDraftNet)
def export_distilled_graph(net: DistilledDraftNet, directory: Path) -> None:
    """Write the distilled draft model's step graph into `directory`."""
    from torch.export import Dim

    net.unpack()  # the export traces the dense weights
    config = net.config
    B, T, S, K = 2, 3, 5, 2  # distinct sizes > 1: the exporter keeps every dimension dynamic
    inputs = (torch.zeros(B, T, config.d_model), (S + torch.arange(T)).expand(B, T).contiguous(),
              torch.ones(B, 1, T, S + T, dtype=torch.bool), torch.arange(T - K, T),
              *(torch.zeros(B, config.kv_head_count, S, config.head_width) for _ in range(2 * config.n_layer)))
    batch, new = Dim("batch"), Dim("new_tokens")
    shapes = {"embeds": {0: batch, 1: new}, "position_ids": {0: batch, 1: new},
              "attention_mask": {0: batch, 2: new, 3: Dim.AUTO}, "logit_index": {0: Dim("logits")},
              "past": cache_shapes(config.n_layer, batch)}
    (step,) = net.graph_files()
    export_optimized(DistilledStepGraph(net).eval(), inputs, shapes, directory / step, external_data=False)


class CloverAugmentGraph(StepGraph):
    """Clover's augmenting block over the target's features exactly as the backbone's step graph runs
    its blocks, then the attention decoder's keys and values of the augmented states."""

    def __init__(self, net: CloverNet) -> None:
        super().__init__(net.augment, ())
        self.net = net

    def input_names(self) -> list[str]:
        return ["features", *super().input_names()[1:3], *super().input_names()[4:]]

    def output_names(self) -> list[str]:
        return ["states", "new_keys", "new_values", "context_keys", "context_values"]

    def forward(self, features: Tensor, position_ids: Tensor, attention_mask: Tensor,  # type: ignore[override]
                *past: Tensor) -> tuple[Tensor, ...]:
        states, new_keys, new_values, _ = self.run_blocks(features, position_ids, attention_mask, past)
        keys, values = self.net.context_kv(states, position_ids)
        return states, new_keys, new_values, keys, values


class _CloverStep(nn.Module):
    def __init__(self, net: CloverNet) -> None:
        super().__init__()
        self.net = net

    def forward(self, states: Tensor, embeds: Tensor, position_ids: Tensor, keys: Tensor,
                values: Tensor) -> tuple[Tensor, Tensor]:
        x = self.net.step(states[None], embeds[None], position_ids[None], keys[None], values[None])[0]
        return x, self.net.logits(x)


@writes_graphs(CloverNet)
def export_clover_graphs(net: CloverNet, directory: Path) -> None:
    """Write Clover's augmenting-block step graph and decoder-step graph into `directory`."""
    from torch.export import Dim

    net.unpack()  # the export traces the dense weights
    config, C = net.config, net.fc.out_features
    Hkv, D = config.kv_head_count, config.head_width
    B, T, S, M = 2, 3, 5, 4  # distinct sizes > 1: the exporter keeps every dimension dynamic
    inputs = (torch.zeros(B, T, C), (S + torch.arange(T)).expand(B, T).contiguous(),
              torch.ones(B, 1, T, S + T, dtype=torch.bool), *(torch.zeros(B, Hkv, S, D) for _ in range(2)))
    batch, new = Dim("batch"), Dim("new_tokens")
    shapes = {"features": {0: batch, 1: new}, "position_ids": {0: batch, 1: new},
              "attention_mask": {0: batch, 2: new, 3: Dim.AUTO}, "past": cache_shapes(1, batch)}
    augment, step = net.graph_files()
    export_optimized(CloverAugmentGraph(net).eval(), inputs, shapes, directory / augment, external_data=False)
    rows, context = Dim("rows"), Dim("context")
    step_inputs = (torch.zeros(M, C), torch.zeros(M, C), torch.full((M,), S), torch.zeros(Hkv, S, D),
                   torch.zeros(Hkv, S, D))
    names = ["states", "embeds", "position_ids", "keys", "values"]
    step_shapes = {"states": {0: rows}, "embeds": {0: rows}, "position_ids": {0: rows}, "keys": {1: context},
                   "values": {1: context}}
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), quiet_exporter():
        warnings.simplefilter("ignore")
        torch.onnx.export(_CloverStep(net).eval(), step_inputs, str(directory / step), dynamo=True,
                          dynamic_shapes=step_shapes, input_names=names, output_names=["next_states", "logits"],
                          opset_version=OPSET, external_data=False, verbose=False)


def _export(module: nn.Module, args: tuple[Tensor, ...], names: list[str], path: Path) -> None:
    from torch.export import Dim

    rows = Dim("rows")
    shapes = {name: {0: rows} for name in names}
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), quiet_exporter():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), args, str(path), dynamo=True, dynamic_shapes=shapes, input_names=names,
                          output_names=["logits"], opset_version=OPSET, external_data=False, verbose=False)


@writes_graphs(MedusaHeads)
def export_medusa_graph(net: MedusaHeads, directory: Path) -> None:
    """Write the Medusa heads' one graph (every head at once) into `directory`."""
    (heads,) = net.graph_files()
    _export(net, (torch.zeros(2, net.head.in_features),), ["features"], directory / heads)


@writes_graphs(HydraHeads)
def export_hydra_graphs(net: HydraHeads, directory: Path) -> None:
    """Write one graph per Hydra head (head k reads the feature and k token embeddings) into `directory`."""
    C = net.head.in_features
    for k, name in enumerate(net.graph_files(), start=1):
        _export(_HydraStep(net, k), (torch.zeros(2, C), torch.zeros(2, k, C)), ["features", "embeds"], directory / name)


