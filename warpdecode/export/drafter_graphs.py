"""ONNX graphs of the trained drafter networks (Medusa and Hydra heads, the EAGLE layer), and running
them in ONNX Runtime.

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
target but its features and its token embeddings.) On an ONNX Runtime target the drafters run
these graphs instead of their PyTorch networks (`OnnxHeads`, `OnnxEagle`, `OnnxDistilled`,
`OnnxClover`), so drafting and
verifying share one runtime; the PyTorch network stays the reference they are tested against.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from warpdecode.errors import CheckpointError
from warpdecode.export.onnx_graph import (
    OPSET,
    cache_shapes,
    export_optimized,
    external_data_locations,
    quiet_exporter,
)
from warpdecode.export.step_graph import StepGraph
from warpdecode.models.cache import KVCache
from warpdecode.models.clover import CloverNet
from warpdecode.models.distilled_draft import DistilledDraftNet
from warpdecode.models.eagle import EagleNet
from warpdecode.models.medusa import FutureHeads, HydraHeads
from warpdecode.models.transformer import new_token_mask
from warpdecode.runtime.onnxruntime import open_session, run_step_graph

MEDUSA_GRAPH = "heads.onnx"
EAGLE_GRAPHS = ("eagle_layer.onnx", "eagle_head.onnx")
DISTILLED_GRAPH = "distilled_step.onnx"
CLOVER_GRAPHS = ("clover_augment.onnx", "clover_step.onnx")


def hydra_graph(k: int) -> str:
    return f"head_{k}.onnx"


class _HydraStep(nn.Module):
    def __init__(self, net: HydraHeads, k: int) -> None:
        super().__init__()
        self.net, self.k = net, k

    def forward(self, features: Tensor, embeds: Tensor) -> Tensor:
        return self.net.step(self.k, features, embeds)


class _Head(nn.Module):
    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.head = head

    def forward(self, features: Tensor) -> Tensor:
        return self.head(features)


class EagleStepGraph(StepGraph):
    """The EAGLE layer's step: fc over the (feature, token embedding) pairs, then the one block and
    norm exactly as the backbone's step graph runs its blocks."""

    def __init__(self, net: EagleNet) -> None:
        super().__init__(net.layer, ())
        self.fc = net.fc

    def input_names(self) -> list[str]:
        return ["features", "embeds", "position_ids", "attention_mask", "past_key_0", "past_value_0"]

    def output_names(self) -> list[str]:
        return ["hidden", "new_keys", "new_values"]

    def forward(self, features: Tensor, embeds: Tensor, position_ids: Tensor, attention_mask: Tensor,  # type: ignore[override]
                *past: Tensor) -> tuple[Tensor, ...]:
        x = self.fc(torch.cat([features, embeds], dim=-1))
        hidden, new_keys, new_values, _ = self.run_blocks(x, position_ids, attention_mask, past)
        return hidden, new_keys, new_values


def export_eagle_graphs(net: EagleNet, directory: Path) -> list[str]:
    """Write the EAGLE layer's step graph and its head's graph into `directory`; the file names."""
    from torch.export import Dim

    net.unpack()  # the export traces the dense weights
    config, C = net.config, net.fc.out_features
    B, T, S = 2, 3, 5  # distinct sizes > 1: the exporter keeps every dimension dynamic
    inputs = (torch.zeros(B, T, C), torch.zeros(B, T, C), (S + torch.arange(T)).expand(B, T).contiguous(),
              torch.ones(B, 1, T, S + T, dtype=torch.bool),
              *(torch.zeros(B, config.kv_head_count, S, config.head_width) for _ in range(2)))
    batch, new = Dim("batch"), Dim("new_tokens")
    shapes = {"features": {0: batch, 1: new}, "embeds": {0: batch, 1: new}, "position_ids": {0: batch, 1: new},
              "attention_mask": {0: batch, 2: new, 3: Dim.AUTO}, "past": cache_shapes(1, batch)}
    export_optimized(EagleStepGraph(net).eval(), inputs, shapes, directory / EAGLE_GRAPHS[0], external_data=False)
    _export(_Head(net.head), (torch.zeros(2, C),), ["features"], directory / EAGLE_GRAPHS[1])
    return list(EAGLE_GRAPHS)


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


