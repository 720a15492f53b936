"""Learned rewards behind the `Scorer` protocol, and the reward a reward-guided search's spec names.

* `ModelScorer`: a second model's log-probability of each candidate (the stand-in for an aligned model
  in Transfer Q*: any checkpoint with the target's vocabulary, e.g. a larger or instruction-tuned one).
* `RewardHead`: a linear head `w · h_L + b` over a model's final normed hidden state at the candidate's
  last token (the usual reward-model read-out), loaded from a safetensors file or fitted in closed form
  (`fit_reward_head`: ridge regression of any scorer's values on hidden states).

Both read every candidate through `PrefixCache`: the candidates of one search step share a long prefix
(prompt plus the tokens committed so far), whose keys and values are kept between calls, so a call costs
the new prefix tokens plus each candidate's own suffix, not the whole sequence per candidate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from warpdecode.decoding.outputs import Candidate
from warpdecode.decoding.search.scorers import (
    LengthTargetScorer,
    ProgramScorer,
    Scorer,
    keyword_scorer,
    regex_scorer,
)
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.cache import KVCache
from warpdecode.models.checkpoint import load_pretrained


class PrefixCache:
    """A model reading many sequences that share a prefix: the prefix's keys and values, and its tokens'
    log-probabilities, are kept and extended between calls while each call's prefix extends the last."""

    def __init__(self, model: Backbone) -> None:
        self.model = model
        self.prefix: list[int] = []
        self.prefix_logprobs: list[float] = []  # log p(prefix[i] | prefix[:i]) for i >= 1
        self.cache: KVCache | None = None
        self.last_logprobs = torch.zeros(0)  # (V,) after the prefix's last token

    def _extend(self, prefix: list[int], room: int) -> None:
        keep = self.cache is not None and self.prefix == prefix[: len(self.prefix)] and len(prefix) + room <= self.cache.max_len
        if not keep:
            self.prefix, self.prefix_logprobs = [], []
            self.cache = self.model.new_cache(1, min(self.model.config.max_seq_len, 2 * (len(prefix) + room) + 64))
        assert self.cache is not None
        new = prefix[len(self.prefix):]
        if not new:
            return
        device = self.model.embed.weight.device
        out = self.model(torch.tensor([new], device=device), cache=self.cache)
        logprobs = torch.log_softmax(out.logits[0].float(), -1).cpu()  # (T, V)
        if self.prefix:
            self.prefix_logprobs.append(float(self.last_logprobs[new[0]]))
        self.prefix_logprobs += [float(logprobs[i, t]) for i, t in enumerate(new[1:])]
        self.prefix, self.last_logprobs = list(prefix), logprobs[-1]

    @torch.inference_mode()
    def read(self, sequences: Sequence[list[int]], *, hidden: bool) -> tuple[list[list[float]], Tensor | None]:
        """Each sequence's token log-probabilities (all but its first token) and, with `hidden`, the
        (B, C) final normed hidden state at its last token. Every sequence needs at least 2 tokens."""
        if any(len(s) < 2 for s in sequences):
            raise ValueError("every sequence read by a model scorer needs a prompt token and a candidate token")
        shared = min(len(s) for s in sequences) - 1  # every sequence keeps at least one token of its own
        for i in range(shared):
            if any(s[i] != sequences[0][i] for s in sequences):
                shared = i
                break
        shared = max(shared, 1)
        suffix_len = max(len(s) for s in sequences) - shared
        self._extend(list(sequences[0][:shared]), suffix_len)
        assert self.cache is not None
        rows = self.model.new_cache(len(sequences), shared + suffix_len)
        rows.fill_from_row(self.cache)
        pad = [s[shared:] + [0] * (shared + suffix_len - len(s)) for s in sequences]  # right padding: never read
        layer = self.model.config.n_layer
        device = self.model.embed.weight.device
        out = self.model(torch.tensor(pad, device=device), cache=rows, hidden_layers=(layer,) if hidden else ())
        logprobs = torch.log_softmax(out.logits.float(), -1).cpu()  # (B, T_suffix, V)
        scores, last = [], []
        for b, s in enumerate(sequences):
            own = s[shared:]
            token_logprobs = self.prefix_logprobs[: shared - 1] + [float(self.last_logprobs[own[0]])]
            token_logprobs += [float(logprobs[b, i, t]) for i, t in enumerate(own[1:])]
            scores.append(token_logprobs)
            last.append(len(own) - 1)
        states = out.hidden_states[layer][torch.arange(len(sequences)), torch.tensor(last)].float() if hidden else None
        return scores, states


