"""Continuous (iteration-level) batching with ragged speculation: rows join and leave between steps.

A `ContinuousBatch` owns a pool of `max_rows` KV-cache rows. `add` prefills a new request alone in
the first free row and picks its first token; `step` runs one forward over all the rows at once and
picks each row's next tokens with the row's own sampler (its temperature, filters, penalties and
random generator); `remove` frees a finished or cancelled row, moving the last row into its place
so the rows in use stay `0 .. len(rows) - 1` (a forward reads a view of exactly those rows).

Speculation per row: a row added with a `Method` whose drafter `supports_batch` drafts a tree each
step (its own drafter, controller and verifier state); the step's forward holds every row's pending
token and tree, padded to the widest tree (padding rows are never read),
each row's verifier accepts its own path, and the cache keeps each row's accepted path
(`KVCache.commit`, per row). `step(max_nodes=0)` drafts nothing this step (speculation under load:
the caller chooses the budget from the batch size).

Every forward runs batch-invariantly (`kernels/invariance.py`): a row's tokens at temperature 0
are the same whatever other rows share its steps, and whenever they joined or left. A sampled
row draws from its own generator, so with a seed it gives the same tokens at any batch size.

Example: rows A, B, C decode together; B finishes and is removed, C moves into B's cache row; D
is added in the third row and takes part from the next step on.

The pool is allocated unwritten: memory is taken as rows fill (a forward writes a slot before any
row reads it: a row's prefill attends over its own new keys, a step's attention over exactly the
row's own positions), so `max_rows` rows of `max_len` positions cost what the requests use.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from warpdecode.decoding.draft_cost import LevelAcceptance, LevelCost, keep_depth
from warpdecode.decoding.engine import Method
from warpdecode.decoding.outputs import DecodeStats, FinishReason, until_stop
from warpdecode.decoding.processors import TokenHistory
from warpdecode.decoding.protocols import DecodeState
from warpdecode.decoding.sampler import Sampler
from warpdecode.decoding.tree import DraftTree
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.kernels.invariance import batch_invariant, padded_rows
from warpdecode.kernels.ragged_attention import padded_keys
from warpdecode.models.backbone import Backbone
from warpdecode.models.cache import KVCache

if TYPE_CHECKING:
    from warpdecode.decoding.constraints.tree_mask import ConstrainedDecoding


@dataclass(eq=False)
class Row:
    """One request of a `ContinuousBatch`: its prompt, its new tokens so far and how it ended."""

    prompt: list[int]
    budget: int
    """New tokens at most."""
    sampler: Sampler
    new: list[int] = field(default_factory=list)
    last: list[int] = field(default_factory=list)
    """The tokens the last `add` or `step` gave it (one, or a speculative step's accepted path and bonus)."""
    finish: FinishReason | None = None
    """Set once the row is done: `eos` (a stop token, the last of `new`) or `length` (its budget; also a
    constrained row closed within it, `stats.closing_tokens` > 0)."""
    stats: DecodeStats = field(default_factory=DecodeStats)
    prompt_len: int = -1
    """Tokens of `prompt` that are the request's prompt; any after them were generated before the row
    joined (a request that decoded alone first), and count as generated for the penalties."""
    method: Method | None = None
    """Its speculative method (None: plain decoding)."""
    drafted: tuple[int, int] = (0, 0)
    """Its last step's draft: nodes its drafter proposed, and the depth it was verified to (after `step`'s
    `keep` cut it; 0: nothing verified)."""
    filled: int = 0
    """Prompt tokens prefilled so far, while the prompt is prefilled chunk by chunk."""
    constraint: ConstrainedDecoding | None = None
    """The grammar its output keeps to (`decoding/constraints`); it ends the row once complete."""
    state: DecodeState | None = None
    keep_logits: bool = False
    """Keep the target's raw logits that each token of `last` was picked from, in `last_logits` (a
    request that reports log-probabilities; not for a constraint that closes at its budget, whose
    closing tokens no forward scored)."""
    last_logits: torch.Tensor | None = None  # (len(last), V) float, with keep_logits
    started: float = field(default_factory=time.perf_counter)

    def _push(self, tokens: list[int], stop_ids: set[int]) -> None:
        """Take a step's tokens, cut after a stop token, at the end of the grammar or at the budget."""
        tokens = until_stop(tokens, stop_ids)
        if self.constraint is not None:
            tokens = self.constraint.commit(tokens)
        tokens = tokens[: self.budget - len(self.new)]
        self.new.extend(tokens)
        self.last = tokens
        if self.state is not None:
            self.state.tokens.extend(tokens)
        if self.constraint is not None and self.constraint.closing_tokens:
            self.finish, self.stats.closing_tokens = "length", self.constraint.closing_tokens  # closed at its budget
        elif (tokens and tokens[-1] in stop_ids) or (self.constraint is not None and self.constraint.done):
            self.finish = "eos"
        elif len(self.new) >= self.budget:
            self.finish = "length"
        if self.finish is not None:
            self.stats.new_tokens = len(self.new)
            self.stats.seconds = time.perf_counter() - self.started


class ContinuousBatch:
    """Decoding of up to `max_rows` requests of up to `max_len` tokens each (prompt + new)."""

    def __init__(self, target: Backbone, *, max_rows: int, max_len: int, stop_ids: set[int],
                 prefill_chunk: int | None = None, ragged_verify: bool = False) -> None:
        """`prefill_chunk`: prefill a longer prompt this many tokens per step, between the decoding
        rows' steps, so that it does not hold them for its whole prefill (None: at once, in `add`).
        `ragged_verify`: speculative rows attend with `kernels/ragged_attention.py` (one call per layer
        for all their positions) in every step, instead of one SDPA per row and position; both are
        exact and batch-invariant. Measured on the 2-core CPU (docs/notes/serving.md): it halves a
        verify step's attention but adds ~8 % to a one-token step, so it is off by default."""
        if max_rows < 1:
            raise ConfigError(f"a batch needs at least one row, got max_rows={max_rows}")
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ConfigError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        target.pack_for_cpu_inference()
        self.target = target
        self.stop_ids = stop_ids
        self.max_len = max_len
        self.cache = KVCache.for_model(target.config, max_rows, max_len, dtype=target.embed.weight.dtype,
                                       device=target.embed.weight.device, zeroed=False)
        self.rows: list[Row] = []
        """The rows being decoded; row i lives in cache row i."""
        self._finite = [0] * max_rows
        """Slots of each cache row known to hold numbers (written or zeroed): the step's attention reads
        a whole block of slots past a row's keys, with zero weight (`kernels/ragged_attention.py`)."""
        self.prefill_chunk = prefill_chunk
        self.ragged_verify = ragged_verify
        self.width = 1
        """Positions per row of the last step's forward (1 + the largest tree verified)."""
        self.filling: list[Row] = []
        """Rows whose prompt is being prefilled chunk by chunk (the first one, in `_scratch`), in order."""
        self._scratch: KVCache | None = None

    @property
    def max_rows(self) -> int:
        return self.cache.batch

    @property
    def free(self) -> int:
        return self.max_rows - len(self.rows) - len(self.filling)

    @torch.inference_mode()
    def add(self, prompt: list[int], *, max_new_tokens: int, sampler: Sampler, prompt_len: int | None = None,
            method: Method | None = None, constraint: ConstrainedDecoding | None = None,
            keep_logits: bool = False) -> Row:
        """Prefill `prompt` in a free row and pick its first token. The row joins the batch unless that
        token already finished it (check `row.finish`); the caller removes finished rows it was given.
        `prompt_len`: the request's own prompt is `prompt[:prompt_len]`, the rest was generated before
        (default: all of `prompt` is the prompt). `method`: the row's own speculative method (built
        for this row alone: drafters keep per-request state), whose drafter must `supports_batch`.
        `constraint`: the grammar the row's output keeps to (each verified row masked with its own
        context's allowed tokens, forced tokens drafted for free); a constrained row needs `method`
        (`build_method("none")` for plain decoding). `keep_logits`: see `Row.keep_logits`."""
        if not self.free:
            raise ConfigError(f"the batch is full ({self.max_rows} rows)")
        if not prompt or max_new_tokens < 1 or len(prompt) + max_new_tokens > self.max_len:
            raise ConfigError(f"a prompt of {len(prompt)} tokens with {max_new_tokens} new tokens does not fit "
                              f"a batch row of {self.max_len} positions")
        if constraint is not None and method is None:
            raise ConfigError("a constrained row needs its method (build_method('none') for plain decoding)")
        if method is not None and not method.drafter.drafts and constraint is None:
            method = None
        if method is not None and (not method.drafter.supports_batch or method.verifier.needs_hidden_states):
            raise CapabilityError(f"drafter {method.drafter.name!r} cannot draft for a row of a batch")
        if keep_logits and constraint is not None and constraint.closing is not None:
            raise CapabilityError("a row that closes its output at its budget cannot keep its logits")
        own = len(prompt) if prompt_len is None else prompt_len
        row = Row(list(prompt), max_new_tokens, sampler, stats=DecodeStats(prompt_tokens=own), prompt_len=own,
                  method=method, constraint=constraint, keep_logits=keep_logits)
        if self.prefill_chunk is not None and len(prompt) > self.prefill_chunk:
            self.filling.append(row)  # `step` prefills it; it has no token yet
            return row
        slot = len(self.rows)
        self.cache.lengths[slot] = 0
        view = self.cache.rows(slot, slot + 1)
        out = self.target(torch.tensor([prompt], device=self.target.embed.weight.device), cache=view,
                          logits_slice=slice(-1, None))
        self.cache.set_rows(slot, view)
        self._begin(row, out.logits[0])
        return row

    def _begin(self, row: Row, logits: torch.Tensor) -> None:
        """`row` joins the decoding rows (its prompt is in the next cache row) with its first token,
        picked from its prompt's last (1, V) logits."""
        self.rows.append(row)
        first = self._select(row, logits if row.constraint is None else row.constraint.mask_next(logits))
        method = row.method
        if method is not None:
            method.drafter.prepare(self.target)
            method.verifier.prepare(self.target)
            row.state = DecodeState(self.target, self.cache, list(row.prompt), row.prompt_len, row.sampler,
                                    forward_tokens=torch.tensor(row.prompt[-1:]), forward_logits=logits)
        row._push([first], self.stop_ids)
        if row.keep_logits:
            row.last_logits = logits[-1:].clone()
        if method is not None and row.state is not None:
            method.drafter.start(row.state)
            method.controller.start(row.state)
        row.stats.time_to_first_token = time.perf_counter() - row.started

    def _fill(self) -> Row | None:
        """Prefill the next chunk of the first filling row; the row when that ended its prompt."""
        assert self.prefill_chunk is not None
        row = self.filling[0]
        if self._scratch is None:
            self._scratch = KVCache.for_model(self.target.config, 1, self.max_len, dtype=self.cache.k.dtype,
                                              device=self.cache.k.device, zeroed=False)
        scratch = self._scratch
        if not row.filled:
            scratch.lengths[0] = 0
        chunk = row.prompt[row.filled : row.filled + self.prefill_chunk]
        out = self.target(torch.tensor([chunk], device=self.target.embed.weight.device), cache=scratch,
                          logits_slice=slice(-1, None))
        row.filled += len(chunk)
        if row.filled < len(row.prompt):
            return None
        self.filling.pop(0)
        self.cache.move_row(0, len(self.rows), of=scratch)
        self._begin(row, out.logits[0])
        return row

    @torch.inference_mode()
    def step(self, max_nodes: int | None = None, keep: Keep | None = None) -> list[Row]:
        """One forward for every row: its pending token and, for a speculative row, its draft tree of at
        most `max_nodes` nodes (None: its controller's budget; 0: no drafts this step), cut to the depth
        `keep(row, tree)` returns (None: verify the whole tree; `DraftBudget.keep`). Returns the rows,
        each with this step's tokens in `last`."""
        for row in self.rows:
            row.last, row.last_logits = [], None
        started = self._fill() if self.filling else None
        decoding = [row for row in self.rows if row is not started]
        if not decoding:
            return [] if started is None else [started]
        if any(row.finish is not None for row in decoding):
            raise ValueError("remove the finished rows before the next step")
        n = len(decoding)
        view = self.cache.rows(0, n)
        starts = view.lengths.clone()  # (n,)
        # every row's forward is padded to the widest tree: it must fit the fullest row's room too
        slack = self.max_len - 1 - int(starts.max())
        max_nodes = slack if max_nodes is None else min(max_nodes, slack)
        trees = [self._draft(row, int(start), max_nodes, keep) for row, start in zip(decoding, starts.tolist(), strict=True)]
        width = 1 + max(tree.size for tree in trees)
        self.width = width
        device = self.target.embed.weight.device
        tokens = torch.zeros(n, width, dtype=torch.int64)  # (n, T) pending, tree, padding
        positions = starts[:, None].repeat(1, width)  # (n, T)
        # padding positions are never read: one SDPA per position computes them over their own slot alone
        # (cheapest); ragged_attention over what the pending token sees (a prefix, not a gathered key)
        if self.ragged_verify:
            mask = torch.zeros(n, width, width, dtype=torch.bool)  # (n, T, T)
            mask[:, :, 0] = True
        else:
            mask = torch.eye(width, dtype=torch.bool).repeat(n, 1, 1)  # (n, T, T)
        for i, (row, tree, start) in enumerate(zip(decoding, trees, starts.tolist(), strict=True)):
            t, p, m = tree.verify_inputs(row.new[-1], start)
            size = t.shape[1]
            tokens[i, :size], positions[i, :size], mask[i, :size, :size] = t[0], p[0], m[0]
        ragged = [i for i, row in enumerate(decoding) if row.method is not None] if self.ragged_verify else []
        if ragged:
            self._clean(starts, padded_keys(int(starts.max()) + width))
        # the padding past each row's tree is never read: the forward may skip it (`padded_rows`)
        with batch_invariant(ragged=ragged), padded_rows([tree.size + 1 for tree in trees]):
            out = self.target(tokens.to(device), positions.to(device), view, None if width == 1 else mask.to(device))
        paths = [self._accept(row, tree, out.logits[i], tokens[i]) for i, (row, tree) in enumerate(zip(decoding, trees, strict=True))]
        longest = max(len(path) for path in paths)
        kept = torch.tensor([path + [0] * (longest - len(path)) for path in paths])  # (n, A) forward indices
        view.commit(starts, kept, torch.tensor([len(path) for path in paths]))
        self.cache.set_rows(0, view)
        return list(self.rows)

    def _clean(self, starts: torch.Tensor, keys: int) -> None:
        """Zero the keys and values of the unwritten slots below `keys` of the decoding rows (once per slot)."""
        top = min(keys, self.max_len)
        for i, start in enumerate(starts.tolist()):
            low = max(self._finite[i], start)
            if low < top:
                self.cache.k[:, i, :, low:top] = 0
                self.cache.v[:, i, :, low:top] = 0
            self._finite[i] = max(self._finite[i], top)

    def _draft(self, row: Row, start: int, max_nodes: int | None, keep: Keep | None) -> DraftTree:
        row.drafted = (0, 0)
        if row.method is None or row.state is None:
            return DraftTree.empty()
        room = min(row.budget - len(row.new) - 1, self.max_len - start - 1, row.method.max_tree_nodes)
        budget = max(0, min(row.method.controller.budget(row.state), room, room if max_nodes is None else max_nodes))
        tree = DraftTree.empty() if budget < 1 else row.method.drafter.propose(row.state, budget)
        if tree.size > budget:
            raise RuntimeError(f"drafter proposed {tree.size} nodes with a budget of {budget}")
        if row.constraint is not None:
            tree = row.constraint.shape(tree, budget)
        elif keep is not None and tree.size and not tree.auxiliary:
            proposed = tree.size
            tree = tree.cut(keep(row, tree))
            row.drafted = (proposed, tree.depth)
            return tree
        row.drafted = (tree.size, tree.depth)
        return tree

    def _accept(self, row: Row, tree: DraftTree, logits: torch.Tensor, tokens: torch.Tensor) -> list[int]:
        """Accept `row`'s path from its (T, V) logits rows; returns the forward indices to keep."""
        row.stats.target_forwards += 1
        if row.method is None or row.state is None:
            row._push([self._select(row, logits[:1])], self.stop_ids)
            if row.keep_logits:
                row.last_logits = logits[:1].clone()
            return [0]
        candidates = tree.verified()
        rows = logits[: candidates.size + 1]  # (N+1, V): after the pending token, then after each candidate
        raw = rows.clone() if row.keep_logits else None  # before penalties, masks and the verifier
        if row.sampler.penalties:
            history = TokenHistory(torch.tensor(row.state.tokens), row.prompt_len,
                                   ((),) + tuple(candidates.path_tokens()))
            rows = row.sampler.penalize(rows, history)
        if row.constraint is not None:
            rows = row.constraint.mask(rows)
        result = row.method.verifier.accept(candidates, rows, row.sampler, {})
        state = row.state
        state.forward_tokens, state.forward_logits, state.forward_tree = tokens[: tree.size + 1], logits[: tree.size + 1], tree
        row._push(result.tokens, self.stop_ids)
        row.stats.accepted_per_step.append(len(result.path))
        row.stats.proposed_per_step.append(result.proposed)
        if row.finish is None:  # a stop token may end the row inside the path
            row.method.drafter.observe(state, result)
            row.method.controller.observe(result)
        kept = [0] + [node + 1 for node in result.path]  # the forward rows the tokens were picked from
        if raw is not None:
            row.last_logits = raw[kept[: len(row.last)]]
        return kept

    def remove(self, row: Row) -> None:
        """Free `row`'s cache row (the last row moves into it), or drop it while its prompt is prefilled."""
        if row in self.filling:
            self.filling.remove(row)
            row.filled = 0
            return
        slot = self.rows.index(row)
        last = len(self.rows) - 1
        if slot != last:
            self.cache.move_row(last, slot)
            self.rows[slot] = self.rows[last]
        self.rows.pop()
        self.cache.lengths[last] = 0

    @staticmethod
    def _select(row: Row, logits: torch.Tensor) -> int:
        """Next token of `row` from its (1, V) logits, penalised with the row's own context."""
        if row.sampler.penalties:
            logits = row.sampler.penalize(logits, TokenHistory.single(row.prompt + row.new, row.prompt_len))
        return int(row.sampler.select(logits)[0])


Keep = Callable[[Row, DraftTree], int]
"""How deep a row's proposed tree is verified this step (`ContinuousBatch.step`'s `keep`)."""


class DraftBudget:
    """Speculation under load: whether a batch's next step drafts, and how deep each row's tree is
    verified, from the step times and acceptance measured on it.

    On or off: a speculative step of `B` rows verifies their draft trees too; it pays while the
    forward's cost grows slower than the tokens it gives. Where that stops depends on the machine and
    the drafters' acceptance, so this measures both as the batch runs: per batch-size bucket (1, 2, 3-4,
    5-8, ...) and mode (drafting or not), moving averages of the step's seconds and of the tokens it
    gave, and it picks the mode with more tokens per second. A verify row costs more, relative to the
    tokens it can add, the more rows a batch holds, so drafting is tried at one row, and at a larger
    bucket only once it won at the bucket half that size (a drafting step of many rows is costly to
    try); every `explore_every * bucket` steps in a bucket the losing (or untried) mode runs once, so a
    change in the traffic (another request's acceptance) is noticed.

    How deep (`keep`): a drafting step verifies each row's tree down to the depth where one more level
    would lower the step's tokens per second. Per bucket, a least-squares line of the step's seconds
    against its positions per row (decayed, `memory` steps) gives the cost of a level; per drafter and
    proposed tree size, the share of verified trees accepted to each depth gives what a level adds (a
    level is worth its cost while that share exceeds the cost times the step's tokens per second). A
    level never verified counts as accepted half the time, so it is tried until measured. Prompt
    lookup's proposal size follows its match length (4, 7 or 10 tokens after 1, 2 or 3 matched), and
    on Spec-Bench a 1-token match's first token is accepted 14 % of the time, its second 5 %: one level
    is verified, against six of the ten after a 3-token match (91 %, 82 %, 82 %, 80 %, 50 %, 38 %, 12 %, 0 %;
    at +7 % of a step per position).

    Example: at 1 row a drafting step takes 24 ms for 1.5 tokens (63 tok/s) against 20 ms for 1 token
    plain (50 tok/s): draft; at 16 rows 260 ms for 19 tokens (73 tok/s) against 48 ms for 16 (333
    tok/s): do not, and do not try at 32 rows.
    """

    def __init__(self, explore_every: int = 16, smoothing: float = 0.2, memory: int = 200) -> None:
        self.explore_every = explore_every
        self.smoothing = smoothing
        self.memory = memory
        self.seconds: dict[tuple[int, bool], float] = {}
        self.tokens: dict[tuple[int, bool], float] = {}
        self.steps: dict[int, int] = {}
        self._costs: dict[int, LevelCost] = {}
        """Bucket → its steps' seconds against their positions per row."""
        self.uncut: set[str] = set()
        """Drafters whose trees `keep` cannot cut (auxiliary nodes, e.g. lookahead's window)."""
        self._accepted = LevelAcceptance(memory)

    @staticmethod
    def bucket(rows: int) -> int:
        """The batch-size bucket of `rows`: the smallest power of two >= rows."""
        return 1 << max(0, rows - 1).bit_length()

    def rate(self, rows: int, drafting: bool) -> float | None:
        """Measured tokens per second of a step of `rows`' bucket in this mode (None: not measured)."""
        key = (self.bucket(rows), drafting)
        return self.tokens[key] / self.seconds[key] if key in self.seconds and self.seconds[key] > 0 else None

    def _won(self, bucket: int) -> bool:
        """Drafting was measured faster than plain steps at this bucket."""
        on, off = self.rate(bucket, True), self.rate(bucket, False)
        return on is not None and off is not None and on >= off

    def choose(self, rows: int, can_draft: bool, cut: bool = False) -> bool:
        """Whether the next step of `rows` rows drafts (`can_draft`: some row has a drafter). `cut`: the
        step's trees are cut by `keep`, and none of their drafters' trees was found uncuttable: one row
        then drafts at every step (its draft cut down to the levels that pay, to nothing if none does,
        costs at most a plain step), without the comparison of modes, whose per-step noise on a loaded
        machine exceeds the gain it would detect."""
        if not can_draft:
            return False
        bucket = self.bucket(rows)
        if bucket == 1 and cut:
            return True
        self.steps[bucket] = self.steps.get(bucket, 0) + 1
        explore = self.steps[bucket] % (self.explore_every * bucket) == 0  # a costlier try, made more rarely
        on, off = self.rate(rows, True), self.rate(rows, False)
        if on is None:  # tried at one row, or where it won at half as many (one row, cut: taken as won)
            return bucket == 1 or self._won(bucket // 2) or (bucket == 2 and cut) or explore
        if off is None:
            return False
        best = on >= off
        return (not best) if explore else best

    def observe(self, rows: int, drafting: bool, tokens: int, seconds: float, width: int | None = None) -> None:
        """A step of `rows` rows (drafting or not) gave `tokens` in `seconds`; `width`: its positions per row."""
        key = (self.bucket(rows), drafting)
        a = self.smoothing
        self.seconds[key] = seconds if key not in self.seconds else (1 - a) * self.seconds[key] + a * seconds
        self.tokens[key] = tokens if key not in self.tokens else (1 - a) * self.tokens[key] + a * tokens
        if width is not None:
            self._costs.setdefault(self.bucket(rows), LevelCost(self.memory)).observe(width, seconds)

    def cost(self, rows: int) -> tuple[float, float] | None:
        """(seconds of a one-position step, seconds per further position per row) at `rows`' bucket, from
        the measured steps (None: not measured at two widths yet)."""
        fit = self._costs.get(self.bucket(rows))
        return None if fit is None else fit.cost()

    def accepted(self, drafter: str, proposed: int, depth: int) -> float:
        """Measured share of `drafter`'s trees of `proposed` nodes, verified to `depth` or deeper, that
        were accepted to `depth` (levels not measured: 1/2)."""
        return self._accepted.accepted(drafter, proposed, depth)

    def keep(self, rows: int, row: Row, tree: DraftTree) -> int:
        """How deep to verify `row`'s proposed `tree` in a drafting step of `rows` rows."""
        cost = self.cost(rows)
        if cost is None or row.method is None:
            return tree.depth
        name = row.method.drafter.name
        return keep_depth(tree, cost, lambda depth: self.accepted(name, tree.size, depth), rows)

    def learn(self, row: Row) -> None:
        """Count `row`'s last step: its tree verified to `row.drafted` depth, accepted to its path's length."""
        proposed, depth = row.drafted
        if row.method is None or not proposed or not depth or not row.stats.accepted_per_step:
            return
        if row.state is not None and row.state.forward_tree is not None and row.state.forward_tree.auxiliary:
            self.uncut.add(row.method.drafter.name)
            return
        self._accepted.learn(row.method.drafter.name, proposed, depth, row.stats.accepted_per_step[-1])
