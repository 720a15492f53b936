"""The torch device a `--device` name and the precision a `--dtype` name stand for, checked before any model is loaded."""

from __future__ import annotations

import torch

from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.kernels.quantized import Bits


def torch_device(name: str) -> torch.device:
    """`cpu`, `cuda` or `cuda:N` as a `torch.device`: ConfigError for another name, CapabilityError
    when this torch build or machine has no such CUDA device."""
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ConfigError(f"--device must be cpu, cuda or cuda:N, got {name!r}") from e
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device must be cpu, cuda or cuda:N, got {name!r}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise CapabilityError(f"--device {name}: torch {torch.__version__} sees no CUDA device here")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise CapabilityError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) here")
    return device


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that a wall-clock reading includes it (no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
"""`--dtype` names → the precision of the weights, activations and KV cache. fp32 is the exactness
oracle; half precision is compared with plain greedy decoding in the same precision (docs/metrics.md)."""
QUANTIZED: dict[str, Bits] = {"q8": 8, "q4": 4}
"""`--dtype` names of weight-only quantised targets → their bits (`kernels/quantized.py`: int8 per
output channel, int4 in groups of 32; the LM head in int8). The embeddings, norms, activations and
KV cache stay float32. Like half precision, a quantised target is compared with plain greedy decoding
of the same quantised target (docs/metrics.md)."""
NATIVE = "native"
"""`--dtype` name of a GGUF checkpoint's own quantised format (`models/importers/gguf_quantized.py`):
its Q4_1 blocks go into the int4 kernel as they are; the bits are known once it is read."""


def dtype_names() -> list[str]:
    return [*DTYPES, *QUANTIZED, NATIVE]


def _check(name: str) -> None:
    if name not in dtype_names():
        raise ConfigError(f"--dtype must be one of {', '.join(dtype_names())}, got {name!r}")


def torch_dtype(name: str) -> torch.dtype:
    """The float dtype a `--dtype` name stands for: of every weight, or, for a quantised name, of the
    embeddings, activations and KV cache (float32). ConfigError for another name."""
    _check(name)
    return DTYPES.get(name, torch.float32)


def weight_bits(name: str) -> Bits | None:
    """The bits of a quantised `--dtype` name (None for a float one and for `native`; ConfigError for
    another name)."""
    _check(name)
    return QUANTIZED.get(name)
