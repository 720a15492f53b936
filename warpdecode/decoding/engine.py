"""The one draft→verify loop. It never imports a concrete drafter, verifier or controller.

    prefill → pending token
    repeat: tree = drafter.propose(state, controller.budget(state))
            logits = target([pending] + tree, tree mask)
            result = verifier.accept(tree, logits, sampler)      # accepted path + bonus token
            commit the path in the KV cache; the bonus token becomes the new pending token
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from warpdecode.decoding.outputs import DecodeStats, FinishReason, until_stop
from warpdecode.decoding.processors import TokenHistory
from warpdecode.decoding.protocols import Controller, DecodeState, Drafter, Verifier
from warpdecode.decoding.sampler import Sampler
from warpdecode.models.backbone import Backbone

if TYPE_CHECKING:
    from warpdecode.decoding.constraints.tree_mask import ConstrainedDecoding


@dataclass
class Method:
    drafter: Drafter
    verifier: Verifier
    controller: Controller
    max_tree_nodes: int = 64
    """Cache headroom for one verify forward; proposals beyond it are refused."""
    device_step: bool = False
    """Run in the device-resident step (`decoding/device_step`) instead of `run`: greedy, fixed
    controller, a drafter with a device form (`build_method` checks)."""


@torch.inference_mode()
def run(
    target: Backbone,
    prompt_ids: list[int],
    method: Method,
    sampler: Sampler,
    *,
    max_new_tokens: int,
    stop_ids: set[int],
    on_tokens: Callable[[list[int]], None] | None = None,
    constraint: ConstrainedDecoding | None = None,
    stop_check: Callable[[list[int]], int | None] | None = None,
) -> tuple[list[int], FinishReason, DecodeStats]:
    """Decode up to `max_new_tokens` after `prompt_ids`, which must fit the context with that budget.

    `constraint` keeps the output in a grammar: it masks every logits row with its own context's
    allowed tokens (after the penalties), cuts the tree's forbidden drafts and ends on the grammar's
    stop token (`decoding/constraints/tree_mask.py`), or closes the output within `max_new_tokens`
    (finish "length", `stats.closing_tokens`) when it carries a `BudgetClosing`. `stop_check` (stop strings,
    `StopStrings.check`) sees each batch of emitted tokens before `on_tokens` and returns how many of
    them to keep when generation ends inside them (finish "stop").
    """
    device = target.embed.weight.device
    target.pack_for_cpu_inference()
    method.drafter.prepare(target)
    method.verifier.prepare(target)
    headroom = method.max_tree_nodes + 1
    cache = target.new_cache(1, min(target.config.max_seq_len, len(prompt_ids) + max_new_tokens + headroom))
    # known once prepared (may depend on the target)
    hidden_layers = tuple(sorted({*method.drafter.needs_hidden_states, *method.verifier.needs_hidden_states}))
    stats = DecodeStats(prompt_tokens=len(prompt_ids))
    start = time.perf_counter()
    out = target(torch.tensor([prompt_ids], device=device), cache=cache, hidden_layers=hidden_layers,
                 logits_slice=slice(-1, None))
    logits = out.logits[:, -1]  # (1, V)
    if sampler.penalties:
        logits = sampler.penalize(logits, TokenHistory.single(prompt_ids, len(prompt_ids)))
    if constraint is not None:
        logits = constraint.mask_next(logits)
    pending = int(sampler.select(logits)[0])
    new = [pending] if constraint is None else constraint.commit([pending])  # a closing may replace it
    pending = new[-1]
    stats.time_to_first_token = time.perf_counter() - start
    stopped = stop_check is not None and stop_check(new) is not None
    state = DecodeState(target, cache, prompt_ids + new, len(prompt_ids), sampler,
                        {k: v[0] for k, v in out.hidden_states.items()}, torch.tensor(prompt_ids[-1:]), out.logits[0])
    if on_tokens is not None:
        on_tokens(list(new))
    method.drafter.start(state)
    method.controller.start(state)

    finish: FinishReason = "length"
    while not stopped and pending not in stop_ids and len(new) < max_new_tokens and not (constraint is not None and constraint.done):
        if cache.max_len - int(cache.lengths[0]) < 1:
            finish = "context"
            break
        t0 = time.perf_counter()
        room = min(max_new_tokens - len(new) - 1, method.max_tree_nodes, cache.max_len - int(cache.lengths[0]) - 1)
        tree = method.drafter.propose(state, min(method.controller.budget(state), room))
        if tree.size > room:
            raise RuntimeError(f"drafter proposed {tree.size} nodes with a budget of {room}")
        if constraint is not None:
            tree = constraint.shape(tree, room)
        else:
            tree = method.controller.trim(state, tree)
        t1 = time.perf_counter()
        tree_start = cache.lengths.clone()
        tokens, positions, mask = tree.verify_inputs(pending, int(tree_start[0]))
        tokens = tokens.to(device)
        out = target(tokens, positions.to(device), cache, None if tree.size == 0 else mask,
                     hidden_layers=hidden_layers, inputs_embeds=tree.verify_embeds(target.embed, tokens))
        candidates = tree.verified()
        logits = out.logits[0, : candidates.size + 1]  # (n+1, V): after the pending token, then after each candidate
        if sampler.penalties:
            history = TokenHistory(torch.tensor(state.tokens), len(prompt_ids), ((),) + tuple(candidates.path_tokens()))
            logits = sampler.penalize(logits, history)
        if constraint is not None:
            logits = constraint.mask(logits)
        verified_hidden = {k: out.hidden_states[k][0, : candidates.size + 1] for k in method.verifier.needs_hidden_states}
        result = method.verifier.accept(candidates, logits, sampler, verified_hidden)
        kept = [0] + [node + 1 for node in result.path]  # forward indices: pending, then the accepted nodes
        cache.commit(tree_start, torch.tensor([kept]), torch.tensor([len(kept)]))
        state.hidden_states = {k: v[0, kept] for k, v in out.hidden_states.items()}
        state.forward_tokens, state.forward_logits, state.forward_tree = tokens[0], out.logits[0], tree
        t2 = time.perf_counter()

        emitted = until_stop(result.tokens, stop_ids)
        if constraint is not None:
            emitted = constraint.commit(emitted)
        if stop_check is not None and (keep := stop_check(emitted)) is not None:
            emitted, stopped = emitted[:keep], True
        state.tokens.extend(emitted)
        new.extend(emitted)
        pending = emitted[-1]
        stats.target_forwards += 1
        stats.accepted_per_step.append(len(result.path))
        stats.proposed_per_step.append(result.proposed)
        stats.divergent_tokens += result.divergent
        if constraint is None or not constraint.done:  # a grammar's stop token may end the request inside the path
            method.drafter.observe(state, result)
            method.controller.observe(result)
        stats.draft_seconds += (t1 - t0) + (time.perf_counter() - t2)
        stats.target_seconds += t2 - t1
        if on_tokens is not None:  # the caller's streaming time counts in neither
            on_tokens(emitted)
    if stopped:
        finish = "stop"
    elif constraint is not None and constraint.closing_tokens:
        finish, stats.closing_tokens = "length", constraint.closing_tokens  # the budget cut it; closed
    elif pending in stop_ids or (constraint is not None and constraint.done):
        finish = "eos"
    stats.seconds = time.perf_counter() - start
    stats.new_tokens = len(new)
    return new, finish, stats
