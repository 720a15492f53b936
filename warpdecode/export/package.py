"""Writing an inference package (`export_package`): the step graph, its fused and embeds forms, quantised
copies, the tokenizer, the trained drafters and their graphs, and the manifest that `runtime.package`
verifies and reads (the package's layout is described there)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

import warpdecode
from warpdecode.decoding import registry
from warpdecode.errors import ConfigError
from warpdecode.export.accuracy import compare_models
from warpdecode.export.drafter_graphs import export_drafter_graphs
from warpdecode.export.embeds_graph import write_embeds_graph
from warpdecode.export.fused_graph import FUSED_GRAPH, fused_graph_supported, write_fused_graph
from warpdecode.export.onnx_graph import OPSET, export_step_graph
from warpdecode.export.onnx_graph import quantize as quantize_graph
from warpdecode.export.step_graph import check_hidden_layers
from warpdecode.io import sha256_file
from warpdecode.models.draft_head import DraftVocabNet
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.models.tokenizer import Tokenizer
from warpdecode.models.transformer import Transformer
from warpdecode.runtime.manifest import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
)
from warpdecode.runtime.onnx_weights import WEIGHT_PREFIX
from warpdecode.runtime.onnxruntime import OnnxRuntimeBackbone
from warpdecode.runtime.package import GRAPH, QUANTIZATIONS


def drafter_net(kind: str) -> tuple[type[DraftVocabNet] | None, bool]:
    """The network class a package of `kind` holds and whether the inference package carries its ONNX
    graphs too, as the drafter registered as `kind` declares them (`net_class`, `onnx_graphs`);
    (None, False) for a package of another component (a control, a judge)."""
    if kind not in registry.names("drafter"):
        return None, False
    drafter = registry.get("drafter", kind)
    return drafter.net_class, drafter.onnx_graphs


def read_layers(package: DrafterPackage, n_layer: int) -> tuple[int, ...]:
    """The target hidden states the network of `package` reads (its typed config's `hidden_layers`;
    the final one for a package without a drafter network)."""
    net_class, _ = drafter_net(package.kind)
    if net_class is None:
        return (n_layer,)
    return net_class.config_class.from_dict(package.config, f"{package.kind} drafter.json").hidden_layers(n_layer)


def _file_table(directory: Path) -> dict[str, dict[str, Any]]:
    return {p.relative_to(directory).as_posix(): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name != MANIFEST}


def export_package(
    model: Transformer,
    tokenizer: Tokenizer | None,
    out: str | Path,
    *,
    source: str,
    hidden_layers: tuple[int, ...] | None = None,
    drafters: Sequence[str | Path] = (),
    generation: dict[str, Any] | None = None,
    quantize: Sequence[str] = (),
    on_start: Callable[[], None] | None = None,
) -> Path:
    """Write an inference package for `model` to `out` (atomically: a half-written package never appears).

    Args:
        source: how the model was named (recorded in the manifest).
        hidden_layers: hidden states the graph returns (default: the final one, which every learned
            drafter reads, and those the included drafters fuse into their features, EAGLE-3 style).
        drafters: trained drafter package directories to include; each must have been trained for `model`.
        generation: generation defaults recorded for `generate --package` (e.g. max_new_tokens, method).
        quantize: also write quantised graphs (`onnx_graph.QUANTIZATIONS`: int8, int4; backends
            `onnxruntime-int8` / `-int4`, lossy) and record each one's accuracy against the
            full-precision graph (`export.accuracy`).
        on_start: called once the arguments are checked, as the export starts (a progress line).
    """
    from warpdecode.io import atomic_directory

    out = Path(out)
    fingerprint = model.fingerprint()
    included: dict[str, DrafterPackage] = {}
    for path in drafters:
        package = DrafterPackage.load(path)
        package.check_target(model)
        kind = package.kind
        if kind in included:
            raise ConfigError(f"two {kind} drafters given; a package holds one drafter of each kind")
        included[kind] = package
    unknown = set(quantize) - set(QUANTIZATIONS)
    if unknown:
        raise ConfigError(f"quantization must be among {', '.join(QUANTIZATIONS)}, got {sorted(unknown)}")
    read = {j for package in included.values() for j in read_layers(package, model.config.n_layer)}
    layers = hidden_layers if hidden_layers is not None else tuple(sorted({model.config.n_layer, *read}))
    if not read <= set(layers):
        raise ConfigError(f"the drafters read hidden states {sorted(read)}; export them "
                          f"(hidden layers {list(layers)} were asked for)")
    check_hidden_layers(model.config, layers)
    if on_start is not None:
        on_start()
    start = time.perf_counter()
    with atomic_directory(out) as tmp:
        graph, aliases = export_step_graph(model, tmp / GRAPH, layers)
        unfused = fused_graph_supported(model.config, model.embed.weight.dtype)
        if unfused is None:
            write_fused_graph(tmp / GRAPH, tmp / FUSED_GRAPH, model.config, graph.hidden_layers, aliases, WEIGHT_PREFIX)
        embeds_graphs = {name: write_embeds_graph(tmp / name, model.config.d_model).name
                         for name in (GRAPH, *([FUSED_GRAPH] if unfused is None else []))}
        if tokenizer is not None:
            tokenizer.save(tmp)
        for kind, package in included.items():
            package.save(tmp / "drafters" / kind)
            net_class, graphs = drafter_net(kind)
            if net_class is not None and graphs:
                export_drafter_graphs(package.load_net(model, net_class, kind), tmp / "drafters" / kind)
        variants = {}
        head = None if model.lm_head is None else model.lm_head.weight.detach()

        def session(graph_file: str) -> OnnxRuntimeBackbone:
            return OnnxRuntimeBackbone(tmp / graph_file, model.config, fingerprint, graph.hidden_layers,
                                       model.embed.weight.detach(), head)

        quantize_from = FUSED_GRAPH if unfused is None else GRAPH  # quantised copies of the faster graph
        full = session(quantize_from) if quantize else None
        for kind in dict.fromkeys(quantize):
            name = f"backbone.{kind}.onnx"
            quantize_graph(tmp / quantize_from, tmp / name, kind)
            assert full is not None
            variants[kind] = {"graph": name, "backend": f"onnxruntime-{kind}", "fused": unfused is None,
                              "accuracy": compare_models(full, session(name), tokenizer)}
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "warpdecode_version": warpdecode.__version__,
            "torch_version": torch.__version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "target": {"source": source, "fingerprint": fingerprint, "config": model.config.to_dict()},
            "backbone": {"graph": GRAPH, "opset": OPSET, "dtype": str(model.embed.weight.dtype).removeprefix("torch."),
                         "hidden_layers": list(graph.hidden_layers), "inputs": graph.input_names(),
                         "outputs": graph.output_names(), "weight_aliases": aliases, "variants": variants,
                         "fused_graph": FUSED_GRAPH if unfused is None else None,
                         "embeds_graphs": embeds_graphs,
                         **({"fused_graph_unsupported": unfused} if unfused is not None else {})},
            "drafters": {kind: f"drafters/{kind}" for kind in included},
            "generation": generation or {},
            "export_seconds": round(time.perf_counter() - start, 1),
            "files": _file_table(tmp),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return out


