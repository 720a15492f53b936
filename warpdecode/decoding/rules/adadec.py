"""AdaDec (He et al. 2025, "Towards Better Code Generation: Adaptive Decoding with Uncertainty
Guidance"): greedy decoding that pauses where the target is uncertain and reranks its top candidates
by lookahead.

Each step computes the Shannon entropy H (nats) of the processed next-token distribution p
(penalties and the caller's hooks applied). Where H <= `threshold` it takes p's argmax, as greedy
decoding does. Where H > `threshold` it pauses: each of the `top_k` most likely tokens v gets a greedy
rollout of `lookahead` tokens under the target, and the step takes

    argmax_v  (log p(v) + sum_i log q(r_i | ..., v, r_<i)) / (1 + |r|)

the mean log-probability of the candidate and its rollout r (q: the target's own distribution; a
rollout ends early at a stop token, which it counts). Only the chosen token is emitted; the next step
decides again. The k rollouts run as one batch of k cache rows holding the committed prefix, so a
pause costs `lookahead` forwards of k rows; the chosen candidate's keys and values are copied from its
row, and the logits after it come from the rollout's first forward.

The threshold is learned per model (the paper's: where a logistic fit of "greedy's top-1 is wrong"
on entropy crosses 0.5), by `warpdecode fit --config configs/controls/adadec.yaml`, which writes a
package (kind `adadec`) naming the model; `adadec:path=DIR` runs it, `adadec:threshold=H` sets one.
"""

from __future__ import annotations

import time
from typing import ClassVar

import torch
from torch import Tensor

from warpdecode.decoding.outputs import DecodeStats
from warpdecode.decoding.processors import TokenHistory
from warpdecode.decoding.registry import register
from warpdecode.decoding.rules.protocols import Decoded, DecodingRule, Emitter
from warpdecode.decoding.sampler import Sampler
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.cache import KVCache
from warpdecode.models.drafter_package import DrafterPackage

KIND = "adadec"


