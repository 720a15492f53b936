"""Inference packages: one directory that holds everything a deployment runs, and says what it is.

    package/
      manifest.json            format and warpdecode versions, target identity, graph I/O, defaults,
                               and the sha256 and size of every other file
      backbone.onnx            the step graph (`export.step_graph`), opset 18
      backbone.onnx.data       its weights (read by ONNX Runtime, and by name by the torch backend)
      backbone.fused.onnx      the same model with ONNX Runtime's fused decoder operators
                               (`export.fused_graph`; Llama-family models), reading the same weights:
                               what the onnxruntime backend runs on the CPU
      *.embeds.onnx            each of the two taking input embeddings instead of token ids
                               (`export.embeds_graph`), same weights: for PPD's prompt rows
      tokenizer.json, tokenizer_config.json
      drafters/<kind>/         trained drafter packages (drafter.json + drafter.safetensors, with
                               their data-built draft tree), checked against the target at export;
                               the networks of the drafters that declare `onnx_graphs` also as ONNX
                               graphs (`export.drafter_graphs`, the files their `graph_files` name);
                               also the small learned controls (a SpecDec++ acceptance head, FiRST
                               layer routers), which the drafters reading them pick up
                               (`decoding.registry.package_options`)

`InferencePackage.load` checks the manifest against its schema and format version, then every listed
file's place (inside the package once symbolic links are resolved), size and sha256, before anything
else is parsed; then that every file the runtime opens (the graphs the manifest names, the external
data each graph names, the tokenizer's files, the drafter directories and all they hold) is one of
those verified files, which `InferencePackage.file` alone hands out. A tampered, truncated,
incomplete or malformed package is refused with a one-line `PackageIntegrityError` that names the
file or the manifest field. Nothing in a package is executed; weights are read as plain tensors.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from warpdecode.errors import CapabilityError, ConfigError, PackageIntegrityError, one_line
from warpdecode.io import sha256_file
from warpdecode.models.backbone import Backbone
from warpdecode.models.config import ModelConfig
from warpdecode.models.drafter_package import META_FILE, WEIGHTS_FILE
from warpdecode.models.tokenizer import Tokenizer
from warpdecode.models.transformer import Transformer, rope_inv_freq
from warpdecode.runtime.manifest import (
    MANIFEST,
    safe_name,
    short_name,
    validate_manifest,
)
from warpdecode.runtime.onnx_weights import WEIGHT_PREFIX, external_data_locations, read_weights
from warpdecode.runtime.onnxruntime import OnnxRuntimeBackbone

QUANTIZATIONS = ("int8", "int4")
"""int8: dynamic quantisation (int8 weights per output channel, activations quantised per tensor on
the fly: the fastest, but a row's logits depend on the other rows of its forward, so a verify
forward is not exactly the one-token step). int4: weight-only (`MatMulNBits`, asymmetric, blocks of
32; activations stay fp32, so a row's logits do not depend on the others; the LM head stays fp32)."""


GRAPH = "backbone.onnx"


LOSSY_BACKENDS = tuple(f"onnxruntime-{kind}" for kind in QUANTIZATIONS)
"""Backends that run a quantised copy (`onnx_graph.QUANTIZATIONS`): their greedy output may differ
from the exported model's."""


PORTABLE_BACKEND = "onnxruntime-portable"
"""ONNX Runtime on the portable step graph even where the package has the fused one (what other
runtimes and execution providers run; lossless like the fused graph)."""


BACKENDS = ("torch", "onnxruntime", PORTABLE_BACKEND, *LOSSY_BACKENDS)


def tensorrt_hint(backend: str) -> str:
    """What to write instead of `--backend tensorrt` (TensorRT is an ONNX Runtime provider here)."""
    return (" (TensorRT: use --backend onnxruntime --device tensorrt where ONNX Runtime has its TensorRT provider)"
            if backend == "tensorrt" else "")


def onnxruntime_load_errors() -> tuple[type[Exception], ...]:
    """What ONNX Runtime raises for a graph it cannot load (an unknown operator or input)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    return state.Fail, state.InvalidGraph, state.NotImplemented, state.InvalidArgument


@dataclass
class InferencePackage:
    directory: Path
    manifest: dict[str, Any]
    _torch: Transformer | None = field(default=None, repr=False, compare=False)
    """The PyTorch model, built once: the torch backend and ONNX Runtime's `torch_model()` share it."""
    verified: frozenset[str] = field(default=frozenset(), repr=False, compare=False)
    """The `files` entries `load` checked (inside the package, size and sha256): all `file` hands out."""

    @classmethod
    def load(cls, directory: str | Path) -> InferencePackage:
        """Open and verify a package: the manifest's schema and format version (`validate_manifest`),
        then that every listed file lies inside the package (symlinks resolved) and has its size and
        sha256, that every file the runtime opens (graphs, the external data each graph names,
        tokenizer, drafter directories) is one of them, and that the target configuration is valid."""
        directory = Path(directory)
        path = directory / MANIFEST
        if not path.is_file():
            raise PackageIntegrityError(f"{directory} is not an inference package: {MANIFEST} is missing "
                                        f"(make one with `warpdecode export`)")
        if not path.resolve().is_relative_to(directory.resolve()):
            raise PackageIntegrityError(f"{path} resolves to {path.resolve()}, outside the package")
        try:
            manifest = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise PackageIntegrityError(f"{path} is not valid JSON: {e}") from e
        package = cls(directory, validate_manifest(manifest, path))
        root = directory.resolve()
        for name, entry in manifest["files"].items():
            file = directory / name
            if not file.resolve().is_relative_to(root):
                raise PackageIntegrityError(f"{directory}: {name} resolves to {file.resolve()}, outside the package "
                                            f"(a symbolic link out of it)")
            if not file.is_file():
                raise PackageIntegrityError(f"{directory}: {name} is missing")
            size = file.stat().st_size
            if size != entry["bytes"]:
                raise PackageIntegrityError(f"{directory}: {name} has {size} bytes, the manifest says {entry['bytes']} "
                                            f"(truncated or replaced)")
            if sha256_file(file) != entry["sha256"]:
                raise PackageIntegrityError(f"{directory}: {name} does not match its sha256 in the manifest "
                                            f"(modified after export)")
        package.verified = frozenset(manifest["files"])
        package._check_references()
        return package

    def file(self, name: str, label: str = "files") -> Path:
        """The path of `name`, a file `load` verified: the one way the runtime reaches a package file.

        `PackageIntegrityError` unless `name` is a verified `files` entry still lying inside the package
        (symlinks resolved); `label`: the manifest field that names it, for the message."""
        if name not in self.verified:
            raise PackageIntegrityError(f"{self.directory}: manifest field {label} names {short_name(name)}, which is not a "
                                        f"verified file of the package (every file the runtime opens must be listed "
                                        f"in files)")
        path = self.directory / name
        if not path.resolve().is_relative_to(self.directory.resolve()):
            raise PackageIntegrityError(f"{self.directory}: {name} resolves outside the package")
        return path

    def drafter_directory(self, kind: str) -> Path:
        """The directory of the packaged drafter `kind` (`drafters/<kind>`), checked: inside the package,
        holding its drafter.json and drafter.safetensors, and nothing that is not a verified file (its
        drafter reads every graph it finds there)."""
        relative, label = self.manifest["drafters"][kind], f"drafters[{kind!r}]"
        path = self.directory / relative
        if not safe_name(relative) or not path.resolve().is_relative_to(self.directory.resolve()):
            raise PackageIntegrityError(f"{self.directory}: manifest field {label} names {short_name(relative)}, "
                                        f"outside the package")
        for name in (META_FILE, WEIGHTS_FILE):
            self.file(f"{relative}/{name}", label)
        for parent, dirs, names in os.walk(path):
            for name in [*dirs, *names]:
                entry = Path(parent) / name
                if entry.is_dir() and not entry.is_symlink():
                    continue
                listed = entry.relative_to(self.directory).as_posix()
                if listed not in self.verified:
                    raise PackageIntegrityError(f"{self.directory}: {listed} lies in the drafter directory of manifest "
                                                f"field {label} but is not a verified file (not listed in files)")
        return path

    def _check_references(self) -> None:
        """Every file the runtime may open is a verified entry (`file`): the graphs the manifest names,
        the external data every listed graph names, the tokenizer's files and the drafter directories;
        and the target configuration is one `ModelConfig` accepts."""
        backbone = self.manifest["backbone"]
        self.file(backbone["graph"], "backbone.graph")
        if backbone.get("fused_graph") is not None:
            self.file(backbone["fused_graph"], "backbone.fused_graph")
        for graph, embeds in backbone.get("embeds_graphs", {}).items():
            self.file(embeds, f"backbone.embeds_graphs[{graph!r}]")
        for kind, variant in backbone.get("variants", {}).items():
            self.file(variant["graph"], f"backbone.variants[{kind!r}].graph")
        verified = {(self.directory / name).resolve() for name in self.verified}
        for name in sorted(n for n in self.verified if n.endswith(".onnx")):
            graph = self.directory / name
            for location in sorted(external_data_locations(graph)):
                # ONNX Runtime joins the location to the graph's directory: as named, and once resolved
                places = {(graph.parent / location).resolve(), (graph.resolve().parent / location).resolve()}
                if not location or not places <= verified:
                    raise PackageIntegrityError(f"{self.directory}: {name} reads external data from {short_name(location)}, "
                                                f"which is not a verified file of the package (not listed in files)")
        if "tokenizer.json" in self.verified:
            config = self.directory / "tokenizer_config.json"
            if (config.exists() or config.is_symlink()) and "tokenizer_config.json" not in self.verified:
                raise PackageIntegrityError(f"{self.directory}: tokenizer_config.json is read with tokenizer.json "
                                            f"but is not a verified file (not listed in files)")
        for kind in self.manifest.get("drafters", {}):
            self.drafter_directory(kind)
        try:
            ModelConfig.from_dict(self.manifest["target"]["config"])
        except (ConfigError, TypeError, ValueError) as e:
            raise PackageIntegrityError(f"{self.directory / MANIFEST}: manifest field target.config is not a model "
                                        f"configuration: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e

    @property
    def config(self) -> ModelConfig:
        return ModelConfig.from_dict(self.manifest["target"]["config"])

    @property
    def fingerprint(self) -> str:
        return str(self.manifest["target"]["fingerprint"])

    @property
    def weight_aliases(self) -> dict[str, str]:
        return dict(self.manifest["backbone"].get("weight_aliases", {}))

    @property
    def generation(self) -> dict[str, Any]:
        return dict(self.manifest.get("generation", {}))

    @property
    def graph(self) -> Path:
        """The verified step graph (`backbone.graph`), whose external data holds every weight."""
        return self.file(self.manifest["backbone"]["graph"], "backbone.graph")

    def tokenizer(self) -> Tokenizer | None:
        if "tokenizer.json" not in self.manifest["files"]:
            return None
        return Tokenizer.load(self.file("tokenizer.json").parent)

    def drafter_directories(self) -> dict[str, Path]:
        """Package kind → the directory of the package's trained drafter (or control) of that kind
        (`{"eagle": Path(".../drafters/eagle")}`), each checked first (`drafter_directory`); the options
        that run them are `decoding.registry.package_options` of these."""
        return {kind: self.drafter_directory(kind) for kind in self.manifest.get("drafters", {})}

    def backbone(self, backend: str = "onnxruntime", *, device: str = "cpu", threads: int | None = None) -> Backbone:
        """The exported model on `backend`: onnxruntime runs the graph (onnxruntime-int8 / -int4 a
        quantised copy, lossy); torch rebuilds the `Transformer` from the graph's weights (the reference).

        On the CPU, onnxruntime runs the fused graph where the package has one; onnxruntime-portable
        the step graph every ONNX runtime and execution provider can run. Every graph is opened
        through `file` (a verified entry of the package)."""
        if backend == "torch":
            if device != "cpu":
                raise CapabilityError("the torch backend of a package runs on the CPU here; move the model yourself for GPUs")
            return self._torch_model()
        if backend not in BACKENDS:
            raise CapabilityError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}{tensorrt_hint(backend)}")
        manifest = self.manifest["backbone"]
        step_graph, fused_graph = manifest["graph"], manifest.get("fused_graph")
        name, label = step_graph, "backbone.graph"
        if backend == "onnxruntime" and device == "cpu" and fused_graph:
            name, label = fused_graph, "backbone.fused_graph"  # ONNX Runtime's CPU decoder operators (`export.fused_graph`)
        if backend in LOSSY_BACKENDS:
            kind = backend.removeprefix("onnxruntime-")
            variant = manifest.get("variants", {}).get(kind)
            if variant is None:
                raise CapabilityError(f"{self.directory} has no {kind} graph; export it with --quantize {kind}")
            if variant.get("fused") and device != "cpu":
                raise CapabilityError(f"the {kind} graph of {self.directory} uses ONNX Runtime's CPU decoder operators; "
                                      f"run it with --device cpu")
            name, label = variant["graph"], f"backbone.variants[{kind!r}].graph"
        config = self.config
        names = [WEIGHT_PREFIX + "embed.weight"] + ([] if config.tie_embeddings else [WEIGHT_PREFIX + "lm_head.weight"])
        weights = read_weights(self.graph, names, self.weight_aliases)
        for weight in names:  # the logits buffers are sized from the config: it must be the weights' own
            shape, expected = list(weights[weight].shape), [config.vocab_size, config.d_model]
            if shape != expected:
                raise PackageIntegrityError(f"{self.directory}: {weight.removeprefix(WEIGHT_PREFIX)} in {self.graph.name} "
                                            f"has shape {shape}, target.config says {expected} (vocab_size, d_model)")
        embeds_graphs = manifest.get("embeds_graphs", {})

        def session(name: str, label: str) -> OnnxRuntimeBackbone:
            embeds = embeds_graphs.get(name)
            return OnnxRuntimeBackbone(self.file(name, label), config, self.fingerprint, manifest["hidden_layers"],
                                       weights[names[0]], weights.get(WEIGHT_PREFIX + "lm_head.weight"),
                                       torch_loader=self._torch_model, device=device, threads=threads,
                                       embeds_graph=None if embeds is None
                                       else self.file(embeds, f"backbone.embeds_graphs[{name!r}]"))

        if name == fused_graph:
            try:
                return session(name, label)
            except onnxruntime_load_errors() as e:  # an ONNX Runtime without these operators (older than tested)
                warnings.warn(f"ONNX Runtime could not load {name} ({str(e).splitlines()[0][:200]}); "
                              f"running the portable {step_graph} instead", RuntimeWarning, stacklevel=2)
                name, label = step_graph, "backbone.graph"
        return session(name, label)

    def _torch_model(self) -> Transformer:
        if self._torch is None:
            self._torch = self._build_torch_model()
        return self._torch

    def _build_torch_model(self) -> Transformer:
        config = self.config
        with torch.device("meta"):
            model = Transformer(config)
        keys = [k for k in model.state_dict()]
        weights = read_weights(self.graph, [WEIGHT_PREFIX + k for k in keys], self.weight_aliases)
        try:
            model.load_state_dict({k: weights[WEIGHT_PREFIX + k] for k in keys}, assign=True)
        except RuntimeError as e:  # shapes that are not target.config's
            raise PackageIntegrityError(f"{self.directory}: the weights in {self.graph.name} do not fit target.config: "
                                        f"{one_line(e, 300)}") from e
        if config.position == "rope":
            model.inv_freq = rope_inv_freq(config)
        model.eval()
        if model.fingerprint() != self.fingerprint:
            raise PackageIntegrityError(f"{self.directory}: the weights in {self.graph.name} are not the exported model's "
                                        f"(fingerprint {model.fingerprint()}, manifest {self.fingerprint})")
        return model
