"""EDU plan-guided summaries (Adams et al. 2023, "Generating EDU Extracts for Plan-Guided Summary
Re-Ranking"): diverse extractive content plans, one candidate guided by each, and a reranker.

1. Source: the user's message in the prompt ids (`split_prompt`: the text before the chat template's
   closing tokens, a short leading instruction such as "Summarize: " dropped).
2. Plans: the source's EDUs, their salience and `plans` distinct sets of `plan_size` EDUs (`edu.py`).
3. Guided generation, all plans' rows as one batch: `guide="prompt"` inserts the plan ("Key points to
   cover:" and one EDU a line) at the end of the user's message; `guide="bias"` adds `bias` to the logits
   of the plan's word tokens (3+ characters, not stop words) until the row emits them (each bonus is paid
   once); `"both"` (default) does both. The prompt's shared prefix is prefilled once, each row's own suffix (its
   plan, the template's closing tokens) in one right-padded forward; then every step is one forward of
   the open rows (`sample.decode_rows`: greedy, or sampled with `do_sample`).
4. Rerank: `PlanScorer` (plan coverage, ROUGE-2 precision against the source, mean log-probability; its
   weights are options) or any `Scorer` given as `scorer`; candidates best first.

Candidate i's `logprob` is the target's, given its plan's prompt. Cost: the plans' suffix tokens in the
prefill, and every row's tokens (`stats.search_tokens`). A source with few EDUs gives fewer plans, so
fewer candidates than `plans`.
"""

from __future__ import annotations

import re
import time
from typing import Literal

import torch

from warpdecode.decoding.outputs import DecodeStats
from warpdecode.decoding.registry import register
from warpdecode.decoding.sampler import Sampler
from warpdecode.decoding.search.edu import STOP_WORDS, content_plans, salience, segment
from warpdecode.decoding.search.plan_scorer import PlanScorer
from warpdecode.decoding.search.protocols import SearchResult, SearchStrategy
from warpdecode.decoding.search.rows import MAX_ROWS
from warpdecode.decoding.search.sample import decode_rows
from warpdecode.decoding.search.scorers import Scorer
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.tokenizer import Tokenizer

PLAN_HEADER = "\n\nKey points to cover:\n"
_SENTINEL = "\x00message\x00"
_INSTRUCTION = re.compile(r"^\s*[A-Za-z]+(?: [A-Za-z]+){0,2}:\s+(?=\S)")


def split_prompt(tokenizer: Tokenizer, prompt: list[int]) -> tuple[int, str]:
    """(cut, source): `prompt[:cut]` ends with the user's message (`cut = len(prompt)` unless the prompt ends
    with the chat template's closing tokens), `source` is that message's text without a leading instruction
    of up to three words and a colon ("Summarize: ")."""
    cut, head = len(prompt), ""
    if tokenizer.chat_template is not None:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": _SENTINEL}])
        if _SENTINEL in rendered:
            before, after = rendered.split(_SENTINEL, 1)
            tail = tokenizer.encode(after, add_special_tokens=False)
            if tail and prompt[-len(tail):] == tail:
                cut = len(prompt) - len(tail)
                head = tokenizer.decode(tokenizer.encode(before, add_special_tokens=False))
    text = tokenizer.decode(prompt[:cut])
    if head and text.startswith(head):
        text = text[len(head):]
    return cut, _INSTRUCTION.sub("", text, count=1).strip()