def entropy(logits: Tensor) -> Tensor:
    """Shannon entropy in nats of softmax(logits) per row, (N,) float32, from (N, V) logits (-inf allowed)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return -torch.where(logprobs > float("-inf"), logprobs.exp() * logprobs, 0.0).sum(-1)


def rollout_scores(candidate_logprobs: Tensor, rollout_logprobs: Tensor, stopped: Tensor) -> Tensor:
    """Mean log-probability of each candidate and its rollout, up to and including a stop token.

    Args:
        candidate_logprobs: (K,) log p(v) of each candidate.
        rollout_logprobs: (K, R) log q of each rollout token.
        stopped: (K, R + 1) bool, whether the candidate (column 0) or rollout token r (column r + 1) is a
            stop token; the tokens after the first stop token are not counted.
    Returns:
        (K,) float32.
    """
    counted = (stopped.long().cumsum(-1) - stopped.long()) == 0  # (K, R + 1): up to the first stop, inclusive
    values = torch.cat([candidate_logprobs[:, None], rollout_logprobs], dim=1).float()
    return (values * counted).sum(-1) / counted.sum(-1)


def load_threshold(path: str, target: Backbone | None = None) -> float:
    """The entropy threshold of an `adadec` package (checked to be fit for `target` when given)."""
    package = DrafterPackage.load(path, KIND)
    if target is not None:
        package.check_target(target)
    return float(package.config["threshold"])


@register("rule", "adadec")
class AdaDec(DecodingRule):
    needs_training: ClassVar[bool] = True

    def __init__(self, path: str | None = None, threshold: float | None = None, top_k: int = 3,
                 lookahead: int = 5) -> None:
        """Args:
        path: an `adadec` package (`warpdecode fit --config configs/controls/adadec.yaml`): its threshold,
            for the model it was fit on.
        threshold: entropy (nats) above which a step pauses to rerank (default: the package's; `inf`: never).
        top_k: candidates reranked at a pause.
        lookahead: greedy tokens each candidate's rollout runs.
        """
        if path is None and threshold is None:
            raise ConfigError("adadec needs a learned threshold: adadec:path=DIR (warpdecode fit --config "
                              "configs/controls/adadec.yaml) or adadec:threshold=NATS")
        if threshold is not None and not threshold >= 0:
            raise ConfigError(f"adadec threshold must be >= 0 nats (inf: never pause), got {threshold}")
        if top_k < 2 or lookahead < 1:
            raise ConfigError(f"adadec needs top_k >= 2 candidates and lookahead >= 1 tokens, got {top_k} and {lookahead}")
        self.path = path
        self.threshold = threshold if threshold is not None else load_threshold(str(path))
        self.top_k, self.lookahead = top_k, lookahead

    @torch.inference_mode()
    def decode(self, target: Backbone, prompt_ids: list[int], sampler: Sampler, emit: Emitter) -> Decoded:
        if self.path is not None:
            load_threshold(self.path, target)  # CheckpointError when fit for another model
        device = target.embed.weight.device
        target.pack_for_cpu_inference()
        k = min(self.top_k, target.config.vocab_size)
        size = min(len(prompt_ids) + emit.max_new_tokens + self.lookahead + 1, target.config.max_seq_len)
        cache = target.new_cache(1, size)
        rows: KVCache | None = None  # the k rollout rows, made at the first pause
        synced = 0  # positions of `cache` already copied into every rollout row
        stops = torch.tensor(sorted(emit.stop_ids), dtype=torch.int64, device=device)
        stats = DecodeStats(prompt_tokens=len(prompt_ids))
        start = time.perf_counter()
        logits = target(torch.tensor([prompt_ids], device=device), cache=cache, logits_slice=slice(-1, None)).logits[:, -1]
        tokens = list(prompt_ids)
        while True:
            processed = sampler.penalize(logits, TokenHistory.single(tokens, len(prompt_ids)))  # (1, V)
            n = int(cache.lengths[0])
            steps = min(self.lookahead, cache.max_len - n)  # a rollout writes slots n .. n + steps - 1
            after: Tensor | None = None
            if float(entropy(processed)[0]) > self.threshold and steps > 0:
                if rows is None:
                    rows = target.new_cache(k, cache.max_len)
                synced = _share_prefix(rows, cache, synced)
                logprobs, ids = torch.log_softmax(processed.float(), dim=-1)[0].topk(k)  # (K,), (K,)
                chosen, after = self._rerank(target, rows, ids, logprobs, steps, stops)
                token = int(ids[chosen])
                _take_position(cache, rows, chosen, n)
                stats.target_forwards += steps
            else:
                token = int(processed[0].argmax())
            tokens.append(token)
            if not stats.time_to_first_token:
                stats.time_to_first_token = time.perf_counter() - start
            if not emit.push(token):
                break
            if after is None:
                after = target(torch.tensor([[token]], device=device), cache=cache).logits[0, -1]
                stats.target_forwards += 1
            logits = after[None]
            stats.accepted_per_step.append(0)  # one token per decision: τ = 1, as plain decoding
            stats.proposed_per_step.append(0)
        return emit.decoded(stats, start)

    def _rerank(self, target: Backbone, rows: KVCache, ids: Tensor, logprobs: Tensor, steps: int,
                stops: Tensor) -> tuple[int, Tensor]:
        """Roll each candidate out `steps` greedy tokens in its own row (rows hold the prefix): the chosen
        candidate's index and the (V,) logits after it."""
        step = ids[:, None]  # (K, 1)
        stopped, rollout, first = [torch.isin(ids, stops)], [], None
        for _ in range(steps):
            logits = target(step, cache=rows).logits[:, -1].float()  # (K, V)
            first = logits if first is None else first
            best, step = torch.log_softmax(logits, dim=-1).max(dim=-1)  # (K,), (K,)
            rollout.append(best)
            stopped.append(torch.isin(step, stops))
            step = step[:, None]
        scores = rollout_scores(logprobs, torch.stack(rollout, dim=1), torch.stack(stopped, dim=1))
        chosen = int(scores.argmax())
        assert first is not None
        return chosen, first[chosen]


def _share_prefix(rows: KVCache, cache: KVCache, synced: int) -> int:
    """Give every rollout row the committed prefix of one-row `cache`: copy the positions it gained
    since the last pause (`synced` on) and set the rows' lengths; returns the new prefix length."""
    n = int(cache.lengths[0])
    rows.k[:, :, :, synced:n] = cache.k[:, 0:1, :, synced:n]  # (L, 1, Hkv, n - synced, D) broadcast over K
    rows.v[:, :, :, synced:n] = cache.v[:, 0:1, :, synced:n]
    rows.lengths = torch.full((rows.batch,), n, dtype=torch.int64)
    return n


def _take_position(cache: KVCache, rows: KVCache, row: int, n: int) -> None:
    """Append slot `n` of rollout row `row` (the chosen candidate's keys and values) to one-row `cache`."""
    cache.k[:, 0, :, n] = rows.k[:, row, :, n]
    cache.v[:, 0, :, n] = rows.v[:, row, :, n]
    cache.lengths = torch.tensor([n + 1], dtype=torch.int64)