def export_distilled_graph(net: DistilledDraftNet, directory: Path) -> list[str]:
    """Write the distilled draft model's step graph into `directory`; the file names."""
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
    export_optimized(DistilledStepGraph(net).eval(), inputs, shapes, directory / DISTILLED_GRAPH, external_data=False)
    return [DISTILLED_GRAPH]


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


def export_clover_graphs(net: CloverNet, directory: Path) -> list[str]:
    """Write Clover's augmenting-block step graph and decoder-step graph into `directory`; the file names."""
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
    export_optimized(CloverAugmentGraph(net).eval(), inputs, shapes, directory / CLOVER_GRAPHS[0], external_data=False)
    rows, context = Dim("rows"), Dim("context")
    step_inputs = (torch.zeros(M, C), torch.zeros(M, C), torch.full((M,), S), torch.zeros(Hkv, S, D),
                   torch.zeros(Hkv, S, D))
    names = ["states", "embeds", "position_ids", "keys", "values"]
    step_shapes = {"states": {0: rows}, "embeds": {0: rows}, "position_ids": {0: rows}, "keys": {1: context},
                   "values": {1: context}}
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), quiet_exporter():
        warnings.simplefilter("ignore")
        torch.onnx.export(_CloverStep(net).eval(), step_inputs, str(directory / CLOVER_GRAPHS[1]), dynamo=True,
                          dynamic_shapes=step_shapes, input_names=names, output_names=["next_states", "logits"],
                          opset_version=OPSET, external_data=False, verbose=False)
    return list(CLOVER_GRAPHS)


def _export(module: nn.Module, args: tuple[Tensor, ...], names: list[str], path: Path) -> None:
    from torch.export import Dim

    rows = Dim("rows")
    shapes = {name: {0: rows} for name in names}
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), quiet_exporter():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), args, str(path), dynamo=True, dynamic_shapes=shapes, input_names=names,
                          output_names=["logits"], opset_version=OPSET, external_data=False, verbose=False)


def export_drafter_graphs(net: FutureHeads | EagleNet | DistilledDraftNet | CloverNet, directory: Path) -> list[str]:
    """Write the graphs of `net` (Medusa or Hydra heads, an EAGLE network, a distilled draft model or a
    Clover network, fp32, as `load_package_net` gives them) into `directory`; the file names written."""
    if isinstance(net, EagleNet):
        return export_eagle_graphs(net, directory)
    if isinstance(net, CloverNet):
        return export_clover_graphs(net, directory)
    if isinstance(net, DistilledDraftNet):
        return export_distilled_graph(net, directory)
    C = net.head.in_features
    if isinstance(net, HydraHeads):
        for k in range(1, net.num_heads + 1):
            _export(_HydraStep(net, k), (torch.zeros(2, C), torch.zeros(2, k, C)), ["features", "embeds"],
                    directory / hydra_graph(k))
        return [hydra_graph(k) for k in range(1, net.num_heads + 1)]
    _export(net, (torch.zeros(2, C),), ["features"], directory / MEDUSA_GRAPH)
    return [MEDUSA_GRAPH]


