"""RankGen beam search (Krishna et al. 2022, "RankGen: Improving Text Generation with Large Ranking
Models", §5): beam search over sampled continuations, ranked by a learned (prefix, continuation) encoder.

Each round, every beam is followed by `samples` sampled continuations of up to `chunk` tokens, all in one
batch (the prompt fills every beam slot in the first round); each candidate, the beam's tokens plus its
new chunk, is scored against the prompt by the `Scorer` (by default `RankGenScorer`, the encoder trained
by `warpdecode fit --config configs/search/rankgen.yaml`, loaded from `path`), and the `beams` best open
candidates go on. Finishing follows DeAL's rule: a candidate that ends (a stop token, or the token budget)
among the `beams` best of its round is finished; the search stops once `beams` have finished or none is
open, and returns the finished ones by score. Cost per round: `chunk` forwards of up to `beams * samples`
rows plus one forward of the kept beams' last tokens and one scorer call.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from warpdecode.decoding.outputs import Candidate, DecodeStats, FinishReason
from warpdecode.decoding.processors import TokenHistory
from warpdecode.decoding.registry import register
from warpdecode.decoding.sampler import Sampler
from warpdecode.decoding.search.protocols import SearchResult, SearchStrategy
from warpdecode.decoding.search.rows import MAX_ROWS, next_row_logits, prefill_rows, with_text
from warpdecode.decoding.search.scorers import Scorer
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.cache import KVCache
from warpdecode.models.rankgen import RankGenNet, load_rankgen, read_rankgen
from warpdecode.models.tokenizer import Tokenizer


class RankGenScorer:
    """A trained RankGen encoder behind the `Scorer` protocol: the prompt is the prefix (its last
    `max_prefix` tokens), each candidate's tokens the continuation; a candidate longer than
    `max_continuation` has its older tokens read as part of the prefix (`RankGenNet.scores`)."""

    def __init__(self, net: RankGenNet) -> None:
        self.net = net

    @classmethod
    def load(cls, path: str, target: Backbone) -> RankGenScorer:
        """The scorer saved at `path` for `target` (ConfigError / CheckpointError, see `load_rankgen`)."""
        return cls(load_rankgen(path, target))

    def score(self, prompt: list[int], candidates: Sequence[Candidate]) -> list[float]:
        return self.net.scores(prompt, [c.token_ids for c in candidates]) if candidates else []


@dataclass
class _Row:
    tokens: list[int]
    logprob: float
    finish: FinishReason | None = None
    score: float = field(default=0.0)


@register("search", "rankgen")
class RankGenSearch(SearchStrategy):
    needs_training = True
    needs_sampling = True
    composes_with_speculation = False  # the rows could draft and verify on their own: not built

    def __init__(self, path: str | None = None, beams: int = 2, samples: int = 4, chunk: int = 8,
                 num_return_sequences: int = 1, scorer: Scorer | None = None) -> None:
        """
        Args:
            path: A RankGen encoder file (`warpdecode fit --config configs/search/rankgen.yaml` writes one).
            beams: Beams kept after each round.
            samples: Continuations sampled per beam each round.
            chunk: Tokens per sampled continuation (the paper's L).
            num_return_sequences: Finished candidates returned, best first.
            scorer: Any `Scorer` instead of a RankGen file (then no `path`).
        """
        if (path is None) == (scorer is None):
            raise ConfigError("rankgen needs path=FILE (a trained RankGen encoder; `warpdecode fit --config "
                              "configs/search/rankgen.yaml` makes one), or a Scorer in Python")
        if beams < 1 or samples < 1 or beams * samples > MAX_ROWS:
            raise ConfigError(f"rankgen needs beams >= 1, samples >= 1 and beams * samples <= {MAX_ROWS}, got "
                              f"beams={beams}, samples={samples}")
        if chunk < 1:
            raise ConfigError(f"rankgen needs chunk >= 1 tokens, got {chunk}")
        if not 1 <= num_return_sequences <= beams:
            raise ConfigError(f"rankgen needs num_return_sequences in [1, beams={beams}], got {num_return_sequences}")
        if path is not None:
            read_rankgen(path)  # refuse a missing or corrupt file now, before any model is loaded
        self.path, self.scorer = path, scorer
        self.beams, self.samples, self.chunk = beams, samples, chunk
        self.num_return_sequences = num_return_sequences

    def _sample_round(self, model: Backbone, prompt: list[int], sampler: Sampler, rows: list[_Row],
                      logits: torch.Tensor, cache: KVCache, *, budget: int, stop_ids: set[int],
                      stats: DecodeStats) -> dict[int, int]:
        """Extend each row by up to `chunk` sampled tokens, as `sample.sample_rows` does (a row that ends
        leaves the batch). `logits`: (R, V), row i's next-token logits. Returns {row: its cache row} of
        the rows still open."""
        active = list(range(len(rows)))  # the rows in the cache, in cache order
        for step in range(self.chunk):
            raw = torch.log_softmax(logits.float(), dim=-1)  # (B_active, V)
            if sampler.penalties:
                history = TokenHistory(torch.tensor(prompt), len(prompt), tuple(tuple(rows[i].tokens) for i in active))
                logits = sampler.penalize(logits, history)
            chosen = sampler.select(logits)  # (B_active,)
            picked = raw.gather(1, chosen[:, None])[:, 0].tolist()
            for i, token, logprob in zip(active, chosen.tolist(), picked, strict=True):
                row = rows[i]
                row.tokens.append(token)
                row.logprob += logprob
                if token in stop_ids:
                    row.finish = "eos"
                elif len(row.tokens) >= budget:
                    row.finish = "length"
            stats.search_tokens += len(active)
            still = [j for j, i in enumerate(active) if rows[i].finish is None]
            if not still or step == self.chunk - 1:
                return {active[j]: j for j in still}
            active, logits = next_row_logits(model, cache, [r.tokens for r in rows], active, still)  # (B_active, V)
            stats.target_forwards += 1
        raise AssertionError("unreachable: chunk >= 1")

    @torch.inference_mode()
    def search(self, model: Backbone, tokenizer: Tokenizer | None, prompt: list[int], sampler: Sampler, *,
               max_new_tokens: int, stop_ids: set[int]) -> SearchResult:
        scorer = self.scorer if self.scorer is not None else RankGenScorer.load(str(self.path), model)
        K, P, budget = self.beams, len(prompt), max_new_tokens
        start = time.perf_counter()
        stats = DecodeStats(prompt_tokens=P)
        cache, first = prefill_rows(model, prompt, K * self.samples, P + budget)
        stats.time_to_first_token = time.perf_counter() - start
        logits = first[None].expand(K * self.samples, -1)  # (R, V) every slot follows the prompt at first
        rows = [_Row([], 0.0) for _ in range(K * self.samples)]
        finished: list[_Row] = []
        while True:
            open_rows = self._sample_round(model, prompt, sampler, rows, logits, cache, budget=budget,
                                           stop_ids=stop_ids, stats=stats)
            candidates = [Candidate(r.tokens, r.finish or "length") for r in rows]
            for row, score in zip(rows, scorer.score(prompt, with_text(candidates, tokenizer)), strict=True):
                row.score = score
            order = sorted(range(len(rows)), key=lambda i: -rows[i].score)  # stable: ties keep row order
            finished += [rows[i] for i in order[:K] if rows[i].finish is not None]
            kept = [i for i in order if i in open_rows][:K]
            beams = [rows[i] for i in kept]
            if len(finished) >= K or not beams:
                break
            cache.keep_rows([open_rows[i] for i in kept])
            pending = torch.tensor([[b.tokens[-1]] for b in beams], device=model.embed.weight.device)
            beam_logits = model(pending, cache=cache).logits[:, -1]  # (K_open, V)
            stats.target_forwards += 1
            cache.keep_rows([j for j in range(len(beams)) for _ in range(self.samples)])
            logits = beam_logits.repeat_interleave(self.samples, dim=0)  # (K_open * samples, V)
            rows = [_Row(list(b.tokens), b.logprob) for b in beams for _ in range(self.samples)]
        finished.sort(key=lambda r: -r.score)
        out = [Candidate(r.tokens, r.finish or "length", score=r.score, logprob=r.logprob)
               for r in finished[: self.num_return_sequences]]
        stats.new_tokens = len(out[0].token_ids)
        stats.seconds = time.perf_counter() - start
        stats.target_seconds = stats.seconds - stats.time_to_first_token
        return SearchResult(with_text(out, tokenizer), stats)
