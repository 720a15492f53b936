"""The host loop of the device-resident step: prefill, then run steps and read the device `done`
flag (and, when streaming, the new tokens) every `read_every` steps; read the output at the end.

Greedy decoding with a drafter that has a device form (`device_drafter` on its class): the output
equals plain greedy decoding's, and the accepted lengths equal the engine's with the same drafter.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

import torch

from warpdecode.decoding.device_step.graphs import StepSession, session
from warpdecode.decoding.device_step.state import DeviceDrafter, DeviceState, forward_rows
from warpdecode.decoding.device_step.step import DeviceStep, Oracle
from warpdecode.decoding.outputs import DecodeStats, FinishReason
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.errors import CapabilityError
from warpdecode.kernels.sampling import counter_uniforms, sample_rows
from warpdecode.models.backbone import Backbone
from warpdecode.models.cache import KVCache
from warpdecode.runtime.cudagraphs import CudaGraphBackbone

_FORMS: weakref.WeakKeyDictionary[Any, DeviceDrafter] = weakref.WeakKeyDictionary()


def has_device_form(drafter: object) -> bool:
    """Whether the drafter's class declares a device form (`device_drafter`, a class with `of(drafter)`)."""
    return getattr(type(drafter), "device_drafter", None) is not None


def device_form(drafter: object) -> DeviceDrafter:
    """The drafter's device form, made once per drafter: what it learns (Token Recycling's matrix)
    lasts as long as the drafter, across requests, as the host drafter's state does."""
    if not has_device_form(drafter):
        name = getattr(drafter, "registry_name", type(drafter).__name__)
        raise CapabilityError(f"method {name!r} has no device step (its drafter keeps host state); "
                              "`warpdecode methods --json` lists the methods that have one (device_step)")
    if drafter not in _FORMS:
        _FORMS[drafter] = type(drafter).device_drafter.of(drafter)  # type: ignore[attr-defined]
    return _FORMS[drafter]


