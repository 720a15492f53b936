"""The target's verify latency on this machine, and the draft-tree size it makes best.

A verify forward of `r` rows (the pending token plus `r - 1` draft nodes) costs little more than one
row while the weights, not the arithmetic, bound the step, and then grows; where it starts to grow
depends on the machine (a CPU's cores, a GPU's tensor cores). `verify_seconds` measures the curve
once, outside any timed decode (the curve made non-decreasing); `choose_nodes` picks the tree size that maximises the expected
tokens per second of a step, τ(n) / t(n + 1), from the drafter's validation curve τ(n) (the
simulated acceptance length of its stored tree cut to n nodes). The drafter's own cost per step is
left out: it is small beside the target's for the head drafters and grows with depth, not nodes.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch

from warpdecode.models.backbone import Backbone
from warpdecode.models.cache import KVCache


def choose_nodes(tau_by_nodes: Sequence[float], seconds_by_rows: Sequence[float]) -> int:
    """The node budget n in 1..len(tau_by_nodes) maximising tau_by_nodes[n - 1] / seconds_by_rows[n]
    (ties: the smaller tree).

    Example: τ = [1.5, 1.8, 1.9], t = [1.0, 1.0, 1.1, 1.5] (1 to 4 rows) → 2 (1.8 / 1.1 beats
    1.5 / 1.0 and 1.9 / 1.5).

    Args:
        tau_by_nodes: τ(n), the expected tokens per step of a tree of n nodes, n = 1, 2, ...
        seconds_by_rows: t(r), the verify forward's seconds with r rows, r = 1, 2, ...; one longer than τ.
    """
    if not tau_by_nodes or len(seconds_by_rows) < len(tau_by_nodes) + 1:
        raise ValueError(f"need τ for n >= 1 nodes and latencies for 1..n + 1 rows; got {len(tau_by_nodes)} "
                         f"and {len(seconds_by_rows)}")
    return max(range(1, len(tau_by_nodes) + 1), key=lambda n: (tau_by_nodes[n - 1] / seconds_by_rows[n], -n))


def non_decreasing(values: Sequence[float]) -> list[float]:
    """The least-squares non-decreasing fit of `values` (pool adjacent violators): a verify forward
    never gets cheaper with more rows, so a dip in a measured curve is noise, and one noisy size must
    not decide the tree. Example: [1.0, 1.3, 1.1, 1.4] → [1.0, 1.2, 1.2, 1.4]."""
    blocks: list[tuple[float, int]] = []  # (mean, count) of pooled runs
    for value in values:
        blocks.append((value, 1))
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, n1), (m2, n2) = blocks.pop(-2), blocks.pop()
            blocks.append(((m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2))
    return [mean for mean, count in blocks for _ in range(count)]


@torch.inference_mode()
def verify_seconds(target: Backbone, max_rows: int, *, context: int = 256, repeats: int = 5) -> list[float]:
    """Seconds of a forward of 1..`max_rows` new tokens after `context` cached ones: per size the
    median of `repeats` runs after one warm-up, made non-decreasing (`non_decreasing`).

    Each size runs back to back, as a decode repeats its step: measured with the sizes interleaved
    instead, one row cost 15.5 ms against 19 ms back to back on the default model (2-core CPU), while
    real plain steps cost 18–20 ms. Costs one prefill of `context` tokens and
    `(repeats + 1) * max_rows` short forwards. Returns `max_rows` values, index r - 1 for r rows.
    """
    if max_rows < 1 or repeats < 1:
        raise ValueError(f"need max_rows >= 1 and repeats >= 1, got {max_rows}, {repeats}")
    device = target.embed.weight.device
    context = max(1, min(context, target.config.max_seq_len - max_rows))
    cache = KVCache.for_model(target.config, 1, context + max_rows, dtype=target.embed.weight.dtype, device=device)
    ids = torch.arange(context + max_rows, device=device)[None] % target.config.vocab_size  # (1, context + max_rows)
    target(ids[:, :context], cache=cache, logits_slice=slice(-1, None))
    seconds = []
    for rows in range(1, max_rows + 1):
        runs = []
        for _ in range(repeats + 1):
            cache.truncate(context)
            start = time.perf_counter()
            target(ids[:, context : context + rows], cache=cache)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            runs.append(time.perf_counter() - start)
        seconds.append(statistics.median(runs[1:]))
    return non_decreasing(seconds)