@register("search", "edu_plans")
class EduPlans(SearchStrategy):
    takes_stop_strings = True
    composes_with_speculation = False  # rows with different prompts: not built

    def __init__(self, plans: int = 4, plan_size: int = 3, diversity: float = 0.5, position_weight: float = 0.5,
                 min_words: int = 3, guide: Literal["prompt", "bias", "both"] = "both", bias: float = 2.0,
                 coverage_weight: float = 1.0, support_weight: float = 1.0, logprob_weight: float = 1.0,
                 scorer: Scorer | None = None) -> None:
        if not 1 <= plans <= MAX_ROWS or plan_size < 1 or min_words < 1:
            raise ConfigError(f"edu_plans needs plans in [1, {MAX_ROWS}], plan_size >= 1 and min_words >= 1, got "
                              f"plans={plans}, plan_size={plan_size}, min_words={min_words}")
        if guide not in ("prompt", "bias", "both"):
            raise ConfigError(f"edu_plans guide must be one of prompt, bias, both, got {guide!r}")
        if not all(0 <= v < float("inf") for v in (diversity, position_weight, bias)):
            raise ConfigError(f"edu_plans needs finite diversity, position_weight and bias >= 0, got {diversity}, "
                              f"{position_weight}, {bias}")
        PlanScorer("", (), coverage_weight, support_weight, logprob_weight)  # refuse bad weights now
        self.plans = self.num_return_sequences = plans
        self.plan_size, self.diversity, self.position_weight, self.min_words = plan_size, diversity, position_weight, min_words
        self.guide, self.bias = guide, bias
        self.weights = (coverage_weight, support_weight, logprob_weight)
        self.scorer = scorer

    def content_plans(self, source: str) -> list[list[str]]:
        """The source's plans, each its EDUs' texts in document order, the most salient plan first."""
        edus = segment(source, min_words=self.min_words)
        chosen = content_plans(edus, salience(edus, position_weight=self.position_weight), n=self.plans,
                               size=self.plan_size, diversity=self.diversity)
        return [[edus[i].text for i in plan] for plan in chosen]

    def _plan_tokens(self, tokenizer: Tokenizer, plan: list[str], stop_ids: set[int]) -> list[int]:
        ids = set(tokenizer.encode(" " + " ".join(plan), add_special_tokens=False)) - stop_ids
        return sorted(t for t in ids if len(w := tokenizer.decode([t]).strip().lower()) >= 3 and w not in STOP_WORDS)

    @torch.inference_mode()
    def search(self, model: Backbone, tokenizer: Tokenizer | None, prompt: list[int], sampler: Sampler, *,
               max_new_tokens: int, stop_ids: set[int], stop_strings: tuple[str, ...] = ()) -> SearchResult:
        if tokenizer is None:
            raise CapabilityError("edu_plans plans from the prompt's text: it needs the model's tokenizer")
        cut, source = split_prompt(tokenizer, prompt)
        plans = self.content_plans(source)
        if not plans:
            raise ConfigError("edu_plans found no text to plan from in the prompt")
        n, device = len(plans), model.embed.weight.device
        inserts = [tokenizer.encode(PLAN_HEADER + "\n".join(f"- {e}" for e in p), add_special_tokens=False)
                   if self.guide != "bias" else [] for p in plans]
        shared = min(cut, len(prompt) - 1)  # every row keeps at least one token of its own to read logits after
        suffixes = [prompt[shared:cut] + extra + prompt[cut:] for extra in inserts]
        width = max(len(s) for s in suffixes)
        budget = min(max_new_tokens, model.config.max_seq_len - shared - width)
        if budget < 1:
            raise ConfigError(f"edu_plans: the prompt and its plans ({shared + width} tokens) fill the model's "
                              f"context of {model.config.max_seq_len}")
        start = time.perf_counter()
        stats = DecodeStats(prompt_tokens=len(prompt))
        model.pack_for_cpu_inference()
        cache = model.new_cache(n, shared + width + budget)
        if shared:
            one = model.new_cache(1, shared)
            model(torch.tensor([prompt[:shared]], device=device), cache=one, logits_slice=slice(0, 0))
            cache.fill_from_row(one)
        padded = torch.tensor([s + [0] * (width - len(s)) for s in suffixes], device=device)  # (n, T) right-padded
        layer = model.config.n_layer
        out = model(padded, cache=cache, hidden_layers=(layer,), logits_slice=slice(0, 0))
        ends = torch.tensor([len(s) - 1 for s in suffixes], device=device)
        logits = model.head(out.hidden_states[layer][torch.arange(n, device=device), ends])  # (n, V)
        cache.truncate([shared + len(s) for s in suffixes])
        bias = None
        if self.guide != "prompt":
            bias = torch.zeros(n, logits.shape[-1])  # (n, V)
            for row, plan in enumerate(plans):
                bias[row, self._plan_tokens(tokenizer, plan, stop_ids)] = self.bias
        result = decode_rows(model, tokenizer, prompt, sampler, cache, logits, stats, start, max_new_tokens=budget,
                             stop_ids=stop_ids, stop_strings=stop_strings, bias=bias)
        for candidate in result.candidates:
            if candidate.finish_reason == "length" and budget < max_new_tokens:
                candidate.finish_reason = "context"  # the plans' tokens took the rest of the context
        scorer = self.scorer or PlanScorer(source, tuple(" ".join(p) for p in plans), *self.weights)
        for candidate, score in zip(result.candidates, scorer.score(prompt, result.candidates), strict=True):
            candidate.score = score
        result.candidates.sort(key=lambda c: -(c.score or 0.0))  # stable: ties keep plan order
        result.stats.new_tokens = len(result.candidates[0].token_ids)
        return result
