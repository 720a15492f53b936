"""Exact-extract (Castel et al. 2022, "How Optimal is Greedy Decoding for Extractive Question
Answering?"): the answer is the most probable span of the passage, span-constrained MAP decoding.

Over the spans s = P[i:j] of the passage P with 1 <= j - i <= `max_length`, it maximises the
probability of s as the whole answer, ended by a stop token:

    log p(s | prompt) = sum_{t=i}^{j-1} log p(P_t | prompt, P_i .. P_{t-1})  +  log p(stop | prompt, s)

(without the end term the shortest span would always win; `stop` is any of the request's stop
tokens, their probabilities summed). The search is exact: the spans starting at i are the prefixes of
the window P[i : i + max_length], so one teacher-forced pass over the window scores every one of
them (a running sum over span ends). The windows of all starts run as sibling branches of one tree
over the prompt's cache (each window sees the prompt and its own earlier tokens, at positions after
the prompt), `chunk` tree nodes per forward, and only two log-probabilities per node are kept. The
rule then emits the span and the most likely stop token.

The passage is a stretch of the prompt, tokens [begin, end) (Python slice semantics, default the whole
prompt): a rule sees token ids, not text, and an extractive QA prompt holds its passage anyway, so
the spans are the prompt's own tokens, tokenised as the model read them. `passage_bounds` finds a
passage text's tokens in a prompt (the Python API, `bench`'s QA set). Scores are the target's own
log-probabilities: penalties and logits hooks are refused, not dropped.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch import Tensor

from warpdecode.decoding.outputs import DecodeStats
from warpdecode.decoding.registry import register
from warpdecode.decoding.rules.protocols import Decoded, DecodingRule, Emitter
from warpdecode.decoding.sampler import Sampler
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.tokenizer import Tokenizer


def passage_bounds(tokenizer: Tokenizer, prompt_ids: list[int], passage: str) -> tuple[int, int]:
    """(begin, end): the fewest prompt tokens [begin, end) whose text covers the last occurrence of
    `passage` in the decoded prompt; ConfigError when the prompt does not contain it."""
    ends = [len(tokenizer.decode(prompt_ids[:i])) for i in range(len(prompt_ids) + 1)]  # text length after i tokens
    at = tokenizer.decode(prompt_ids).rfind(passage)
    if not passage or at < 0:
        raise ConfigError(f"the prompt does not contain the passage {passage[:40]!r}")
    begin = max(i for i, n in enumerate(ends) if n <= at)
    end = min(i for i, n in enumerate(ends) if n >= at + len(passage))
    return begin, end


def window_tree(lengths: list[int], device: torch.device) -> tuple[Tensor, Tensor]:
    """Offsets and the attention mask of sibling windows laid out one after another.

    Example: lengths [2, 3] → offsets [0 1 0 1 2]; node 3 sees nodes 2 and 3 only.

    Returns:
        offsets: (N,) int64, each node's index inside its window (N = sum of lengths).
        mask: (1, N, N) bool, node a sees node b when both lie in one window and b is not after a.
    """
    window = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)).to(device)  # (N,)
    starts = torch.tensor([0] + lengths[:-1]).cumsum(0).to(device)
    offsets = torch.arange(int(window.numel()), device=device) - starts[window]  # (N,)
    mask = (window[:, None] == window[None, :]) & (offsets[None, :] <= offsets[:, None])
    return offsets, mask[None]


def best_span(first: Tensor, following: Tensor, ending: Tensor, lengths: list[int]) -> tuple[int, int, float]:
    """The best span from the windows' per-node log-probabilities: (start window, span length, score).

    Args:
        first: (W,) log p of each window's first token after the prompt.
        following: (N,) log p of the window's next token after each node (unused at a window's last node).
        ending: (N,) log p(stop) after each node.
        lengths: W window lengths summing to N.
    """
    best = (0, 1, float("-inf"))
    for w, (head, tail, end) in enumerate(zip(first, following.split(lengths), ending.split(lengths), strict=True)):
        prefix = head + torch.cat([tail.new_zeros(1), tail[:-1].cumsum(0)])  # (len,): log p of the span's tokens
        scores = prefix + end
        j = int(scores.argmax())
        if float(scores[j]) > best[2]:
            best = (w, j + 1, float(scores[j]))
    return best


@register("rule", "exact_extract")
class ExactExtract(DecodingRule):
    def __init__(self, max_length: int = 16, begin: int = 0, end: int | None = None, chunk: int = 256,
                 content_start: bool = True) -> None:
        """Args:
        max_length: longest answer span, in tokens.
        begin: the passage's first prompt token (negative: from the prompt's end).
        end: the prompt token after the passage (default: the prompt's end; negative: from the end).
        chunk: tree nodes (span tokens) scored per forward.
        content_start: with a tokenizer, spans start only at a token whose text holds a letter or a digit
            (a bare "." or space is a likely but empty answer); all starts when none does.
        """
        if max_length < 1 or chunk < max_length:
            raise ConfigError(f"exact_extract needs max_length >= 1 and chunk >= max_length, got {max_length} and {chunk}")
        self.max_length, self.begin, self.end, self.chunk = max_length, begin, end, chunk
        self.content_start = content_start

    @torch.inference_mode()
    def decode(self, target: Backbone, prompt_ids: list[int], sampler: Sampler, emit: Emitter) -> Decoded:
        if sampler.penalties:
            raise CapabilityError("exact_extract scores the target's own probabilities: it takes no penalties "
                                  "or logits hooks")
        if not emit.stop_ids:
            raise CapabilityError("exact_extract scores where an answer ends by its stop tokens: give it some "
                                  "(stop_at_eos, eos_token_id)")
        passage = prompt_ids[self.begin : self.end]
        if not passage:
            raise ConfigError(f"exact_extract's passage, prompt tokens [{self.begin}, {self.end}), is empty "
                              f"(the prompt has {len(prompt_ids)} tokens)")
        device = target.embed.weight.device
        target.pack_for_cpu_inference()
        room = target.config.max_seq_len - len(prompt_ids)
        longest = max(1, min(self.max_length, emit.max_new_tokens - 1, room, self.chunk))
        starts: Sequence[int] = range(len(passage))
        if self.content_start and emit.tokenizer is not None:
            tokenizer = emit.tokenizer
            starts = [i for i in starts if any(ch.isalnum() for ch in tokenizer.decode([passage[i]]))] or starts
        windows = [passage[i : i + longest] for i in starts]
        cache = target.new_cache(1, len(prompt_ids) + min(self.chunk, room))
        stops = torch.tensor(sorted(emit.stop_ids), device=device)
        stats = DecodeStats(prompt_tokens=len(prompt_ids))
        start = time.perf_counter()
        prompt = target(torch.tensor([prompt_ids], device=device), cache=cache, logits_slice=slice(-1, None))
        after_prompt = torch.log_softmax(prompt.logits[0, -1].float(), dim=-1)  # (V,)
        following, ending, closing = [], [], []
        per_forward = max(1, min(self.chunk, room) // longest)
        for at in range(0, len(windows), per_forward):
            group = windows[at : at + per_forward]
            lengths = [len(w) for w in group]
            offsets, mask = window_tree(lengths, device)
            nodes = torch.tensor([t for w in group for t in w], device=device)  # (N,)
            logits = target(nodes[None], (len(prompt_ids) + offsets)[None], cache, mask).logits[0]  # (N, V)
            cache.truncate([len(prompt_ids)])
            logprobs = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
            following_ids = torch.cat([nodes[1:], nodes.new_zeros(1)])  # the next node (a window's own next token)
            following.append(logprobs.gather(1, following_ids[:, None])[:, 0])
            ending.append(torch.logsumexp(logprobs[:, stops], dim=-1))
            closing.append(stops[logprobs[:, stops].argmax(-1)])  # (N,) the most likely stop token there
            stats.target_forwards += 1
        first = after_prompt[torch.tensor([w[0] for w in windows], device=device)]  # (W,)
        w, length, _ = best_span(first, torch.cat(following), torch.cat(ending), [len(w) for w in windows])
        answer = windows[w][:length]
        node = sum(len(x) for x in windows[:w]) + length - 1  # the span's last node
        stats.time_to_first_token = time.perf_counter() - start
        for token in answer + [int(torch.cat(closing)[node])]:
            if not emit.push(token):
                break
        stats.accepted_per_step.extend([0] * stats.target_forwards)
        stats.proposed_per_step.extend([0] * stats.target_forwards)
        return emit.decoded(stats, start)
