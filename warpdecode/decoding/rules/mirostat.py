"""Mirostat (Basu et al. 2021): sampling whose truncation is steered by feedback so that the observed
surprise of the sampled tokens tracks a target τ, with llama.cpp's semantics (`--mirostat 1|2`,
`--mirostat-tau`, `--mirostat-eta`; `llama_sampler_mirostat[_v2]_apply`).

State: μ, starting at 2τ. Each step sorts the (penalised, temperature-scaled) distribution p:

* v1 estimates the Zipf exponent ŝ by least squares over the `m` most likely tokens
  (t_i = ln((i+2)/(i+1)), b_i = ln(p_i / p_{i+1}), ŝ = Σ t_i b_i / Σ t_i²), then keeps the
  k = ((ε̂ 2^μ) / (1 - V^-ε̂))^(1/ŝ) most likely tokens, ε̂ = ŝ - 1;
* v2 keeps the most likely tokens whose surprise -log2 p is at most μ (at least one).

It samples from the kept tokens renormalised, and updates μ ← μ - η (-log2 p'(x) - τ) with the
sampled token's renormalised probability p'(x). Tokens are drawn by inverse CDF from one uniform per
step of the request's generator (llama.cpp draws from its own `std::discrete_distribution`).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from warpdecode.decoding.registry import register
from warpdecode.decoding.rules.protocols import Decoded, DecodingRule, Emitter, one_token_per_forward
from warpdecode.decoding.sampler import Sampler
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone


def mirostat_step(logits: Tensor, mu: float, uniform: float, *, version: Literal[1, 2], tau: float, eta: float,
                  m: int = 100) -> tuple[int, float]:
    """One Mirostat choice: (token id, the updated μ).

    Args:
        logits: (V,) float logits, temperature and penalties already applied.
        mu: the current μ; uniform: a draw in [0, 1) that picks the token by inverse CDF.
    """
    probs, order = torch.softmax(logits.double(), dim=-1).sort(descending=True)  # (V,) most likely first
    vocab = probs.numel()
    if version == 1:
        n = min(m - 1, vocab - 1)
        i = torch.arange(n, dtype=torch.float64)
        t = torch.log((i + 2) / (i + 1))
        b = torch.log(probs[:n] / probs[1 : n + 1])
        s_hat = float((t * b).sum() / (t * t).sum())
        eps = s_hat - 1
        ratio = (eps * 2**mu) / (1 - vocab ** (-eps)) if eps else math.nan
        k = ratio ** (1 / s_hat) if ratio > 0 and s_hat > 0 else math.nan
        # llama.cpp's int(k) of a NaN or out-of-range k is INT_MIN on x86, so max(int(k), 1) keeps one token
        keep = min(max(int(k), 1), vocab) if math.isfinite(k) and k < 2**31 else 1
    else:
        keep = max(int((probs >= 2.0**-mu).sum()), 1)  # -log2 p <= μ; surprise grows down the sorted list
    kept = probs[:keep] / probs[:keep].sum()
    index = min(int(torch.searchsorted(kept.cumsum(0), torch.tensor(uniform, dtype=torch.float64), right=True)), keep - 1)
    surprise = -math.log2(float(kept[index]))
    return int(order[index]), mu - eta * (surprise - tau)


@register("rule", "mirostat")
class Mirostat(DecodingRule):
    needs_sampling = True

    def __init__(self, version: Literal[1, 2] = 2, tau: float = 5.0, eta: float = 0.1, m: int = 100) -> None:
        if version not in (1, 2):
            raise ConfigError(f"--mirostat must be 1 or 2, got {version}")
        if not (tau > 0 and math.isfinite(tau)) or not (eta > 0 and math.isfinite(eta)):
            raise ConfigError(f"--mirostat-tau and --mirostat-eta must be finite and > 0, got {tau} and {eta}")
        if m < 2:
            raise ConfigError(f"mirostat m must be >= 2, got {m}")
        self.version: Literal[1, 2] = version
        self.tau, self.eta, self.m = tau, eta, m

    def decode(self, target: Backbone, prompt_ids: list[int], sampler: Sampler, emit: Emitter) -> Decoded:
        generator = sampler.generator
        assert generator is not None  # needs_sampling: generate() refuses greedy decoding
        mu = 2 * self.tau

        def choose(logits: Tensor) -> int:
            nonlocal mu
            uniform = float(torch.rand((), generator=generator, device=generator.device))
            token, mu = mirostat_step(logits[0] / sampler.config.temperature, mu, uniform, version=self.version,
                                      tau=self.tau, eta=self.eta, m=self.m)
            return token

        return one_token_per_forward(target, prompt_ids, sampler, emit, choose)
