"""The device step under the `cudagraphs` backend: buffers that last across requests, and `read_every`
steps captured as one CUDA graph on them.

A `StepSession` holds one KV cache, one `DeviceState` and one stop-token buffer, sized for a class of
requests (the cache a power of two of at least `MIN_CACHE` positions, as the backend's own caches), and
the step that reads and writes them. Every request of that class resets the buffers in place
(`DeviceState.reset`) and replays the same graph: it is captured once per (drafter, size class, stop
capacity, node budget, steps per replay), on the first request.

Capturing needs warm-up runs of the step, which would advance the request. They run with `done`
forced on, which masks every write the host reads (the step's contract): they write only cache slots
past the real length (rewritten by the next real step) and the spare row of Token Recycling's matrix.
`done` is put back before the first replay. `graphs=False` on the backend (the CPU stand-in) runs the
same session eagerly: what the CPU tests check.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from warpdecode.decoding.device_step.state import DeviceDrafter, DeviceState, forward_rows
from warpdecode.decoding.device_step.step import DeviceStep, Oracle
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.models.cache import KVCache
from warpdecode.runtime.cudagraphs import MIN_CACHE, CudaGraphBackbone

MAX_SESSIONS = 8
"""Sessions (and their graphs and caches) kept per backbone, least recently used first out."""
MIN_STOPS = 8
"""Stop-token buffers hold a power of two of at least this many ids (-1 pads)."""


class SessionKey(NamedTuple):
    drafter: int  # id of the device drafter form (the session holds it, so the id is not reused)
    size: int  # cache positions
    stops: int  # stop-token buffer length
    max_nodes: int
    read_every: int
    sampling: SamplingConfig | None  # without its seed (the session's seed buffer holds it)
    oracle: tuple[float, int] | None


def size_class(needed: int, floor: int, ceiling: int) -> int:
    """The power of two of at least `floor` that holds `needed`, at most `ceiling` (then `needed` itself)."""
    size = max(floor, 1 << max(needed - 1, 0).bit_length())
    return size if size <= ceiling else needed


@dataclass
class StepSession:
    cache: KVCache
    state: DeviceState
    stops: Tensor  # (K,) int64 stop tokens, -1 pads
    seed: Tensor  # (1,) int64, the request's sampling seed (unused when greedy)
    step: DeviceStep
    read_every: int
    graphs: bool
    replay: Callable[[], None] | None = field(default=None, repr=False)
    captures: int = 0

    def start(self, prompt_ids: list[int], pending: Tensor, *, max_new_tokens: int, stop_ids: list[int],
              seed: int | None = None) -> None:
        """Reset the buffers for a request whose prefill filled `cache` and chose `pending` (1,)."""
        self.seed.fill_(0 if seed is None else seed)
        self.stops.fill_(-1)
        if stop_ids:
            self.stops[: len(stop_ids)] = torch.tensor(stop_ids, dtype=torch.int64)
        self.state.reset(prompt_ids, pending, max_new_tokens=max_new_tokens, stop_ids=self.stops)

    def run(self) -> None:
        """`read_every` steps: a graph replay (captured on the first call), or eager steps."""
        if not self.graphs:
            for _ in range(self.read_every):
                self.step()
            return
        if self.replay is None:
            self.replay = self._capture()
        self.replay()

    def warm_up(self, runs: int = 2) -> None:
        """Run the step `runs` times with `done` forced on: it changes nothing the host reads."""
        done = self.state.done.clone()
        self.state.done.fill_(True)
        for _ in range(runs):
            self.step()
        self.state.done.copy_(done)

    def _capture(self) -> Callable[[], None]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.warm_up()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()  # its own memory pool: a pool shared with graphs that were freed broke
        with torch.cuda.graph(graph):    # a later capture (an allocator assertion, torch 2.11)
            for _ in range(self.read_every):
                self.step()
        self.captures += 1
        return graph.replay


_SESSIONS: weakref.WeakKeyDictionary[CudaGraphBackbone, OrderedDict[SessionKey, StepSession]] = (
    weakref.WeakKeyDictionary())


def session(target: CudaGraphBackbone, drafter: DeviceDrafter, *, needed: int, stops: int, max_nodes: int,
            read_every: int, sampling: SamplingConfig | None = None,
            oracle: tuple[float, int] | None = None) -> StepSession:
    """The backbone's session for this drafter and a request that needs `needed` cache positions
    (prompt + new tokens + tree width) and `stops` stop tokens, greedy or with `sampling`'s warpers;
    made on first use."""
    model = target.torch_model()
    config, device = model.config, model.embed.weight.device
    key = SessionKey(id(drafter), size_class(needed, MIN_CACHE, config.max_seq_len + forward_rows(drafter)),
                     size_class(stops, MIN_STOPS, max(stops, MIN_STOPS)), max_nodes, read_every,
                     None if sampling is None else dataclasses.replace(sampling, seed=None), oracle)
    sessions = _SESSIONS.setdefault(target, OrderedDict())
    if key in sessions:
        sessions.move_to_end(key)
        return sessions[key]
    cache = KVCache(config.n_layer, 1, config.kv_head_count, key.size, config.head_width,
                    dtype=model.embed.weight.dtype, device=device)
    state = DeviceState.allocate(key.size, device)
    stop_buffer = torch.full((key.stops,), -1, dtype=torch.int64, device=device)
    seed = torch.zeros(1, dtype=torch.int64, device=device)
    sampler = None if key.sampling is None else Sampler(key.sampling, device)
    step = DeviceStep(model, drafter, state, cache, stop_buffer, max_nodes=max_nodes, sampler=sampler,
                      seed=seed if sampler is not None else None,
                      oracle=None if oracle is None else Oracle(oracle[0], torch.tensor([oracle[1]], device=device)))
    made = StepSession(cache, state, stop_buffer, seed, step, read_every, target.graphs)
    sessions[key] = made
    while len(sessions) > MAX_SESSIONS:
        sessions.popitem(last=False)
    return made
