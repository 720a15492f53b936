"""The backbone protocol: the seam between training, export and the decoding runtime.

Every backend (the PyTorch `Transformer`, the ONNX Runtime step graph of an inference package)
takes `(tokens, positions, cache, attention_mask)` and returns logits plus the requested hidden
states, reading and appending to the same `KVCache`; decoding code never knows which one it runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

from torch import Tensor, nn

from warpdecode.models.cache import KVCache
from warpdecode.models.config import ModelConfig

if TYPE_CHECKING:
    from warpdecode.models.transformer import Transformer


@dataclass
class BackboneOutput:
    logits: Tensor  # (B, T, V) float
    hidden_states: dict[int, Tensor] = field(default_factory=dict)
    """Layer index → (B, T, C). Index i < L is the residual stream after i blocks (0 = embeddings);
    index L is the final normed output that feeds the LM head (the Hugging Face convention)."""


class Backbone(Protocol):
    config: ModelConfig
    embed: nn.Embedding
    """The input token embedding (V, C); drafters read it, and its weight names the device and dtype."""
    supports_continuous_batching: ClassVar[bool]
    """Rows may decode together in one forward through row views of one cache (`KVCache.rows`), each
    computing the numbers it computes alone (`kernels/invariance.py`): what `decoding/continuous.py`
    and the server's batching need."""

    def __call__(
        self,
        tokens: Tensor,
        positions: Tensor | None = None,
        cache: KVCache | None = None,
        attention_mask: Tensor | None = None,
        hidden_layers: Sequence[int] = (),
        logits_slice: slice | None = None,
        inputs_embeds: Tensor | None = None,
    ) -> BackboneOutput:
        """Run `T` new tokens per row; see `Transformer.forward` for the argument shapes.
        `inputs_embeds` (rows that are not vocabulary tokens) only where `accepts_inputs_embeds()`:
        a backend that cannot take them raises `CapabilityError`."""
        ...

    def accepts_inputs_embeds(self) -> bool:
        """Whether forwards may pass `inputs_embeds`: always on PyTorch; on ONNX Runtime where the
        package has the embeds variant of the graph (`export.embeds_graph`)."""
        ...

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        """An empty cache of `batch` rows and at least `max_len` positions in this backbone's dtype
        and device, for a generation's forwards (the cudagraphs backend hands the same buffers out
        again, so that its captured steps replay)."""
        ...

    def head(self, x: Tensor) -> Tensor:
        """LM head: (..., C) final normed hidden states → (..., V) logits."""
        ...

    def output_embeddings(self) -> Tensor:
        """(V, C) LM-head weight (the input embedding when tied)."""
        ...

    def pack_for_cpu_inference(self) -> int:
        """Prepare for batch-1 CPU inference (idempotent); the number of weights prepared."""
        ...

    def fingerprint(self) -> str:
        """Identity of architecture and weights (`models.identity`): trained drafters check it."""
        ...

    def torch_model(self) -> Transformer:
        """These weights as a PyTorch `Transformer` (itself for the PyTorch backend): drafters made
        from the target's own weights (its first layers, a quantised copy, a layer-skip view) build on it."""
        ...
