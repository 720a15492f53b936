"""The `cudagraphs` backend: a PyTorch backbone whose decode and verify forwards replay CUDA graphs.

A decode step of a small model on a GPU is launch-bound (hundreds of kernels of a few µs each; the
default model spends ~15 ms a step on an H100 launching them). Capturing the step once and replaying
it removes that cost. The captured forward is `Transformer.forward_static`: keys and values go to
slots held in a device tensor and attention reads the whole preallocated cache under a mask, so one
graph serves every step of a generation; `new_cache` hands every generation the same buffers (one
per size class), so it serves later generations too. A forward of `T` new tokens replays the graph
of the smallest width in `WIDTHS` that holds it; the padding rows see only the cache and themselves, and
their outputs are dropped. Graphs are captured per cache buffer, width and set of hidden states,
lazily, and kept (least recently used first out) in one memory pool: sharing it is safe because
replays run one at a time and each one's outputs are copied out before the next.

Everything else runs the eager model: prefill (`logits_slice`), batches of several rows, forwards
without a cache, and widths beyond the largest graph.
Reference: `graphs=False` runs the same static path eagerly (the padded, masked forward without
capture): the CPU tests check it against the model's own forward.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch
from torch import Tensor, nn

from warpdecode.errors import CapabilityError
from warpdecode.models.backbone import BackboneOutput
from warpdecode.models.cache import KVCache
from warpdecode.models.config import ModelConfig
from warpdecode.models.transformer import Transformer, default_new_mask, new_token_mask

CUDA_GRAPHS = "cudagraphs"
"""The backend name (`--backend cudagraphs`, `--backends torch,cudagraphs`): --model on --device cuda."""
MODEL_BACKENDS = ("torch", CUDA_GRAPHS)
"""The backends a --model (not a package) runs on."""

WIDTHS = (1, 2, 4, 8, 16, 32, 64)
"""Forward widths that get a graph; a forward of T tokens pads up to the first width ≥ T."""
MAX_GRAPHS = 32
MIN_CACHE = 256


def padded_width(T: int, widths: Sequence[int] = WIDTHS) -> int | None:
    """The first width that holds `T` new tokens, or None when none does."""
    return next((w for w in widths if w >= T), None)


def padded_mask(new_mask: Tensor, width: int) -> Tensor:
    """(1, W, W) bool: `new_mask` (1, T, T) in the top-left corner; each padding row sees only itself
    (a row with no visible key would give NaN), and real rows never see padding."""
    T = new_mask.shape[-1]
    mask = torch.eye(width, dtype=torch.bool, device=new_mask.device)[None]
    mask[:, :T, :T] = new_mask
    return mask


class StepKey(NamedTuple):
    """What a captured step is specific to."""

    buffers: tuple[int, int, tuple[int, ...]]  # the cache's key and value data pointers, and its shape
    width: int
    hidden_layers: tuple[int, ...]
    embeds: bool  # takes inputs_embeds


@dataclass
class StaticStep:
    """The fixed input buffers of one width's graph; `run` (set once the inputs of a first step are
    in place) replays it and returns the outputs each replay overwrites."""

    tokens: Tensor  # (1, W) int64
    positions: Tensor  # (1, W) int64
    start: Tensor  # (1,) int64, the cache length before the step
    new_mask: Tensor  # (1, W, W) bool
    inputs_embeds: Tensor | None  # (1, W, C), for forwards that pass inputs_embeds
    run: Callable[[], BackboneOutput] | None = None


class CudaGraphBackbone:
    """The `Backbone` protocol over a `Transformer`, replaying a captured graph for each decode or
    verify forward of one row (see the module docstring). `graphs=False` runs the same padded static
    forward eagerly: the reference the tests compare with, and a CPU stand-in."""
    supports_continuous_batching: ClassVar[bool] = False  # rows decode one request at a time

    def __init__(self, model: Transformer, *, graphs: bool = True, max_graphs: int = MAX_GRAPHS) -> None:
        device = model.embed.weight.device
        if graphs and device.type != "cuda":
            raise CapabilityError(f"the cudagraphs backend needs the model on a CUDA device (--device cuda), "
                                  f"not {device}")
        self.model, self.graphs, self.max_graphs = model, graphs, max_graphs
        self.config: ModelConfig = model.config
        self.embed: nn.Embedding = model.embed
        self._steps: OrderedDict[StepKey, StaticStep] = OrderedDict()
        self._caches: dict[int, KVCache] = {}
        self._pool = torch.cuda.graph_pool_handle() if graphs else None
        self.captures = 0

    def accepts_inputs_embeds(self) -> bool:
        return True

    def head(self, x: Tensor) -> Tensor:
        return self.model.head(x)

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        """One row: the cache of the size class (a power of two, at least `MIN_CACHE`) that holds
        `max_len`, emptied: the same buffers every time, so the graphs captured on them replay across
        generations. It stays valid until the next `new_cache` of its size class."""
        if batch != 1 or max_len > self.config.max_seq_len:
            return self.model.new_cache(batch, max_len)
        size = min(self.config.max_seq_len, max(MIN_CACHE, 1 << (max_len - 1).bit_length()))
        if size not in self._caches:
            self._caches[size] = self.model.new_cache(1, size)
        cache = self._caches[size]
        cache.truncate(0)
        return cache

    def output_embeddings(self) -> Tensor:
        return self.model.output_embeddings()

    def pack_for_cpu_inference(self) -> int:
        return self.model.pack_for_cpu_inference()

    def fingerprint(self) -> str:
        return self.model.fingerprint()

    def torch_model(self) -> Transformer:
        return self.model

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
        B, T = tokens.shape
        width = padded_width(T)
        if (cache is None or B != 1 or cache.batch != 1 or logits_slice is not None
                or width is None or int(cache.lengths[0]) + width > cache.max_len):
            return self.model(tokens, positions, cache, attention_mask, hidden_layers, logits_slice, inputs_embeds)
        if not set(hidden_layers) <= set(range(self.config.n_layer + 1)):
            raise ValueError(f"hidden_layers {sorted(set(hidden_layers))} out of range 0..{self.config.n_layer}")
        plan = cache.plan_write(T)
        if positions is None:
            positions = plan.start[:, None] + torch.arange(T)
        elif positions.shape != tokens.shape:
            raise ValueError(f"positions {tuple(positions.shape)} must match tokens {tuple(tokens.shape)}")
        if inputs_embeds is not None and inputs_embeds.shape != (B, T, self.config.d_model):
            raise ValueError(f"inputs_embeds {tuple(inputs_embeds.shape)} must be ({B}, {T}, {self.config.d_model})")
        new_mask = new_token_mask(attention_mask, B, T)
        if new_mask is None:
            new_mask = default_new_mask(T, self.config.causal)
        with torch.inference_mode():
            key = StepKey((cache.k.data_ptr(), cache.v.data_ptr(), tuple(cache.k.shape)), width,
                          tuple(sorted(set(hidden_layers))), inputs_embeds is not None)
            step = self._buffers(key)
            step.tokens[:, :T].copy_(tokens)
            if step.inputs_embeds is not None:
                assert inputs_embeds is not None
                step.inputs_embeds[:, :T].copy_(inputs_embeds)
            step.positions[:, :T].copy_(positions)
            step.positions[:, T:] = int(positions[0, -1])  # any valid position: padding rows are dropped
            step.start.fill_(int(plan.start[0]))
            step.new_mask.copy_(padded_mask(new_mask.to(step.new_mask.device), width))
            if step.run is None:
                step.run = self._compile(step, cache, key.hidden_layers)
            out = step.run()
            cache.advance(plan)
            return BackboneOutput(logits=out.logits[:, :T].clone(),
                                  hidden_states={k: v[:, :T].clone() for k, v in out.hidden_states.items()})

    def _buffers(self, key: StepKey) -> StaticStep:
        """The step buffers for this (cache buffers, width, hidden states) key, made on first use."""
        if key in self._steps:
            self._steps.move_to_end(key)
            return self._steps[key]
        device, width = self.model.embed.weight.device, key.width
        step = StaticStep(tokens=torch.zeros(1, width, dtype=torch.int64, device=device),
                          positions=torch.zeros(1, width, dtype=torch.int64, device=device),
                          start=torch.zeros(1, dtype=torch.int64, device=device),
                          new_mask=torch.zeros(1, width, width, dtype=torch.bool, device=device),
                          inputs_embeds=torch.zeros(1, width, self.config.d_model, dtype=self.embed.weight.dtype,
                                                    device=device) if key.embeds else None)
        self._steps[key] = step
        while len(self._steps) > self.max_graphs:
            self._steps.popitem(last=False)
        return step

    def _compile(self, step: StaticStep, cache: KVCache, hidden: tuple[int, ...]) -> Callable[[], BackboneOutput]:
        """The step's forward over its buffers: captured in a graph, or eager with `graphs=False`."""

        def forward() -> BackboneOutput:
            return self.model.forward_static(step.tokens, step.positions, step.start, step.new_mask, cache, hidden,
                                             step.inputs_embeds)

        return self._capture(forward) if self.graphs else forward

    def _capture(self, forward: Callable[[], BackboneOutput]) -> Callable[[], BackboneOutput]:
        """Warm `forward` up on a side stream (over the current step's inputs: it writes what the
        replay writes again), capture it, and return a replay that yields the captured outputs."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                forward()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            output = forward()
        self.captures += 1

        def replay() -> BackboneOutput:
            graph.replay()
            return output

        return replay
