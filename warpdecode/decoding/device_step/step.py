"""One device-resident speculative step (greedy): draft → verify → accept → KV commit → drafter
update → advance, with fixed shapes and no host read, so that one CUDA graph can replay it.

    tokens, valid = drafter.draft(state, room)                  # (N,), (N,)  static tree
    logits = target.forward_static([pending] + tokens, tree mask)   # (W, V)   writes W cache slots
    accepted, rows, emitted = greedy_tree_accept(...)            # the path greedy matching keeps
    commit_tree_path(...)                                         # skipped for chains
    drafter.update(...); write `emitted` into the history up to the first stop token; advance

Every write is masked by `done`: a step after the end changes nothing the host reads (it still runs
its forward), so the host may read `done` only every few steps.

A drafter with `auxiliary` rows (PPD's prompt rows, `tree.AuxiliaryRows`) has them run after the
tree's rows in the same forward, with their own input embeddings; they are never verified or
committed, and the drafter reads their logits (`read_auxiliary`) with the node the kept path ends on.

`verify(rows=...)` is the eager form for CPUs, where a verify row costs compute: the forward runs
over the drafted rows only (`rows`, read by the host), with the model's own forward, which attends
up to the real length (host-side) instead of over the whole cache, so a step costs what the host
engine's step of the same draft costs. Keys and values are then written compacted, and the commit
reads them there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from warpdecode.decoding.device_step.state import DeviceDrafter, DeviceState
from warpdecode.decoding.sampler import Sampler
from warpdecode.kernels.kv_commit import commit_tree_path
from warpdecode.kernels.sampling import counter_uniforms, sample_rows
from warpdecode.kernels.tree_accept import first_path_accept, greedy_tree_accept
from warpdecode.models.cache import KVCache
from warpdecode.models.transformer import Transformer


@dataclass(frozen=True)
class Oracle:
    """The oracle verifier's settings in the device step."""

    accept: float  # probability of accepting each next node of the first path
    seed: Tensor  # (1,) int64 on the device


