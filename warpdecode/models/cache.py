"""Static, preallocated KV cache with per-row lengths.

Layout: `k`, `v` are `(L, B, Hkv, S, D)`; row `b` holds `lengths[b]` valid positions. A backbone
forward over `T` new tokens writes them at slots `lengths[b] .. lengths[b] + T - 1` and then
advances `lengths` by `T` (append). Speculative decoding rolls back with `truncate` or, after a tree
forward, keeps only the accepted root-to-leaf path with `commit`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from warpdecode.errors import ConfigError
from warpdecode.models.config import ModelConfig


@dataclass(frozen=True)
class WritePlan:
    """Where one forward's `T` new tokens go, shared by every layer of that forward.

    `uniform_start` is set when every row starts at the same slot (plain slicing); otherwise
    `rows`/`slots` are `(B, T)` int64 index tensors for advanced indexing.
    """

    start: Tensor  # (B,) int64, lengths before the write
    num_new: int  # T
    used: int  # S_used = max(start) + T, the key length attention needs to look at
    uniform_start: int | None
    rows: Tensor | None  # (B, T) int64
    slots: Tensor | None  # (B, T) int64


class KVCache:
    """Preallocated keys/values for `batch` rows of up to `max_len` positions each."""

    def __init__(
        self,
        n_layer: int,
        batch: int,
        n_kv_head: int,
        max_len: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        zeroed: bool = True,
    ) -> None:
        """`zeroed=False` leaves the storage unwritten, so that memory is only taken as rows fill: for a
        pool of rows whose forwards never read a slot before writing it (`decoding/continuous.py`)."""
        if batch <= 0 or max_len <= 0:
            raise ConfigError(f"cache needs batch > 0 and max_len > 0, got batch={batch}, max_len={max_len}")
        shape = (n_layer, batch, n_kv_head, max_len, head_dim)
        alloc = torch.zeros if zeroed else torch.empty
        self.k = alloc(shape, dtype=dtype, device=device)  # (L, B, Hkv, S, D)
        self.v = alloc(shape, dtype=dtype, device=device)  # (L, B, Hkv, S, D)
        self.lengths = torch.zeros(batch, dtype=torch.int64)  # (B,) on CPU: read every step, never synced
        self.max_len = max_len

    @classmethod
    def for_model(
        cls,
        config: ModelConfig,
        batch: int,
        max_len: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        zeroed: bool = True,
    ) -> KVCache:
        if max_len > config.max_seq_len:
            raise ConfigError(f"cache length {max_len} exceeds the model's context of {config.max_seq_len} tokens")
        return cls(config.n_layer, batch, config.kv_head_count, max_len, config.head_width, dtype=dtype, device=device,
                   zeroed=zeroed)

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    def plan_write(self, num_new: int) -> WritePlan:
        """Check capacity and compute the slots for `num_new` tokens per row."""
        start = self.lengths.clone()
        top = int(start.max()) + num_new
        if top > self.max_len:
            raise ConfigError(
                f"sequence of {top} tokens does not fit the KV cache of {self.max_len} positions "
                f"(prompt plus new tokens exceed the context)"
            )
        first = int(start[0])
        if bool((start == first).all()):
            return WritePlan(start, num_new, top, first, None, None)
        device = self.k.device
        slots = (start[:, None] + torch.arange(num_new)).to(device)  # (B, T)
        rows = torch.arange(self.batch, device=device)[:, None].expand(-1, num_new)  # (B, T)
        return WritePlan(start, num_new, top, None, rows, slots)

    def write(self, layer: int, k: Tensor, v: Tensor, plan: WritePlan) -> tuple[Tensor, Tensor]:
        """Store this layer's new keys/values and return the keys/values attention should read.

        Args:
            k, v: (B, Hkv, T, D) new keys / values.
        Returns:
            (B, Hkv, S_used, D) keys and values, cached positions followed by the new ones.
        """
        if plan.uniform_start is not None:
            s = plan.uniform_start
            self.k[layer, :, :, s : s + plan.num_new] = k
            self.v[layer, :, :, s : s + plan.num_new] = v
        else:
            # Advanced indices separated by a slice put the indexed dims first: (B, T, Hkv, D).
            self.k[layer][plan.rows, :, plan.slots] = k.transpose(1, 2)
            self.v[layer][plan.rows, :, plan.slots] = v.transpose(1, 2)
        return self.k[layer, :, :, : plan.used], self.v[layer, :, :, : plan.used]

    def write_at(self, layer: int, k: Tensor, v: Tensor, slots: Tensor) -> tuple[Tensor, Tensor]:
        """Store this layer's new keys/values at `slots` of every row and return the whole cache
        layer (static shapes, no host sync: what a CUDA graph can capture).

        Args:
            k, v: (B, Hkv, T, D) new keys / values.
            slots: (T,) int64 slot indices on the cache's device.
        Returns:
            (B, Hkv, S_max, D) keys and values of this layer.
        """
        self.k[layer].index_copy_(2, slots, k)
        self.v[layer].index_copy_(2, slots, v)
        return self.k[layer], self.v[layer]

    def write_all(self, k: Tensor, v: Tensor, plan: WritePlan) -> None:
        """Store the new keys/values of every layer at once (a backend that computes all layers in
        one call, e.g. an exported step graph). k, v: (L, B, Hkv, T, D)."""
        if plan.uniform_start is not None:
            s = plan.uniform_start
            self.k[:, :, :, s : s + plan.num_new] = k
            self.v[:, :, :, s : s + plan.num_new] = v
        else:
            self.k[:, plan.rows, :, plan.slots] = k.permute(1, 3, 0, 2, 4)  # (B, T, L, Hkv, D)
            self.v[:, plan.rows, :, plan.slots] = v.permute(1, 3, 0, 2, 4)

    def advance(self, plan: WritePlan) -> None:
        self.lengths = plan.start + plan.num_new

    def truncate(self, lengths: Tensor | list[int] | int) -> None:
        """Roll rows back to `lengths` (B,) valid positions; never grows a row."""
        new = torch.as_tensor(lengths, dtype=torch.int64).cpu()
        if new.dim() > 1 or new.numel() not in (1, self.batch):
            raise ValueError(f"truncate needs one length per row ({self.batch}), got shape {tuple(new.shape)}")
        new = new.expand(self.batch).clone()
        if bool((new > self.lengths).any()) or bool((new < 0).any()):
            raise ValueError(f"truncate to {new.tolist()} but rows hold {self.lengths.tolist()}")
        self.lengths = new

    def copy_from(self, source: KVCache, layers: list[int], begin: int, end: int) -> None:
        """Copy positions [begin, end) of `source`'s `layers` into this cache's layers 0..len(layers)-1
        (a self-draft reusing its target's keys and values) and set every row's length to `end`."""
        if len(layers) != self.k.shape[0] or end > min(self.max_len, source.max_len) or not 0 <= begin <= end:
            raise ValueError(f"cannot copy positions [{begin}, {end}) of layers {layers} into a "
                             f"{self.k.shape[0]}-layer cache of {self.max_len} positions")
        span = slice(begin, end)
        index = torch.tensor(layers, device=source.k.device)
        self.k[:, :, :, span] = source.k[:, :, :, span][index]
        self.v[:, :, :, span] = source.v[:, :, :, span][index]
        self.lengths = torch.full((self.batch,), end, dtype=torch.int64)

    def rows(self, first: int, stop: int) -> KVCache:
        """Rows `first .. stop-1` as a cache of their own that shares this one's storage (a forward over
        some rows of a slot pool); its lengths are a copy: write them back with `set_rows` after use."""
        if not 0 <= first < stop <= self.batch:
            raise ValueError(f"rows [{first}, {stop}) are not rows of a {self.batch}-row cache")
        view = object.__new__(KVCache)
        view.k, view.v = self.k[:, first:stop], self.v[:, first:stop]  # (L, stop - first, Hkv, S, D) views
        view.lengths = self.lengths[first:stop].clone()
        view.max_len = self.max_len
        return view

    def set_rows(self, first: int, view: KVCache) -> None:
        """Take the lengths of a `rows(first, ...)` view after a forward through it."""
        self.lengths[first : first + view.batch] = view.lengths

    def move_row(self, source: int, target: int, *, of: KVCache | None = None) -> None:
        """Copy row `source`'s valid positions (of cache `of`, default this one) into row `target`,
        which then holds them; `source` keeps its copy."""
        origin = self if of is None else of
        n = int(origin.lengths[source])
        self.k[:, target, :, :n] = origin.k[:, source, :, :n]
        self.v[:, target, :, :n] = origin.v[:, source, :, :n]
        self.lengths[target] = n

    def keep_rows(self, rows: list[int]) -> None:
        """Keep only these rows, in this order (finished rows leave a batch); copies the cache."""
        if not rows or any(not 0 <= r < self.batch for r in rows):
            raise ValueError(f"keep_rows needs row indices in [0, {self.batch}), got {rows}")
        index = torch.tensor(rows, dtype=torch.int64)
        self.k = self.k[:, index.to(self.k.device)].contiguous()
        self.v = self.v[:, index.to(self.v.device)].contiguous()
        self.lengths = self.lengths[index]

    def fill_from_row(self, source: KVCache, row: int = 0) -> None:
        """Every row of this cache takes `source` row `row`'s valid positions and length (n candidates
        of one prompt start from its one prefill). The caches must have as many layers and heads."""
        n = int(source.lengths[row])
        if n > self.max_len:
            raise ValueError(f"row of {n} positions does not fit a cache of {self.max_len}")
        self.k[:, :, :, :n] = source.k[:, row : row + 1, :, :n]  # broadcast over B
        self.v[:, :, :, :n] = source.v[:, row : row + 1, :, :n]
        self.lengths = torch.full((self.batch,), n, dtype=torch.int64)

    def reorder_rows(self, parents: list[int], begin: int = 0) -> None:
        """Row i takes row `parents[i]`'s positions [begin, length) (beam search: each beam continues its
        parent), gathered in one index select; rows that keep their own contents are not copied, and
        positions before `begin` (a prefix every row shares, e.g. the prompt) are left where they are.
        Every row must hold the same number of positions.

        Example: parents [0, 0, 2] copies row 0 onto row 1 only.
        """
        if len(parents) != self.batch or any(not 0 <= p < self.batch for p in parents):
            raise ValueError(f"reorder_rows needs {self.batch} row indices in [0, {self.batch}), got {parents}")
        end = int(self.lengths.max())
        if not bool((self.lengths == end).all()):
            raise ValueError(f"reorder_rows needs rows of one length, got {self.lengths.tolist()}")
        moved = [(i, p) for i, p in enumerate(parents) if p != i]
        if not moved or end <= begin:
            return
        device = self.k.device
        dst = torch.tensor([i for i, _ in moved], device=device)
        src = torch.tensor([p for _, p in moved], device=device)
        span = slice(begin, end)
        # The right side is gathered into a new tensor first, so a row that is both a source and a
        # destination is read before it is overwritten.
        self.k[:, dst, :, span] = self.k[:, src, :, span]
        self.v[:, dst, :, span] = self.v[:, src, :, span]

    def commit(self, tree_start: Tensor, path: Tensor, num_accepted: Tensor) -> None:
        """Keep an accepted root-to-leaf path of the last tree forward and drop the other nodes.

        The tree's N nodes were written at slots `tree_start[b] + n`. Node `path[b, i]` moves to slot
        `tree_start[b] + i` for `i < num_accepted[b]`, and the row's length becomes
        `tree_start[b] + num_accepted[b]`.

        Example: tree nodes at slots 10..14, accepted path `[0, 2, 4]` → slots 10, 12, 14 are copied to
        10, 11, 12 and the row holds 13 positions.

        Args:
            tree_start: (B,) int64, row lengths before the tree forward.
            path: (B, A) int64 node indices, padded arbitrarily past `num_accepted`.
            num_accepted: (B,) int64, accepted nodes per row (0..A).
        """
        tree_start = tree_start.to(torch.int64).cpu()
        num_accepted = num_accepted.to(torch.int64).cpu()
        path = path.cpu().to(torch.int64)
        width = path.shape[1]
        order = torch.arange(width)[None, :]  # (1, A)
        if width and bool(((path == order) | (order >= num_accepted[:, None])).all()):
            width = 0  # every accepted node is already at its slot (plain steps, chains): nothing moves
        if width:
            device = self.k.device
            src = (tree_start[:, None] + path).to(device)  # (B, A)
            dst = (tree_start[:, None] + torch.arange(width)).to(device)  # (B, A)
            keep = (torch.arange(width)[None, :] < num_accepted[:, None]).to(device)  # (B, A)
            src = torch.where(keep, src, dst)  # padded entries copy a slot onto itself
            rows = torch.arange(self.batch, device=device)[:, None].expand(-1, width)
            # Gather first, then scatter: source and destination slots may overlap.
            k_path = self.k[:, rows, :, src]  # (B, A, L, Hkv, D)
            v_path = self.v[:, rows, :, src]
            self.k[:, rows, :, dst] = k_path
            self.v[:, rows, :, dst] = v_path
        self.lengths = tree_start + num_accepted
