"""PG-TD, Planning-Guided Transformer Decoding (Zhang et al. 2023): Monte Carlo tree search over the
target's top-k next tokens, with greedy rollouts that complete programs and a reward on each program.

The reward is a `Scorer` of the finished program in [0, 1]: in `warpdecode eval --task humaneval --method
pg_td --scorer public_tests`, the fraction of the problem's public tests (its docstring's examples) the
program passes in the sandbox; from Python any `Scorer` or a function of the program's text; from
`generate --method`, `pattern=REGEX` (1 when the text matches).

Each iteration descends from the root by P-UCB, `Q(child) + c * P(child) * sqrt(N(parent)) / (1 +
N(child))`, with `Q` the best reward found under the child and `P` the target's probability of its token,
to a node not yet expanded (or a complete program). A greedy rollout from there completes the program;
the node gets the target's `k` most likely next tokens as children; the reward of the program is
backed up along the path (each node keeps the maximum, as PG-TD does). The answer is the best-rewarded
program found, the search stopping early once one reaches `stop_reward`.

What is shared (the paper's caching): every position a rollout runs records its top-k tokens, so a
rollout from a node on an earlier rollout's path follows that path for free (greedy decoding is
deterministic), and expanding such a node costs no forward; a program's reward is computed once. The
prompt runs once, into one cache row that every rollout reuses: a rollout rolls the row back to the
longest prefix it shares with the last one and runs only the tokens after it.

Budgets, both exact: `max_rollouts` iterations (each ends in one scored program) and `max_tokens`
tokens decoded by rollouts (`stats.search_tokens`; a rollout the budget cuts is scored as it is).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from warpdecode.decoding.outputs import Candidate, DecodeStats, FinishReason
from warpdecode.decoding.registry import register
from warpdecode.decoding.sampler import Sampler
from warpdecode.decoding.search.protocols import SearchResult, SearchStrategy
from warpdecode.decoding.search.rows import prefill_rows, with_text
from warpdecode.decoding.search.scorers import ProgramScorer, Scorer, regex_scorer
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.tokenizer import Tokenizer

Reward = Callable[[str], float]


@dataclass
class _Node:
    tokens: tuple[int, ...]
    """The new tokens from the root to here."""
    prior: float
    """The target's probability of the last token after the ones before it."""
    children: list[_Node] | None = None
    """None until expanded."""
    visits: int = 0
    value: float = 0.0
    """The best reward of a program found through this node."""


class _Rollouts:
    """Greedy completions of token prefixes through one cache row, and every position's top-k tokens."""

    def __init__(self, model: Backbone, tokenizer: Tokenizer | None, prompt: list[int], k: int, *,
                 max_new_tokens: int, max_tokens: int, stop_ids: set[int], stop: tuple[str, ...],
                 stats: DecodeStats) -> None:
        self.model, self.tokenizer, self.k, self.stats = model, tokenizer, k, stats
        self.max_new_tokens, self.max_tokens, self.stop_ids, self.stop = max_new_tokens, max_tokens, stop_ids, stop
        self.prompt_len = len(prompt)
        self.cache, first = prefill_rows(model, prompt, 1, len(prompt) + max_new_tokens)
        self.in_cache: list[int] = []  # the new tokens whose keys and values the row holds after the prompt
        self.top: dict[tuple[int, ...], tuple[list[int], list[float]]] = {}  # prefix → top-k tokens, probs
        self._record((), first)

    def _record(self, prefix: tuple[int, ...], logits: Tensor) -> None:
        """logits: (V,) after `prefix`."""
        probs, tokens = torch.softmax(logits.float(), -1).topk(min(self.k, logits.shape[-1]))
        self.top[prefix] = (tokens.tolist(), probs.tolist())

    def finish(self, tokens: list[int]) -> FinishReason | None:
        """How a program of these new tokens has ended, or None while it goes on."""
        if tokens and tokens[-1] in self.stop_ids:
            return "eos"
        if self.stop and self.tokenizer is not None and any(s in self.tokenizer.decode(tokens) for s in self.stop):
            return "stop"
        return "length" if len(tokens) >= self.max_new_tokens else None

    def complete(self, prefix: tuple[int, ...]) -> tuple[list[int], FinishReason]:
        """The greedy completion of `prefix`; cut ("length") where the token budget runs out."""
        seq = list(prefix)
        while (finish := self.finish(seq)) is None:
            if tuple(seq) not in self.top:
                common = next((i for i, (a, b) in enumerate(zip(self.in_cache, seq, strict=False)) if a != b),
                              min(len(self.in_cache), len(seq)))
                new = seq[common:]  # at least one token: every position the row holds has its top-k recorded
                if len(new) > self.max_tokens - self.stats.search_tokens:
                    return seq, "length"
                self.cache.truncate(self.prompt_len + common)
                logits = self.model(torch.tensor([new], device=self.model.embed.weight.device),
                                    cache=self.cache).logits[0]  # (T, V)
                self.stats.target_forwards += 1
                self.stats.search_tokens += len(new)
                for i in range(len(new)):
                    self._record(tuple(seq[: common + i + 1]), logits[i])
                self.in_cache = list(seq)
            seq.append(self.top[tuple(seq)][0][0])
        return seq, finish

    def logprob(self, tokens: list[int]) -> float:
        """The target's log-probability of a program: each of its tokens is among the recorded top-k after
        the ones before it (a rollout's are the top-1; a cut program's last ones may be unrecorded: 0)."""
        total = 0.0
        for i, token in enumerate(tokens):
            ids, probs = self.top.get(tuple(tokens[:i]), ((), ()))
            total += math.log(probs[ids.index(token)]) if token in ids else 0.0
        return total