class DeviceStep:
    def __init__(self, model: Transformer, drafter: DeviceDrafter, state: DeviceState, cache: KVCache,
                 stop_ids: Tensor, *, max_nodes: int, sampler: Sampler | None = None,
                 seed: Tensor | None = None, oracle: Oracle | None = None) -> None:
        """Args:
        model: the target (its static forward).
        drafter: a prepared device drafter.
        state: the request's buffers after the prefill.
        cache: the target's cache; holds `state.length` positions and room for one forward past the
            last one.
        stop_ids: (S,) int64 stop tokens on the device (may be empty).
        max_nodes: most valid draft nodes per step (the engine's budget).
        sampler: sample instead of taking the argmax: its warpers filter each row's distribution
            (`Sampler.probs`) and the draw is `sample_rows` with the uniform of (seed, position).
        seed: (1,) int64 on the device, the request's seed (with `sampler`).
        oracle: accept the first path's nodes with a set probability instead of verifying
            (`first_path_accept`, the oracle verifier: timing at a chosen τ, meaningless text).
        """
        if (sampler is None) != (seed is None):
            raise ValueError("sampler and seed go together")
        self.model, self.drafter, self.state, self.cache = model, drafter, state, cache
        self.sampler, self.seed, self.oracle = sampler, seed, oracle
        device = state.history.device
        self.first_path = torch.tensor(drafter.tree.first_path(), dtype=torch.int64, device=device)  # (Dp,)
        self.first_depths = torch.arange(1, self.first_path.shape[0] + 1, device=device)  # (Dp,)
        self.stop_ids, self.max_nodes = stop_ids, max_nodes
        tables = drafter.tree.tables
        device = state.history.device
        self.max_position = model.config.max_seq_len - 1
        self.depth_index = torch.arange(tables.max_depth + 1, device=device)  # (Dmax+1,)
        self.row_index = torch.arange(drafter.tree.width, device=device)  # (W,)
        self.true = torch.ones(1, dtype=torch.bool, device=device)

    def draft(self) -> tuple[Tensor, Tensor]:
        """(N,) int64 draft tokens and (N,) bool valid nodes for this step."""
        s = self.state
        room = (s.limit - 1 - s.new).clamp(min=0, max=self.max_nodes)
        return self.drafter.draft(s, room)

    def verify(self, tokens: Tensor, valid: Tensor, rows: Tensor | None = None) -> None:
        """Verify the draft, accept, commit and advance.

        Args:
            tokens: (N,) int64 and valid: (N,) bool, from `draft`.
            rows: None (every forward row: the static step), or (w,) int64 the forward rows to run,
                increasing, the pending token's and every valid node's among them, then the
                auxiliary rows the draft sends (eager form; `eager_rows`).
        """
        s, tables, aux = self.state, self.drafter.tree.tables, self.drafter.auxiliary
        W = tables.size + 1
        ext = torch.cat([s.pending(), torch.where(valid, tokens, 0)])  # (W,) invalid nodes carry token 0
        kept = torch.cat([self.true, valid]) & ~s.done  # (W,) rows the drafter learns from
        row_depths, tree_mask, inputs, embeds = tables.row_depths, tables.mask, ext, None
        if aux is not None:  # the drafter's rows after the tree's: their own embeddings, no token
            row_depths, tree_mask = aux.row_depths, aux.mask
            inputs = torch.cat([ext, ext.new_zeros(aux.size)])  # (W + A,)
            embeds = torch.cat([self.model.embed(ext), aux.embeds])  # (W + A, C)
        positions = (s.length + row_depths).clamp(max=self.max_position)  # invalid rows only clamp
        hidden_layers = self.drafter.feature_layers
        if rows is None:
            out = self.model.forward_static(inputs[None], positions[None], s.length, tree_mask, self.cache,
                                            hidden_layers, None if embeds is None else embeds[None])
            logits = out.logits[0, :W]
            best, slots, fed, kept_fed = self.select(logits, self.row_index), self.row_index, ext, kept  # (W,) each
            aux_logits, aux_rows = out.logits[0, W:], None if aux is None else aux.index  # (A, V), (A,)
        else:
            mask = tree_mask[:, rows][:, :, rows]  # (1, w, w)
            self.cache.lengths = s.length.cpu()  # the model's own forward: keys up to the real length only
            out = self.model(inputs[rows][None], positions[rows][None], self.cache,
                             mask if rows.shape[0] > 1 else None, hidden_layers,
                             inputs_embeds=None if embeds is None else embeds[rows][None])
            w = int((rows < W).sum()) if aux is not None else rows.shape[0]  # the tree's rows come first
            tree_rows, logits = rows[:w], out.logits[0, :w]
            best = torch.zeros_like(ext).index_copy_(0, tree_rows, self.select(logits, tree_rows))  # (W,) 0 not run
            slots = torch.zeros_like(ext).index_copy_(0, tree_rows, torch.arange(w, device=rows.device))
            fed, kept_fed = ext[tree_rows], kept[tree_rows]
            aux_logits, aux_rows = out.logits[0, w:], rows[w:] - W
        if self.oracle is None:
            accepted, path, emitted = greedy_tree_accept(ext, best, valid, tables)
        else:  # the oracle's draw for the node at position p is the uniform of (its seed, p)
            success = counter_uniforms(self.oracle.seed, s.length + self.first_depths) < self.oracle.accept
            accepted, path, emitted = first_path_accept(ext, best, valid, self.first_path, success, tables.max_depth)
        commit_tree_path(self.cache.k, self.cache.v, s.length, slots.index_select(0, path), in_place=tables.is_chain)
        self.drafter.update(fed, logits, kept_fed)
        if hidden_layers:  # the features at the kept path's rows, and the token after each
            kept_rows = slots.index_select(0, path)  # (Dmax+1,) forward rows
            self.drafter.observe({j: out.hidden_states[j][0].index_select(0, kept_rows) for j in hidden_layers},
                                 emitted, accepted + 1, ~s.done)
        if aux_rows is not None:  # the node the kept path ends on: its forward row - 1
            self.drafter.read_auxiliary(aux_logits, aux_rows, path.index_select(0, accepted.view(1)) - 1, ~s.done)
        self._advance(accepted, emitted, (tables.depths * valid).amax() if tables.size else accepted)

    def eager_rows(self, valid: Tensor) -> Tensor:
        """(w,) int64, the forward rows the eager form runs (read on the host): the pending token's,
        every valid node's, and the auxiliary rows the draft sends (`AuxiliaryRows.sent`)."""
        parts = [self.row_index[:1], valid.nonzero()[:, 0] + 1]
        aux = self.drafter.auxiliary
        if aux is not None:
            parts.append(aux.sent.nonzero()[:, 0] + self.drafter.tree.width)
        return torch.cat(parts)

    def select(self, logits: Tensor, rows: Tensor) -> Tensor:
        """The target's token after each forward row: the argmax, or a draw.

        A draw uses the uniform of (seed, position the token takes), whatever row computes it: along
        any path of the tree each position has one row, so the output is the token sequence that
        plain sampling with the same uniforms gives, whatever was drafted (the device step's
        sampling is lossless by identity, as its greedy decoding is). Per node this is speculative
        sampling for a one-token draft: child c is taken with probability p(c), and otherwise the
        token is a draw from p without the children.

        Args:
            logits: (w, V) after the forward rows `rows` (w,) int64 (row indices of the full tree).
        Returns:
            (w,) int64.
        """
        if self.sampler is None or self.seed is None:
            return logits.argmax(-1)
        positions = (self.state.length + self.drafter.tree.tables.row_depths + 1).index_select(0, rows)  # (w,)
        return sample_rows(self.sampler.probs(logits), counter_uniforms(self.seed, positions))

    def __call__(self) -> None:
        """The static step: every forward row, no host read."""
        tokens, valid = self.draft()
        self.verify(tokens, valid)

    def _advance(self, accepted: Tensor, emitted: Tensor, proposed: Tensor) -> None:
        """Write the emitted tokens (through the first stop token) after the pending one, log the step."""
        s, d = self.state, self.depth_index
        # (Dmax+1,); a comparison, not isin, whose sorting path syncs with the host
        stop = (emitted[:, None] == self.stop_ids[None, :]).any(1) & (d <= accepted)
        stopped = stop.any()
        count = torch.where(stopped, stop.to(torch.int64).argmax() + 1, accepted + 1)
        count = torch.where(s.done, 0, count)  # () tokens emitted by this step
        slots = (s.length + 1 + d).clamp(max=s.history.shape[0] - 1)  # (Dmax+1,)
        s.history.index_copy_(0, slots, torch.where(d < count, emitted, s.history.index_select(0, slots)))
        step = s.steps.clamp(max=s.accepted.shape[0] - 1).view(1)
        s.accepted.index_copy_(0, step, torch.where(s.done, s.accepted.index_select(0, step), accepted))
        s.proposed.index_copy_(0, step, torch.where(s.done, s.proposed.index_select(0, step), proposed))
        s.steps.add_((~s.done).to(torch.int64))
        s.length.add_(count)
        s.new.add_(count)
        s.done.copy_(s.done | stopped | (s.new >= s.limit))
