"""Beam search with Hugging Face's rules: the beams are rows of one batched KV cache, reordered by parent.

Each step scores every beam's continuations by accumulated processed log-probability, keeps the best
`max(2, 1 + #stop ids) * num_beams` of them, moves those that end (a stop token, or the token budget)
among the top `num_beams` into the finished set under the length penalty, and continues the best
`num_beams` open ones. It is Hugging Face transformers' vectorised `_beam_search` (its 2025 rewrite, in
5.x) step for step, `early_stopping` (True / False / "never") and its stopping heuristic included, so
outputs and `sequences_scores` equal `generate(num_beams=...)`'s on the same weights (tests/decoding/search).
With sampling it is Hugging Face's beam sampling: the kept continuations are drawn instead of taken.

The cache holds one row per beam: after each step, row i takes its parent's generated positions
(`KVCache.reorder_rows`, an index select of the rows that change, never the shared prompt).
"""

from __future__ import annotations

import math
import time
from typing import Literal

import torch
from torch import Tensor

from warpdecode.decoding.outputs import Candidate, DecodeStats, FinishReason
from warpdecode.decoding.registry import register
from warpdecode.decoding.sampler import Sampler
from warpdecode.decoding.search.protocols import SearchResult, SearchStrategy
from warpdecode.decoding.search.rows import MAX_ROWS, prefill_rows, process_logprobs, with_text
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.tokenizer import Tokenizer

EarlyStopping = bool | Literal["never"]
NEG = -1.0e9  # Hugging Face's "impossible" score: added, never -inf, so ranks among masked entries stay defined


def check_beam_options(num_beams: int, num_return_sequences: int, length_penalty: float,
                       early_stopping: EarlyStopping, no_repeat_ngram_size: int) -> None:
    """ConfigError naming the flag for an option Hugging Face would refuse too."""
    if not 1 <= num_beams <= MAX_ROWS:
        raise ConfigError(f"--num-beams must be in [1, {MAX_ROWS}], got {num_beams}")
    if not 1 <= num_return_sequences <= num_beams:
        raise ConfigError(f"--num-return-sequences must be in [1, --num-beams={num_beams}], got {num_return_sequences}")
    if early_stopping not in (True, False, "never"):
        raise ConfigError(f"--early-stopping must be true, false or never, got {early_stopping!r}")
    if no_repeat_ngram_size < 0:
        raise ConfigError(f"--no-repeat-ngram-size must be >= 0, got {no_repeat_ngram_size}")
    if not math.isfinite(length_penalty):
        raise ConfigError(f"--length-penalty must be a finite number, got {length_penalty}")


def length_norm(length: int, alpha: float, rule: Literal["hf", "gnmt"]) -> float:
    """The denominator of a finished sequence's score: `length ** alpha` (Hugging Face), or GNMT's
    `((5 + length) / 6) ** alpha` (Wu et al. 2016, eq. 14), both as Python floats (as HF computes them)."""
    try:
        return float(length**alpha) if rule == "hf" else ((5 + length) / 6) ** alpha
    except OverflowError:  # a huge penalty: every long sequence scores -0.0
        return math.inf


