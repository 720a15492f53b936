"""The one backbone configuration.

Every architectural difference between the supported families (Llama / SmolLM2, Qwen2, GPT-2) is a
field here, set by an importer from the checkpoint's own `config.json` or GGUF metadata; the model
code never looks at a family name.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from warpdecode.errors import ConfigError

NormKind = Literal["rmsnorm", "layernorm"]
MlpKind = Literal["swiglu", "gelu_tanh"]
PositionKind = Literal["rope", "learned"]
Family = Literal["llama", "qwen2", "gpt2"]

SIZE_LIMITS: dict[str, int] = {
    "vocab_size": 1 << 24,
    "n_layer": 4096,
    "n_head": 4096,
    "n_kv_head": 4096,
    "d_model": 1 << 17,
    "d_ff": 1 << 20,
    "head_dim": 1 << 14,
    "max_seq_len": 1 << 24,
}
"""Sanity bounds on the sizes, far above any released model: a config beyond them is corrupt (a
million layers would take minutes to build before failing), whatever its checkpoint holds."""

_INT_FIELDS = ("vocab_size", "n_layer", "n_head", "d_model", "d_ff", "max_seq_len")
_OPTIONAL_INT_FIELDS = ("n_kv_head", "head_dim", "mask_token_id", "bos_token_id")
_FLOAT_FIELDS = ("norm_eps", "rope_theta")
_BOOL_FIELDS = ("qkv_bias", "out_bias", "mlp_bias", "tie_embeddings", "causal")


@dataclass
class ModelConfig:
    vocab_size: int
    """Number of token embeddings (V)."""
    n_layer: int
    """Number of transformer blocks (L)."""
    n_head: int
    """Query heads (H)."""
    d_model: int
    """Residual stream width."""
    d_ff: int
    """Hidden width of the MLP."""
    n_kv_head: int | None = None
    """Key/value heads (Hkv) for grouped-query attention; defaults to `n_head`."""
    head_dim: int | None = None
    """Per-head width (D); defaults to `d_model // n_head`."""
    max_seq_len: int = 2048
    """Largest position the model supports (cache length upper bound)."""
    norm: NormKind = "rmsnorm"
    norm_eps: float = 1e-5
    mlp: MlpKind = "swiglu"
    position: PositionKind = "rope"
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    """Hugging Face style rope scaling: `{"rope_type": "llama3"|"linear", "factor": ..., ...}`."""
    qkv_bias: bool = False
    out_bias: bool = False
    """Bias on the attention output projection."""
    mlp_bias: bool = False
    tie_embeddings: bool = True
    causal: bool = True
    """Default attention pattern when no mask is given: causal (AR) or bidirectional (diffusion LM)."""
    mask_token_id: int | None = None
    """The mask token a masked diffusion LM predicts under (None for autoregressive models)."""
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    family: Family = "llama"
    """Checkpoint layout used when importing or writing Hugging Face files; never read by the model."""

    def __post_init__(self) -> None:
        self._check_types()
        # Unknown choices are refused here: the model code's if/else would otherwise silently build
        # a different architecture (e.g. norm="batchnorm" became a LayerNorm).
        for name, choices in (("norm", NormKind), ("mlp", MlpKind), ("position", PositionKind), ("family", Family)):
            if getattr(self, name) not in get_args(choices):
                raise ConfigError(f"{name} must be one of {get_args(choices)}, got {getattr(self, name)!r}")
        for name in _INT_FIELDS:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        if self.head_dim is None:
            if self.d_model % self.n_head:
                raise ConfigError(f"d_model={self.d_model} is not divisible by n_head={self.n_head}")
            self.head_dim = self.d_model // self.n_head
        for name in ("n_kv_head", "head_dim"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        for name, limit in SIZE_LIMITS.items():
            if getattr(self, name) > limit:
                raise ConfigError(f"{name}={getattr(self, name)} is beyond any real model (at most {limit})")
        if self.n_head % self.n_kv_head:
            raise ConfigError(f"n_head={self.n_head} is not a multiple of n_kv_head={self.n_kv_head}")
        if self.position == "rope" and self.head_dim % 2:
            raise ConfigError(f"rotary embeddings need an even head_dim, got {self.head_dim}")
        if not (self.norm_eps >= 0 and math.isfinite(self.norm_eps)):
            raise ConfigError(f"norm_eps must be a finite number >= 0, got {self.norm_eps}")
        if not (self.rope_theta > 0 and math.isfinite(self.rope_theta)):
            raise ConfigError(f"rope_theta must be a finite positive number, got {self.rope_theta}")
        if self.mask_token_id is not None and not 0 <= self.mask_token_id < self.vocab_size:
            raise ConfigError(f"mask_token_id={self.mask_token_id} is not a token id (vocab_size={self.vocab_size})")
        for name, value in (("bos_token_id", self.bos_token_id), ("eos_token_ids", min(self.eos_token_ids, default=0))):
            if value is not None and value < 0:
                raise ConfigError(f"{name} must not be negative, got {value}")
        _check_rope_scaling(self.rope_scaling)

    def _check_types(self) -> None:
        """Refuse wrongly typed values (a string size, a float layer count) with the field's name,
        before any comparison or arithmetic fails on them with a bare TypeError."""
        for name in _INT_FIELDS + _OPTIONAL_INT_FIELDS:
            value = getattr(self, name)
            if value is None and name in _OPTIONAL_INT_FIELDS:
                continue
            if not isinstance(value, numbers.Integral) or isinstance(value, bool):
                raise ConfigError(f"{name} must be an integer, got {value!r}")
            setattr(self, name, int(value))
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, numbers.Real) or isinstance(value, bool):
                raise ConfigError(f"{name} must be a number, got {value!r}")
            setattr(self, name, float(value))
        for name in _BOOL_FIELDS:
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        ids = self.eos_token_ids
        if not isinstance(ids, list) or any(not isinstance(i, numbers.Integral) or isinstance(i, bool) for i in ids):
            raise ConfigError(f"eos_token_ids must be a list of integers, got {ids!r}")
        self.eos_token_ids = [int(i) for i in ids]
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, dict):
            raise ConfigError(f"rope_scaling must be a mapping or null, got {self.rope_scaling!r}")
        for name in ("norm", "mlp", "position", "family"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"{name} must be a string, got {getattr(self, name)!r}")

    def parameter_count(self) -> int:
        """The number of parameters `Transformer(self)` holds (norm gains and biases included)."""
        C, V, F, D = self.d_model, self.vocab_size, self.d_ff, self.head_width
        q, kv = self.n_head * D, self.kv_head_count * D
        attention = C * (q + 2 * kv) + q * C + (q + 2 * kv if self.qkv_bias else 0) + (C if self.out_bias else 0)
        mlp = (3 if self.mlp == "swiglu" else 2) * C * F + ((2 * F if self.mlp == "swiglu" else F) + C if self.mlp_bias else 0)
        norm = 2 * C if self.norm == "layernorm" else C
        block = attention + mlp + 2 * norm
        embeddings = V * C * (1 if self.tie_embeddings else 2)
        positions = self.max_seq_len * C if self.position == "learned" else 0
        return self.n_layer * block + embeddings + positions + norm

    def check_fits_in_memory(self, bytes_per_parameter: int = 4) -> None:
        """Refuse a configuration whose parameters alone exceed this machine's physical memory: for
        sizes no checkpoint vouches for (random weights, a package's config), where allocating would
        otherwise run until the OS refuses."""
        memory = physical_memory_bytes()
        need = self.parameter_count() * bytes_per_parameter
        if memory is not None and need > memory:
            raise ConfigError(
                f"this model config needs {need / 2**30:.1f} GiB for its {self.parameter_count():,} parameters, more "
                f"than this machine's {memory / 2**30:.1f} GiB of memory (vocab_size={self.vocab_size}, "
                f"n_layer={self.n_layer}, d_model={self.d_model}, d_ff={self.d_ff})"
            )

    @property
    def kv_head_count(self) -> int:
        assert self.n_kv_head is not None
        return self.n_kv_head

    @property
    def head_width(self) -> int:
        assert self.head_dim is not None
        return self.head_dim

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        if not isinstance(data, dict):
            raise ConfigError(f"a model config must be a mapping of fields, got {type(data).__name__}")
        fields = dataclasses.fields(cls)
        unknown = set(data) - {f.name for f in fields}
        if unknown:
            raise ConfigError(f"unknown model config fields: {sorted(map(str, unknown))}")
        required = [f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        missing = [name for name in required if name not in data]
        if missing:
            raise ConfigError(f"model config lacks fields {missing}")
        return cls(**data)


def _check_rope_scaling(scaling: dict[str, Any] | None) -> None:
    """The numbers `rope_inv_freq` reads for the scaling types it implements (others it refuses)."""
    if scaling is None:
        return
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    needed = {"linear": ("factor",), "llama3": ("factor", "original_max_position_embeddings")}.get(str(kind), ())
    for key in needed:
        if key not in scaling:
            raise ConfigError(f"rope_scaling of type {kind!r} lacks {key!r}")
    for key in ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"):
        value = scaling.get(key)
        if key in scaling and (not isinstance(value, numbers.Real) or isinstance(value, bool)
                               or not 0 < float(value) < math.inf):
            raise ConfigError(f"rope_scaling {key} must be a finite positive number, got {value!r}")
    if kind == "llama3" and scaling.get("low_freq_factor", 1.0) >= scaling.get("high_freq_factor", 4.0):
        raise ConfigError("rope_scaling low_freq_factor must be below high_freq_factor")


def physical_memory_bytes() -> int | None:
    """This machine's physical memory, or None where the OS does not say."""
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages * page_size if pages > 0 and page_size > 0 else None
