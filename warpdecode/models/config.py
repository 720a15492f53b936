"""The one backbone configuration.

Every architectural difference between the supported families (Llama / SmolLM2, Qwen2, GPT-2) is a
field here, set by an importer from the checkpoint's own `config.json` or GGUF metadata; the model
code never looks at a family name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from warpdecode.errors import ConfigError

NormKind = Literal["rmsnorm", "layernorm"]
MlpKind = Literal["swiglu", "gelu_tanh"]
PositionKind = Literal["rope", "learned"]
Family = Literal["llama", "qwen2", "gpt2"]


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
        # Unknown choices are refused here: the model code's if/else would otherwise silently build
        # a different architecture (e.g. norm="batchnorm" became a LayerNorm).
        for name, choices in (("norm", NormKind), ("mlp", MlpKind), ("position", PositionKind), ("family", Family)):
            if getattr(self, name) not in get_args(choices):
                raise ConfigError(f"{name} must be one of {get_args(choices)}, got {getattr(self, name)!r}")
        for name in ("vocab_size", "n_layer", "n_head", "d_model", "d_ff", "max_seq_len"):
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
        if self.n_head % self.n_kv_head:
            raise ConfigError(f"n_head={self.n_head} is not a multiple of n_kv_head={self.n_kv_head}")
        if self.position == "rope" and self.head_dim % 2:
            raise ConfigError(f"rotary embeddings need an even head_dim, got {self.head_dim}")

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
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown model config fields: {sorted(unknown)}")
        return cls(**data)