def cpu_session(path: Path, threads: int | None) -> object:
    """An ONNX Runtime CPU session for a drafter graph."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or torch.get_num_threads()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return open_session(path, options, ["CPUExecutionProvider"])


def find_graphs(directory: Path, names: list[str]) -> list[Path] | None:
    """The graphs `names` of the drafter package `directory`, or None if any is missing. Each must lie
    inside the directory (symlinks resolved) and name no external data outside it (`CheckpointError`
    otherwise): a drafter directory used on its own gets the containment an inference package's
    verification gives its drafters."""
    paths = [directory / name for name in names]
    if not all(path.is_file() for path in paths):
        return None
    root = directory.resolve()
    for path in paths:
        if not path.resolve().is_relative_to(root):
            raise CheckpointError(f"{path} resolves to {path.resolve()}, outside its drafter package")
        for location in external_data_locations(path):
            if not location or not (path.parent / location).resolve().is_relative_to(root):
                raise CheckpointError(f"{path} names external data {location!r} outside its drafter package")
    return paths


def run_graph(session: object, **inputs: Tensor) -> Tensor:
    """The first output of `session` on fp32 inputs, as a torch tensor."""
    feeds = {name: np.ascontiguousarray(t.detach().float().cpu().numpy()) for name, t in inputs.items()}
    return torch.from_numpy(session.run(None, feeds)[0])  # type: ignore[attr-defined]


class OnnxEagle:
    """The EAGLE graphs in ONNX Runtime, called like the network: `eagle(features, tokens, embed,
    positions, cache, attention_mask)` → (predicted features, empty logits) and `eagle.head(features)`."""

    def __init__(self, layer: object, head: object) -> None:
        self.layer, self.head_session = layer, head
        self.names = [i.name for i in layer.get_inputs()]  # type: ignore[attr-defined]

    @classmethod
    def find(cls, directory: Path, threads: int | None = None) -> OnnxEagle | None:
        """The graphs in `directory`, or None if either is missing."""
        paths = find_graphs(directory, list(EAGLE_GRAPHS))
        return None if paths is None else cls(*(cpu_session(path, threads) for path in paths))

    def __call__(self, features: Tensor, tokens: Tensor, embed: nn.Embedding, positions: Tensor, cache: KVCache,
                 attention_mask: Tensor | None = None, logits_slice: slice | None = None) -> tuple[Tensor, Tensor]:
        """As `EagleNet.forward` with a cache; logits are left to `head` (drafting asks for none here)."""
        B, T, C = features.shape
        hidden = torch.empty(B, T, C, dtype=cache.k.dtype)
        leading = [features.to(cache.k.dtype).contiguous(), embed(tokens).to(cache.k.dtype).contiguous()]
        run_step_graph(self.layer, self.names, leading, positions.to(torch.int64), cache,
                       new_token_mask(attention_mask, B, T), True, [], {"hidden": hidden})
        if logits_slice is not None and not range(T)[logits_slice]:
            return hidden, torch.empty(B, 0, 0)
        return hidden, self.head(hidden[:, logits_slice or slice(None)])

    def head(self, features: Tensor) -> Tensor:
        """(..., C) → (..., N) draft-vocabulary logits."""
        flat = features.reshape(-1, features.shape[-1])
        return run_graph(self.head_session, features=flat).reshape(*features.shape[:-1], -1)


class OnnxDistilled:
    """The distilled draft model's step graph in ONNX Runtime, called like the network:
    `draft(tokens, embed, cache, logits_slice)` → (B, T', N) draft-vocabulary logits."""

    def __init__(self, session: object, draft_vocab_size: int) -> None:
        self.session, self.draft_vocab_size = session, draft_vocab_size
        self.names = [i.name for i in session.get_inputs()]  # type: ignore[attr-defined]

    @classmethod
    def find(cls, directory: Path, net: DistilledDraftNet, threads: int | None = None) -> OnnxDistilled | None:
        """The graph of `net` in `directory`, or None if it is missing."""
        paths = find_graphs(directory, [DISTILLED_GRAPH])
        return None if paths is None else cls(cpu_session(paths[0], threads), net.config.vocab_size)

    def __call__(self, tokens: Tensor, embed: nn.Embedding, cache: KVCache | None = None,
                 logits_slice: slice | None = None) -> Tensor:
        assert cache is not None, "the graph runs against a KV cache"
        B, T = tokens.shape
        index = torch.arange(T)[logits_slice or slice(None)]
        positions = cache.lengths.to(torch.int64)[:, None] + torch.arange(T)[None]
        logits = torch.empty(B, index.numel(), self.draft_vocab_size, dtype=cache.k.dtype)
        run_step_graph(self.session, self.names, [embed(tokens).to(cache.k.dtype).contiguous()], positions, cache,
                       None, True, [index], {"logits": logits})
        return logits


class OnnxClover:
    """Clover's graphs in ONNX Runtime: `augmented(features, positions, cache)` → (states, context keys,
    context values) as `CloverNet.augmented` + `context_kv`, and `step(states, embeds, positions, keys,
    values)` → (next states, logits) as `CloverNet.step` + `logits` for one row."""

    def __init__(self, augment: object, step: object, draft_vocab_size: int) -> None:
        self.augment_session, self.step_session, self.draft_vocab_size = augment, step, draft_vocab_size
        self.names = [i.name for i in augment.get_inputs()]  # type: ignore[attr-defined]

    @classmethod
    def find(cls, directory: Path, net: CloverNet, threads: int | None = None) -> OnnxClover | None:
        """The graphs of `net` in `directory`, or None if either is missing."""
        paths = find_graphs(directory, list(CLOVER_GRAPHS))
        if paths is None:
            return None
        return cls(cpu_session(paths[0], threads), cpu_session(paths[1], threads), net.draft_vocab.numel())

    def augmented(self, features: Tensor, positions: Tensor, cache: KVCache) -> tuple[Tensor, Tensor, Tensor]:
        """(B, T, C) features at `positions` (B, T), appended to the block's `cache` → states (B, T, C)
        and the decoder's keys / values (B, Hkv, T, D)."""
        B, T, C = features.shape
        dtype = cache.k.dtype
        states = torch.empty(B, T, C, dtype=dtype)
        keys = torch.empty(B, cache.k.shape[2], T, cache.k.shape[4], dtype=dtype)
        values = torch.empty_like(keys)
        run_step_graph(self.augment_session, self.names, [features.to(dtype).contiguous()], positions, cache, None,
                       True, [], {"states": states, "context_keys": keys, "context_values": values})
        return states, keys, values

    def step(self, states: Tensor, embeds: Tensor, positions: Tensor, keys: Tensor,
             values: Tensor) -> tuple[Tensor, Tensor]:
        """(M, C) states, (M, C) embeddings, (M,) positions, (Hkv, S, D) context → (M, C), (M, N)."""
        feeds = {"states": states, "embeds": embeds, "keys": keys, "values": values}
        arrays = {name: np.ascontiguousarray(t.detach().float().cpu().numpy()) for name, t in feeds.items()}
        arrays["position_ids"] = np.ascontiguousarray(positions.cpu().numpy().astype(np.int64))
        next_states, logits = self.step_session.run(None, arrays)  # type: ignore[attr-defined]
        return torch.from_numpy(next_states), torch.from_numpy(logits)


class OnnxHeads:
    """The heads' graphs in ONNX Runtime, called like the PyTorch heads: `heads(features)` (Medusa),
    `heads.step(k, features, embeds)` (Hydra)."""

    def __init__(self, sessions: dict[int, object]) -> None:
        self.sessions = sessions  # 0: the Medusa graph; k: Hydra head k

    @classmethod
    def find(cls, directory: Path, net: FutureHeads, threads: int | None = None) -> OnnxHeads | None:
        """The graphs in `directory` for `net`'s kind and head count, or None if any is missing."""
        names = ({k: hydra_graph(k) for k in range(1, net.num_heads + 1)} if isinstance(net, HydraHeads)
                 else {0: MEDUSA_GRAPH})
        paths = find_graphs(directory, list(names.values()))
        if paths is None:
            return None
        return cls({k: cpu_session(path, threads) for k, path in zip(names, paths, strict=True)})

    def _run(self, key: int, **inputs: Tensor) -> Tensor:
        return run_graph(self.sessions[key], **inputs)

    def __call__(self, features: Tensor) -> Tensor:
        """(M, C) → (M, K, N), as `MedusaHeads.forward`."""
        return self._run(0, features=features)

    def step(self, k: int, features: Tensor, embeds: Tensor) -> Tensor:
        """(M, C), (M, k, C) → (M, N), as `HydraHeads.step`."""
        return self._run(k, features=features, embeds=embeds)
