"""One loader for every front door: (a model | an inference package) x backends → one `Backbone` per backend.

The model is loaded once and shared by its backends (torch, and `cudagraphs` replaying its steps on a GPU);
a package opens each backend it is asked for (torch rebuilds the model from the graph's weights; the
onnxruntime ones run its graphs). `generate` asks for one backend, `bench` for the torch baseline and the
others beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.checkpoint import load_gguf_quantized, load_pretrained
from warpdecode.models.device import NATIVE, torch_device, torch_dtype, weight_bits
from warpdecode.models.named import DEFAULT_MODEL
from warpdecode.models.quantized import quantized_target, release_freed_memory
from warpdecode.models.random_shapes import is_random, random_model
from warpdecode.models.tokenizer import Tokenizer
from warpdecode.runtime.cudagraphs import CUDA_GRAPHS, MODEL_BACKENDS, CudaGraphBackbone
from warpdecode.runtime.package import BACKENDS, InferencePackage, tensorrt_hint

TORCH = "torch"


def parse_backends(text: str) -> list[str]:
    """`--backends` (comma-separated) as a list without repeats; ConfigError naming the known ones."""
    backends = [b.strip() for b in text.split(",") if b.strip()]
    known = dict.fromkeys([*BACKENDS, *MODEL_BACKENDS])
    unknown = [b for b in backends if b not in known]
    if not backends or unknown:
        raise ConfigError(f"--backends must list some of {', '.join(known)}, got {text!r}")
    return list(dict.fromkeys(backends))


def precision_for(dtype: str, package: bool) -> torch.dtype:
    """The torch dtype of `--dtype`, refused for a package (which runs in the precision it was exported
    in): checked before anything is loaded."""
    precision = torch_dtype(dtype)
    if package and dtype != "fp32":
        raise CapabilityError(f"--dtype {dtype}: a package runs in the precision it was exported in; "
                              f"use --model for half precision or quantised weights")
    return precision


def parse_dtypes(text: str, package: bool) -> list[str]:
    """`--dtype` (comma-separated: bench runs each) as a list without repeats, each checked by `precision_for`."""
    dtypes = list(dict.fromkeys(d.strip() for d in text.split(",") if d.strip()))
    if not dtypes:
        raise ConfigError(f"--dtype names no precision: {text!r}")
    for dtype in dtypes:
        precision_for(dtype, package)
    return dtypes


def load_backbones(model: str | None, package: InferencePackage | None, backends: Sequence[str], *,
                   device: str = "cpu", dtype: str = "fp32", threads: int | None = None,
                   head_rows: int | None = None, max_bits: int = 8) -> tuple[dict[str, Backbone], Tokenizer | None]:
    """The backbone of `model` (default: the embedded default model) or of `package` on each of `backends`,
    and its tokenizer.

    Args:
        device: where a model runs (cpu, cuda, cuda:N); a package's onnxruntime backends take it as
            ONNX Runtime's execution provider.
        dtype: a model's precision (`models.device.DTYPES`), or q8/q4: its weight-only quantised copy
            (`models.device.QUANTIZED`; CPU, torch only), whose dense weights are freed once it is
            made, or native: a GGUF checkpoint's own quantised weights (CPU, torch only); a package
            runs in the precision it was exported in.
        threads: ONNX Runtime's intra-op threads for a package.
        head_rows: with `--dtype native`, make only the LM head's first rows (a draft model's FR-Spec
            vocabulary: the other rows are never made, so they never take memory); other precisions load
            the whole head, which the caller cuts.
        max_bits: with `--dtype native`, 4 re-quantises the GGUF's wider block types to int4 (a lossy,
            smaller copy: a draft model's).
    """
    known = dict.fromkeys([*MODEL_BACKENDS, *BACKENDS])
    unknown = [b for b in backends if b not in known]
    if unknown:
        raise ConfigError(f"unknown backend {unknown[0]!r}; choose from {', '.join(known)}{tensorrt_hint(unknown[0])}")
    precision = precision_for(dtype, package is not None)
    if package is None:
        other = [b for b in backends if b not in MODEL_BACKENDS]
        if other:
            raise ConfigError(f"--backend {other[0]} runs an exported package: add --package DIR (make one with "
                              f"`warpdecode export`); --model runs on {' or '.join(MODEL_BACKENDS)}")
        source, bits = DEFAULT_MODEL if model is None else model, weight_bits(dtype)
        if (bits is not None or dtype == NATIVE) and (CUDA_GRAPHS in backends or torch_device(device).type != "cpu"):
            raise CapabilityError(f"--dtype {dtype} runs on the CPU (its weight-only kernels are CPU kernels), not on {device} "
                                  f"or --backend {CUDA_GRAPHS}")
        if is_random(source):
            if dtype == NATIVE:
                raise ConfigError("a random-weights model has no native quantised weights; use --dtype q8 or q4")
            loaded = random_model(source, device=torch_device(device), dtype=precision)
            tokenizer = load_pretrained(DEFAULT_MODEL)[1]
        elif dtype == NATIVE:
            loaded, tokenizer = load_gguf_quantized(source, head_rows, max_bits)
        else:
            loaded, tokenizer = load_pretrained(source, device=torch_device(device), dtype=precision)
        if bits is not None:
            loaded = quantized_target(loaded, bits)  # the dense weights go with the float model
            release_freed_memory()
        return {b: CudaGraphBackbone(loaded) if b == CUDA_GRAPHS else loaded for b in backends}, tokenizer
    if model is not None:
        raise ConfigError("give --model or --package, not both")
    if CUDA_GRAPHS in backends:
        raise ConfigError(f"--backend {CUDA_GRAPHS} runs --model on --device cuda, not a package")
    return {b: package.backbone(b, device=device, threads=threads) for b in backends}, package.tokenizer()


def open_package(path: str | Path | None) -> InferencePackage | None:
    """The verified package at `path` (None for None)."""
    return None if path is None else InferencePackage.load(path)
