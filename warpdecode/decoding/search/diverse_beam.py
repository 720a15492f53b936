"""Diverse beam search (Vijayakumar et al. 2018): the beams split into groups that choose in turn, each
penalised for the tokens earlier groups chose at the same step (Hamming diversity).

With `num_beams` beams in `num_beam_groups` groups, a group's log-probabilities are lowered by
`diversity_penalty` times the number of earlier groups' beams that chose the same token at this step.

The rules are Hugging Face's group beam search, which transformers 5 moved out of its core into the
hub repository `transformers-community/group-beam-search` (not loadable offline): per group a beam
scorer of `num_beams / num_beam_groups` hypotheses (`BeamHypotheses`: a finished sequence enters when
it beats the worst kept one; `is_done` by `early_stopping`), the Hamming term applied after the other
processors, and the best `num_return_sequences` of all groups' hypotheses returned. A group that is
done keeps running on pad token 0 with score 0, and those tokens count in later groups' Hamming
term, as there. Other diversity terms fit `diversity` (a function of the earlier groups' tokens).

All beams are rows of one batched KV cache (one forward per step for every group), reordered by
parent as in `beam.py`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from warpdecode.decoding.outputs import Candidate, DecodeStats, FinishReason
from warpdecode.decoding.registry import register
from warpdecode.decoding.sampler import Sampler
from warpdecode.decoding.search.beam import EarlyStopping, check_beam_options, length_norm
from warpdecode.decoding.search.protocols import SearchResult, SearchStrategy
from warpdecode.decoding.search.rows import prefill_rows, process_logprobs, with_text
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.tokenizer import Tokenizer

PAD = 0  # the token a done group's rows carry (Hugging Face's pad_token_id=0 in our peers)


def hamming(previous: Tensor, vocab_size: int, penalty: float) -> Tensor:
    """(V,) float32 to subtract from a group's log-probabilities: `penalty` times how often the earlier
    groups chose each token at this step. previous: (G_before * group_size,) int64 their tokens."""
    return penalty * torch.bincount(previous, minlength=vocab_size).float()


@dataclass
class _Hypotheses:
    """One group's finished sequences (Hugging Face's `BeamHypotheses`, for one prompt)."""

    size: int
    length_penalty: float
    early_stopping: EarlyStopping
    budget: int
    beams: list[tuple[float, list[int], FinishReason]] = field(default_factory=list)
    worst: float = 1e9

    def add(self, tokens: list[int], logprob_sum: float, finish: FinishReason) -> None:
        score = logprob_sum / length_norm(len(tokens), self.length_penalty, "hf")
        if len(self.beams) < self.size or score > self.worst:
            self.beams.append((score, tokens, finish))
            if len(self.beams) > self.size:
                ranked = sorted((s, i) for i, (s, _, _) in enumerate(self.beams))
                del self.beams[ranked[0][1]]
                self.worst = ranked[1][0]
            else:
                self.worst = min(score, self.worst)

    def is_done(self, best_sum: float, length: int) -> bool:
        if len(self.beams) < self.size:
            return False
        if self.early_stopping is True:
            return True
        if self.early_stopping == "never" and self.length_penalty > 0.0:
            length = self.budget
        return self.worst >= best_sum / length_norm(length, self.length_penalty, "hf")


@register("search", "diverse_beam")
class DiverseBeamSearch(SearchStrategy):
    composes_with_speculation = False  # as beam search: the groups' beams could share one tree forward

    def __init__(self, num_beams: int = 4, num_beam_groups: int = 2, diversity_penalty: float = 1.0,
                 num_return_sequences: int = 1, length_penalty: float = 1.0, early_stopping: EarlyStopping = False,
                 no_repeat_ngram_size: int = 0) -> None:
        check_beam_options(num_beams, num_return_sequences, length_penalty, early_stopping, no_repeat_ngram_size)
        if num_beam_groups < 2 or num_beams % num_beam_groups:
            raise ConfigError(f"--num-beam-groups must be >= 2 and divide --num-beams={num_beams}, got {num_beam_groups}")
        if not 0.0 < diversity_penalty < math.inf:
            raise ConfigError(f"--diversity-penalty must be > 0 with --num-beam-groups (else the groups are "
                              f"identical), got {diversity_penalty}")
        self.num_beams, self.num_beam_groups, self.diversity_penalty = num_beams, num_beam_groups, diversity_penalty
        self.num_return_sequences, self.length_penalty = num_return_sequences, length_penalty
        self.early_stopping, self.no_repeat_ngram_size = early_stopping, no_repeat_ngram_size
        self.diversity: Callable[[Tensor, int, float], Tensor] = hamming

    @torch.inference_mode()
    def search(self, model: Backbone, tokenizer: Tokenizer | None, prompt: list[int], sampler: Sampler, *,
               max_new_tokens: int, stop_ids: set[int]) -> SearchResult:
        if sampler.config.do_sample:
            raise CapabilityError("diverse beam search is deterministic: it takes no sampling")
        K, G, P, budget = self.num_beams, self.num_beam_groups, len(prompt), max_new_tokens
        size = K // G
        keep = max(2, 1 + len(stop_ids)) * size
        start = time.perf_counter()
        stats = DecodeStats(prompt_tokens=P)
        cache, first = prefill_rows(model, prompt, K, P + budget)
        logits = first[None].expand(K, -1)  # (K, V)
        stats.time_to_first_token = time.perf_counter() - start
        seqs = torch.tensor(prompt, dtype=torch.int64).repeat(K, 1)  # (K, P + step)
        scores = torch.full((K,), -1e9)  # (K,) accumulated log-probs; the first beam of each group is live
        scores[::size] = 0.0
        groups = [_Hypotheses(size, self.length_penalty, self.early_stopping, budget) for _ in range(G)]
        done = [False] * G
        step = 0
        while True:
            logprobs = torch.log_softmax(logits.float(), dim=-1).cpu()  # (K, V)
            current = torch.zeros(K, dtype=torch.int64)  # (K,) this step's token of each row
            parents = torch.zeros(K, dtype=torch.int64)  # (K,) the row each row continues
            new_seqs = seqs.clone()
            for g in range(G):
                rows = slice(g * size, (g + 1) * size)
                group = process_logprobs(logprobs[rows], sampler, seqs[rows], P, self.no_repeat_ngram_size)
                if g:
                    group = group - self.diversity(current[: g * size], group.shape[1], self.diversity_penalty)
                V = group.shape[1]
                top, index = (group + scores[rows, None]).view(-1).topk(keep)  # (keep,)
                beam, token, beam_scores = self._choose(groups[g], done[g], top, index // V, index % V, seqs[rows, P:], stop_ids)
                done[g] = done[g] or groups[g].is_done(float(top.max()), step + 1)
                scores[rows] = beam_scores
                parents[rows] = g * size + beam
                current[rows] = token
                new_seqs[rows] = seqs[rows][beam]
            seqs = torch.cat([new_seqs, current[:, None]], dim=1)
            stats.search_tokens += K
            step += 1
            if all(done) or step >= budget:
                break
            cache.reorder_rows(parents.tolist(), begin=P)
            logits = model(current[:, None].to(model.embed.weight.device), cache=cache).logits[:, -1]
            stats.target_forwards += 1

        for g in range(G):  # open beams of unfinished groups compete as they are
            if not done[g]:
                for r in range(g * size, (g + 1) * size):
                    groups[g].add(seqs[r, P:].tolist(), float(scores[r]), "length")
        ranked = sorted((h for group in groups for h in group.beams), key=lambda h: h[0])
        candidates = []
        for _ in range(self.num_return_sequences):
            score, tokens, finish = ranked.pop()
            candidates.append(Candidate(tokens, finish, score=score,
                                        logprob=score * length_norm(len(tokens), self.length_penalty, "hf")))
        stats.new_tokens = len(candidates[0].token_ids)
        stats.seconds = time.perf_counter() - start
        stats.target_seconds = stats.seconds - stats.time_to_first_token
        return SearchResult(with_text(candidates, tokenizer), stats)

    @staticmethod
    def _choose(hyps: _Hypotheses, done: bool, top: Tensor, beam: Tensor, token: Tensor, generated: Tensor,
                stop_ids: set[int]) -> tuple[Tensor, Tensor, Tensor]:
        """One group's step (Hugging Face's `BeamSearchScorer.process`): walk the ranked candidates, put a
        stop token among the top `size` into the group's hypotheses, keep the first `size` others.
        top, beam, token: (keep,) the ranked candidates' scores, parents and tokens; generated: (size, step).
        Returns (size,) int64 parent beams within the group, (size,) int64 tokens, (size,) float32 scores."""
        size = hyps.size
        if done:
            return torch.zeros(size, dtype=torch.int64), torch.full((size,), PAD), torch.zeros(size)
        kept: list[int] = []
        for rank, (t, b) in enumerate(zip(token.tolist(), beam.tolist(), strict=True)):
            if t in stop_ids:
                if rank < size:  # the stop token itself is not stored, but its log-prob and length count
                    hyps.add(generated[b].tolist() + [t], float(top[rank]), "eos")
            else:
                kept.append(rank)
            if len(kept) == size:
                break
        index = torch.tensor(kept)
        return beam[index], token[index], top[index]