class ModelScorer:
    """A second model's log-probability of each candidate's tokens after the prompt, summed or per token
    (`mean`). The model must share the target's token ids (the same tokenizer)."""

    def __init__(self, model: Backbone, *, mean: bool = False) -> None:
        self.reader, self.mean = PrefixCache(model), mean

    def score(self, prompt: list[int], candidates: Sequence[Candidate]) -> list[float]:
        vocab = self.reader.model.config.vocab_size
        if any(t >= vocab for c in candidates for t in c.token_ids):
            raise ConfigError(f"the scoring model has {vocab} tokens: it needs the target's tokenizer")
        logprobs, _ = self.reader.read([prompt + c.token_ids for c in candidates], hidden=False)
        own = [lp[len(prompt) - 1:] for lp in logprobs]
        return [sum(lp) / max(1, len(lp)) if self.mean else sum(lp) for lp in own]


class RewardHead:
    """`weight · h_L + bias` at the candidate's last token, `h_L` the model's final normed hidden state.

    Args:
        weight: (C,) float32; bias: () float32.
    """

    def __init__(self, model: Backbone, weight: Tensor, bias: Tensor) -> None:
        if weight.shape != (model.config.d_model,) or bias.numel() != 1:
            raise ConfigError(f"a reward head for this model needs weight ({model.config.d_model},) and one bias, "
                              f"got {tuple(weight.shape)} and {bias.numel()}")
        self.reader, self.weight, self.bias = PrefixCache(model), weight.float().cpu(), bias.float().cpu().reshape(())

    @classmethod
    def load(cls, model: Backbone, path: str | Path) -> RewardHead:
        """A head saved by `save` (safetensors: `weight` (C,), `bias` ())."""
        if not Path(path).is_file():
            raise ConfigError(f"reward head {str(path)!r} is not a file")
        tensors = load_file(str(path))
        if set(tensors) != {"weight", "bias"}:
            raise ConfigError(f"reward head {str(path)!r} needs tensors weight and bias, has {sorted(tensors)}")
        return cls(model, tensors["weight"], tensors["bias"])

    def save(self, path: str | Path) -> None:
        save_file({"weight": self.weight.contiguous(), "bias": self.bias.contiguous()}, str(path))

    def hidden(self, prompt: list[int], candidates: Sequence[Candidate]) -> Tensor:
        """(N, C) float32 final hidden states at each candidate's last token (the prompt's for an empty one)."""
        sequences = [prompt + c.token_ids if c.token_ids else prompt for c in candidates]
        _, states = self.reader.read(sequences, hidden=True)
        assert states is not None
        return states.cpu()

    def score(self, prompt: list[int], candidates: Sequence[Candidate]) -> list[float]:
        return (self.hidden(prompt, candidates) @ self.weight + self.bias).tolist()


def fit_reward_head(model: Backbone, prompt: list[int], candidates: Sequence[Candidate], labels: Sequence[float],
                    *, l2: float = 1.0) -> RewardHead:
    """A reward head fitted in closed form (ridge regression) to `labels` (one per candidate, e.g. a
    program's reward): the learned head then ranks candidates the program never saw, at one read-out."""
    if len(candidates) != len(labels) or not candidates:
        raise ConfigError(f"fit_reward_head needs one label per candidate, got {len(candidates)} and {len(labels)}")
    head = RewardHead(model, torch.zeros(model.config.d_model), torch.zeros(()))
    x = head.hidden(prompt, candidates).double()  # (N, C)
    y = torch.tensor(labels, dtype=torch.float64)  # (N,)
    mean_x, mean_y = x.mean(0), y.mean()
    xc = x - mean_x
    weight = torch.linalg.solve(xc.T @ xc + l2 * torch.eye(x.shape[1], dtype=torch.float64), xc.T @ (y - mean_y))
    head.weight, head.bias = weight.float(), (mean_y - mean_x @ weight).float()
    return head