@register("search", "pg_td")
class PGTD(SearchStrategy):
    takes_stop_strings = True  # a rollout's program ends at one (eval passes HumanEval's stop sequences)
    composes_with_speculation = False  # rollouts are greedy: a lossless drafter could run them (not built yet)

    def __init__(self, k: int = 3, max_rollouts: int = 16, max_tokens: int = 4096, c: float = 4.0,
                 reward: Reward | Scorer | None = None, pattern: str | None = None, stop_reward: float = 1.0,
                 num_return_sequences: int = 1) -> None:
        for option, value in (("k", k), ("max_rollouts", max_rollouts), ("max_tokens", max_tokens),
                              ("num_return_sequences", num_return_sequences)):
            if value < 1:
                raise ConfigError(f"pg_td option {option} must be >= 1, got {value}")
        if not (math.isfinite(c) and c >= 0):
            raise ConfigError(f"pg_td option c must be a finite number >= 0, got {c}")
        if reward is not None and pattern is not None:
            raise ConfigError("pg_td takes one of reward (a function of the program text) and pattern (a regex)")
        self.scorer: Scorer | None = (regex_scorer(pattern) if pattern is not None else
                                      reward if reward is None or isinstance(reward, Scorer) else ProgramScorer(reward))
        """The reward of a complete program: `score(prompt, [candidate])`, in [0, 1] (`warpdecode eval
        --scorer public_tests` sets the fraction of each problem's public tests passed)."""
        self.k, self.max_rollouts, self.max_tokens, self.c = k, max_rollouts, max_tokens, c
        self.stop_reward = stop_reward
        self.num_return_sequences = num_return_sequences

    def _select(self, node: _Node) -> _Node:
        """The child with the highest P-UCB score (the first of equals: the more likely token)."""
        assert node.children
        explore = self.c * math.sqrt(node.visits)
        return max(node.children, key=lambda ch: ch.value + explore * ch.prior / (1 + ch.visits))

    @torch.inference_mode()
    def search(self, model: Backbone, tokenizer: Tokenizer | None, prompt: list[int], sampler: Sampler, *,
               max_new_tokens: int, stop_ids: set[int], stop_strings: tuple[str, ...] = ()) -> SearchResult:
        if self.scorer is None:
            raise CapabilityError("pg_td needs a reward: pattern=REGEX, or from Python reward=FUNCTION(program text) "
                                  "-> [0, 1] (e.g. the fraction of a task's public tests passed)")
        if sampler.config.do_sample:
            raise CapabilityError("pg_td rolls out greedily: drop --temperature (do_sample=False)")
        start = time.perf_counter()
        stats = DecodeStats(prompt_tokens=len(prompt))
        rollouts = _Rollouts(model, tokenizer, prompt, self.k, max_new_tokens=max_new_tokens,
                             max_tokens=self.max_tokens, stop_ids=stop_ids, stop=stop_strings, stats=stats)
        stats.time_to_first_token = time.perf_counter() - start
        root = _Node((), 1.0)
        programs: dict[tuple[int, ...], Candidate] = {}  # in the order found
        rewards: dict[str, float] = {}
        scorer = self.scorer
        for _ in range(self.max_rollouts):
            path = [root]
            while path[-1].children:
                path.append(self._select(path[-1]))
            leaf = path[-1]
            tokens, finish = rollouts.complete(leaf.tokens)
            if leaf.children is None and rollouts.finish(list(leaf.tokens)) is None and leaf.tokens in rollouts.top:
                ids, probs = rollouts.top[leaf.tokens]
                leaf.children = [_Node(leaf.tokens + (t,), p) for t, p in zip(ids, probs, strict=True)]
            (program,) = with_text([Candidate(tokens, finish, logprob=rollouts.logprob(tokens))], tokenizer,
                                   stop_strings)
            key = program.text if tokenizer is not None else str(tokens)
            if key not in rewards:
                rewards[key] = float(scorer.score(prompt, [program])[0])
            reward = program.score = rewards[key]
            programs.setdefault(tuple(tokens), program)
            for node in path:
                node.visits += 1
                node.value = max(node.value, reward)
            if reward >= self.stop_reward or stats.search_tokens >= self.max_tokens:
                break
        ranked = sorted(programs.values(), key=lambda c: -(c.score or 0.0))  # stable: ties in the order found
        candidates = ranked[: self.num_return_sequences]
        stats.new_tokens = len(candidates[0].token_ids)
        stats.seconds = time.perf_counter() - start
        stats.target_seconds = stats.seconds - stats.time_to_first_token
        return SearchResult(candidates, stats)