@torch.inference_mode()
def run_device(
    target: Backbone,
    prompt_ids: list[int],
    drafter: DeviceDrafter,
    *,
    max_new_tokens: int,
    stop_ids: set[int],
    max_nodes: int = 64,
    static: bool | None = None,
    read_every: int = 1,
    on_tokens: Callable[[list[int]], None] | None = None,
    sampling: SamplingConfig | None = None,
    oracle: tuple[float, int] | None = None,
) -> tuple[list[int], FinishReason, DecodeStats]:
    """Greedy decoding (or sampling, with `sampling`) of up to `max_new_tokens` after `prompt_ids`
    (which leave that room in the context) with device steps.

    Args:
        max_nodes: most valid draft nodes per step (the engine's `Method.max_tree_nodes`).
        static: run every forward row of the static tree (the capturable step); None: on every
            device but the CPU, where the eager form runs the drafted rows only (`DeviceStep.verify`).
            On the `cudagraphs` backend the static step always runs, on buffers that last across
            requests, `read_every` steps captured as one CUDA graph (`graphs.StepSession`).
        read_every: steps between reads of the `done` flag (static steps; the eager form reads every step).
        on_tokens: receives the new tokens at each read.
        sampling: a sampling configuration (`do_sample`, its warpers and seed; no penalties): every
            token is a draw from the filtered target distribution with the uniform of (seed, its
            position) (`DeviceStep.select`): for a seed, the tokens plain sampling gives, whatever
            the drafter, in every form of the step. Without a seed, one comes from torch's
            default generator.
        oracle: (accept, seed) of the oracle verifier (`verifiers/oracle.py`): each next node of
            the tree's first path accepted with probability `accept`, the draws seeded; greedy only.

    A step is one piece of device work: `stats.target_seconds` is the whole loop and
    `stats.draft_seconds` stays 0.
    """
    model = target.torch_model()
    device = model.embed.weight.device
    static = device.type != "cpu" if static is None else static
    if read_every < 1:
        raise ValueError(f"read_every must be >= 1, got {read_every}")
    model.pack_for_cpu_inference()
    drafter.prepare(model)
    n = len(prompt_ids)
    config = model.config
    needed = n + max_new_tokens + forward_rows(drafter)
    if sampling is not None and (not sampling.do_sample or sampling.penalties()):
        raise ValueError("the device step samples with do_sample=True and no penalties")
    if sampling is not None and oracle is not None:
        raise ValueError("the oracle verifier runs greedy")
    sampler = Sampler(sampling, device) if sampling is not None else None
    seed_value = None
    if sampling is not None:
        seed_value = sampling.seed if sampling.seed is not None else int(torch.randint(1 << 62, ()))
    steps: StepSession | None = None
    if isinstance(target, CudaGraphBackbone):  # buffers (and graphs) that last across requests
        steps = session(target, drafter, needed=needed, stops=len(stop_ids), max_nodes=max_nodes,
                        read_every=read_every, sampling=sampling, oracle=oracle)
        cache = steps.cache
        cache.truncate(0)
        static = True
    else:
        cache = KVCache(config.n_layer, 1, config.kv_head_count, needed, config.head_width,
                        dtype=model.embed.weight.dtype, device=device)
    stops = sorted(stop_ids)
    stats = DecodeStats(prompt_tokens=n)
    start = time.perf_counter()
    out = model(torch.tensor([prompt_ids], device=device), cache=cache, logits_slice=slice(-1, None),
                hidden_layers=drafter.feature_layers)
    seed = None if seed_value is None else torch.tensor([seed_value], dtype=torch.int64, device=device)
    if sampler is not None and seed is not None:  # the first token, at position n (`DeviceStep.select`)
        pending = sample_rows(sampler.probs(out.logits[:, -1]),
                              counter_uniforms(seed, torch.tensor([n], device=device)))
    else:
        pending = out.logits[:, -1].argmax(-1)  # (1,)
    if steps is not None:
        steps.start(prompt_ids, pending, max_new_tokens=max_new_tokens, stop_ids=stops, seed=seed_value)
        state, step = steps.state, steps.step
    else:
        stop = torch.tensor(stops, dtype=torch.int64, device=device)
        state = DeviceState.start(prompt_ids, pending, max_new_tokens=max_new_tokens, width=forward_rows(drafter),
                                  stop_ids=stop)
        step = DeviceStep(model, drafter, state, cache, stop, max_nodes=max_nodes, sampler=sampler, seed=seed,
                          oracle=None if oracle is None else Oracle(oracle[0], torch.tensor([oracle[1]], device=device)))
    read = 0
    if on_tokens is not None:
        on_tokens([int(pending[0])])
        read = 1
    stats.time_to_first_token = time.perf_counter() - start
    true = torch.ones(1, dtype=torch.bool, device=device)
    drafter.update(state.history[n - 1 : n], out.logits[0], true)
    drafter.start({j: out.hidden_states[j][0] for j in drafter.feature_layers}, state.history[1 : n + 1],
                  cache.max_len)
    loop_start = time.perf_counter()
    while not bool(state.done):
        if steps is not None:
            steps.run()
        elif static:
            for _ in range(read_every):
                step()
        else:
            tokens, valid = step.draft()
            step.verify(tokens, valid, step.eager_rows(valid))
        if on_tokens is not None:
            count = int(state.new)
            on_tokens(state.history[n + read : n + count].tolist())
            read = count
    new = state.history[n : n + int(state.new)].tolist()
    stats.seconds = time.perf_counter() - start
    stats.target_seconds = time.perf_counter() - loop_start
    stats.new_tokens = len(new)
    forwards = int(state.steps)
    stats.target_forwards = forwards
    stats.accepted_per_step = state.accepted[:forwards].tolist()
    stats.proposed_per_step = state.proposed[:forwards].tolist()
    finish: FinishReason = "eos" if new[-1] in stop_ids else "length"
    return new, finish, stats