RewardName = Literal["keywords", "length", "regex", "head", "model"]


@dataclass(frozen=True)
class RewardSpec:
    """The reward a search spec names (`deal:reward=keywords:keywords=sort,list`), checked at construction
    and built against the target at search time (a head reads the target's hidden states)."""

    reward: RewardName
    keywords: str | None = None
    """Comma-separated, for `keywords`."""
    target_length: int | None = None
    """New tokens, for `length`."""
    pattern: str | None = None
    """A regular expression, for `regex`."""
    path: str | None = None
    """A reward-head file (`head`) or a model directory, GGUF or registered name (`model`)."""

    def __post_init__(self) -> None:
        needs = {"keywords": "keywords", "length": "target_length", "regex": "pattern", "head": "path", "model": "path"}
        if self.reward not in needs:
            raise ConfigError(f"unknown reward {self.reward!r}; choose one of: {', '.join(needs)}")
        given = {k for k in ("keywords", "target_length", "pattern", "path") if getattr(self, k) is not None}
        if given != {needs[self.reward]}:
            raise ConfigError(f"reward={self.reward} takes {needs[self.reward]}= (and no other reward option), "
                              f"got {sorted(given) or 'none'}")
        if self.reward == "keywords":
            assert self.keywords is not None
            keyword_scorer(self.keywords.split(","))  # refuse an empty list now
        if self.reward == "length":
            assert self.target_length is not None
            LengthTargetScorer(self.target_length)
        if self.reward == "regex":
            assert self.pattern is not None
            regex_scorer(self.pattern)
        if self.reward == "head" and not Path(str(self.path)).is_file():
            raise ConfigError(f"reward head {self.path!r} is not a file")

    def build(self, model: Backbone) -> Scorer:
        if self.reward == "keywords":
            assert self.keywords is not None
            return keyword_scorer(self.keywords.split(","))
        if self.reward == "length":
            assert self.target_length is not None
            return LengthTargetScorer(self.target_length)
        if self.reward == "regex":
            assert self.pattern is not None
            return regex_scorer(self.pattern)
        assert self.path is not None
        if self.reward == "head":
            return RewardHead.load(model, self.path)
        second, _ = load_pretrained(self.path, device=model.embed.weight.device)
        if second.config.vocab_size != model.config.vocab_size:
            raise ConfigError(f"reward model {self.path!r} has {second.config.vocab_size} tokens, the target "
                              f"{model.config.vocab_size}: it needs the target's tokenizer")
        return ModelScorer(second)  # summed: the prefix every candidate shares cancels in a comparison


def reward_option(reward: RewardName | Scorer, keywords: str | None, target_length: int | None, pattern: str | None,
                  path: str | None, *, used: bool) -> Scorer | RewardSpec | None:
    """A reward-guided search's reward options, checked: a `Scorer` as given (it takes no other option), a
    `RewardSpec`, or None when the reward is unused (weight 0) and none is named."""
    options = (keywords, target_length, pattern, path)
    if isinstance(reward, Scorer):
        if options != (None, None, None, None):
            raise ConfigError("keywords / target_length / pattern / path go with a named reward, not a Scorer")
        return reward
    if not used and options == (None, None, None, None):
        return None
    return RewardSpec(reward, keywords, target_length, pattern, path)


def reward_scorer(reward: Scorer | RewardSpec | None, model: Backbone) -> Scorer:
    """The scorer a search reads: a spec built against the target (a head reads its hidden states), a zero
    reward for None."""
    if reward is None:
        return ProgramScorer(lambda text: 0.0)
    return reward.build(model) if isinstance(reward, RewardSpec) else reward