@register("search", "beam")
class BeamSearch(SearchStrategy):
    composes_with_speculation = False  # beams could be verified with one batched tree forward: not built yet

    def __init__(self, num_beams: int = 4, num_return_sequences: int = 1, length_penalty: float = 1.0,
                 early_stopping: EarlyStopping = False, no_repeat_ngram_size: int = 0,
                 length_normalization: Literal["hf", "gnmt"] = "hf") -> None:
        check_beam_options(num_beams, num_return_sequences, length_penalty, early_stopping, no_repeat_ngram_size)
        if length_normalization not in ("hf", "gnmt"):
            raise ConfigError(f"length_normalization must be hf or gnmt, got {length_normalization!r}")
        self.num_beams, self.num_return_sequences = num_beams, num_return_sequences
        self.length_penalty, self.early_stopping = length_penalty, early_stopping
        self.no_repeat_ngram_size, self.length_normalization = no_repeat_ngram_size, length_normalization

    @staticmethod
    def _select(logprobs: Tensor, running: Tensor, keep: int, sampler: Sampler) -> tuple[Tensor, Tensor]:
        """The `keep` continuations that go on: the best by accumulated log-probability, or with sampling
        (beam sampling) `keep` drawn without replacement from the softmax of the accumulated log-probabilities
        after the sampler's filters (applied to the log-probabilities, as Hugging Face does), best first.

        Args:
            logprobs: (K, V) float32 processed log-probabilities; running: (K,) the beams' scores.
        Returns:
            (keep,) float32 accumulated scores and (keep,) int64 indices into the flattened (K * V).
        """
        if not sampler.config.do_sample:
            return (logprobs + running[:, None]).view(-1).topk(keep)
        for warp in sampler.warpers:
            logprobs = warp(logprobs)
        accumulated = (logprobs + running[:, None]).view(1, -1)  # (1, K * V)
        index = torch.multinomial(torch.softmax(accumulated, -1), keep, generator=sampler.generator)  # (1, keep)
        scores, order = accumulated.gather(1, index).sort(dim=-1, descending=True)
        return scores[0], index.gather(1, order)[0]

    def norm(self, length: int) -> float:
        return length_norm(length, self.length_penalty, self.length_normalization)

    @torch.inference_mode()
    def search(self, model: Backbone, tokenizer: Tokenizer | None, prompt: list[int], sampler: Sampler, *,
               max_new_tokens: int, stop_ids: set[int]) -> SearchResult:
        K, P, budget = self.num_beams, len(prompt), max_new_tokens
        keep = max(2, 1 + len(stop_ids)) * K  # candidates kept per step, so that K open ones remain
        top_mask = torch.arange(keep) < K  # only the top K candidates may finish (HF's top_num_beam_mask)
        stops = torch.tensor(sorted(stop_ids), dtype=torch.int64)
        start = time.perf_counter()
        stats = DecodeStats(prompt_tokens=P)
        cache, first = prefill_rows(model, prompt, K, P + budget)
        logits = first[None].expand(K, -1)  # (K, V) every beam follows the prompt
        stats.time_to_first_token = time.perf_counter() - start

        seqs = torch.tensor(prompt, dtype=torch.int64).repeat(K, 1)  # (K, P + step) running beams
        running = torch.full((K,), NEG)  # (K,) accumulated log-probs; only beam 0 is live at first
        running[0] = 0.0
        done_seqs = seqs.clone()  # (K, P + ...) finished sequences, best first, padded
        done_scores = torch.full((K,), NEG)  # (K,) length-penalised scores of the finished set
        done_sums = torch.zeros(K)  # (K,) their summed processed log-probs
        done_len = torch.zeros(K, dtype=torch.int64)  # (K,) generated length of each finished sequence
        is_finished = torch.zeros(K, dtype=torch.bool)  # (K,) slot holds a real finished sequence
        improvable = True  # HF's is_early_stop_heuristic_unsatisfied, for our one prompt
        step = 0
        while True:
            logprobs = torch.log_softmax(logits.float(), dim=-1).cpu()  # (K, V)
            logprobs = process_logprobs(logprobs, sampler, seqs, P, self.no_repeat_ngram_size)
            V = logprobs.shape[1]
            scores, index = self._select(logprobs, running, keep, sampler)  # (keep,) best first
            parent, token = index // V, index % V  # (keep,)
            cand = torch.cat([seqs[parent], token[:, None]], dim=1)  # (keep, P + step + 1)
            hits = torch.isin(token, stops) | (step + 1 >= budget)  # (keep,) the candidate ends here
            stats.search_tokens += K

            # e. the best K candidates that go on
            open_scores = scores + hits.float() * NEG
            nxt = open_scores.topk(K).indices  # (K,)
            seqs, running, parents = cand[nxt], open_scores[nxt], parent[nxt]

            # f. finished candidates among the top K enter the finished set if they beat it
            just_done = hits & top_mask
            final = scores / self.norm(step + 1)
            if self.early_stopping is True and bool(is_finished.all()):
                final = final + NEG
            if not improvable:
                final = final + NEG
            final = final + (~just_done).float() * NEG
            width = P + step + 1
            padded = torch.cat([done_seqs, done_seqs.new_zeros(K, width - done_seqs.shape[1])], dim=1)
            merged_scores = torch.cat([done_scores, final])
            best = merged_scores.topk(K).indices
            done_seqs = torch.cat([padded, cand])[best]
            done_scores = merged_scores[best]
            done_sums = torch.cat([done_sums, scores])[best]
            done_len = torch.cat([done_len, torch.full((keep,), step + 1)])[best]
            is_finished = torch.cat([is_finished, just_done])[best]

            # g. stop when no open beam can still enter the finished set
            step += 1
            if self.early_stopping == "never" and self.length_penalty > 0.0:
                hypothetical = budget
            else:
                hypothetical = step
            best_possible = running[0] / self.norm(hypothetical)
            worst_done = torch.where(is_finished, done_scores.min(), torch.tensor(NEG))
            improvable = improvable and bool((best_possible > worst_done).any())
            open_beam = not (bool(is_finished.all()) and self.early_stopping is True)
            if not (improvable and open_beam and not bool(hits.all())):
                break
            cache.reorder_rows(parents.tolist(), begin=P)
            out = model(seqs[:, -1:].to(model.embed.weight.device), cache=cache)
            logits = out.logits[:, -1]
            stats.target_forwards += 1

        candidates = []
        for i in range(self.num_return_sequences):
            tokens = done_seqs[i, P : P + int(done_len[i])].tolist()
            finish: FinishReason = "eos" if tokens and tokens[-1] in stop_ids else "length"
            candidates.append(Candidate(tokens, finish, score=float(done_scores[i]), logprob=float(done_sums[i])))
        stats.new_tokens = len(candidates[0].token_ids)
        stats.seconds = time.perf_counter() - start
        stats.target_seconds = stats.seconds - stats.time_to_first_token
        return SearchResult(with_text(candidates, tokenizer), stats)
