"""Judge labels: which tokens other than the target's own choice could it accept without changing
where its answer goes?

Judge decoding needs examples of "correct but unaligned" draft tokens. We have no human labels, so
the target labels them itself: along its greedy answers (`SelfDistillDataModule`'s cache), sample
substitute tokens x ≠ argmax, put x in place of the answer's token t and let the target continue
greedily for `window` tokens. The substitute is *acceptable* when the rollout comes back to the
original answer: its last `min_match` tokens occur in the original continuation within `window +
slack` tokens (so " So" for " Therefore" or " 2" for " two" passes, a changed number that the
answer carries forward does not). A rollout that stops (a stop token) must end where the original
ends. Stop tokens are never substitutes.

Substitutes follow the mismatches of a well-calibrated drafter: (position, token) pairs are drawn
with probability ∝ p(token) over tokens other than the argmax, so uncertain positions, where drafts
miss, dominate. Positions whose original continuation is cut by the answer-length limit before the
comparison window ends are skipped. Each answer costs one target forward plus `window + 1` batched
forwards of its `substitutes_per_answer` rows.

Each sample is (the target's final normed hidden state at the substitute, computed with the
substitute in place (C,); `judge_signals` at the position predicting it (3,); label); batches are
`features` (B, C), `signals` (B, 3) and `labels` (B,), float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor
from tqdm.auto import tqdm

from warpdecode.datamodules.answer_samples import AnswerSamplesDataModule
from warpdecode.datamodules.self_distill import Example
from warpdecode.decoding.generate import stop_token_ids
from warpdecode.errors import ConfigError
from warpdecode.models.cache import KVCache
from warpdecode.models.judge_head import judge_signals
from warpdecode.models.transformer import Transformer

CACHE_VERSION = 1


def cut_after_stop(tokens: Sequence[int], stop_ids: set[int]) -> list[int]:
    """`tokens` up to and including the first stop token."""
    out: list[int] = []
    for token in tokens:
        out.append(token)
        if token in stop_ids:
            break
    return out


def rejoins(rollout: Sequence[int], original: Sequence[int], min_match: int, stop_ids: set[int]) -> bool:
    """Does `rollout` (the substitute, then the target's greedy tokens) come back to `original` (the
    answer's tokens after the substituted one)? Its last `min_match` tokens must occur in `original`;
    a rollout that stops must end as `original` ends."""
    rollout, original = cut_after_stop(rollout, stop_ids), cut_after_stop(original, stop_ids)
    tail = rollout[-min_match:]
    if rollout[-1] in stop_ids:
        return original[-1] in stop_ids and original[-len(tail):] == tail
    return any(original[i : i + len(tail)] == tail for i in range(len(original) - len(tail) + 1))


@torch.inference_mode()
def judge_samples(target: Transformer, examples: list[Example], *, substitutes_per_answer: int, window: int,
                  slack: int, min_match: int, stop_ids: set[int], seed: int, desc: str) -> dict[str, Tensor]:
    """`features` (N, C) float16, `signals` (N, 3) float32 and `labels` (N,) bool of substitutes drawn
    along `examples`' answers (see the module docstring), with each one's `positions` (N,) in its
    example and its token, `substitutes` (N,)."""
    L, config = target.config.n_layer, target.config
    generator = torch.Generator().manual_seed(seed)
    features, signals, labels, positions, substitutes_all = [], [], [], [], []
    for example in tqdm(examples, desc=desc, unit="answer", disable=None):
        tokens = torch.from_numpy(example.tokens.astype("int64"))  # (T,)
        T, P = len(tokens), example.prompt_length
        ended = int(tokens[-1]) in stop_ids
        # a substitute replaces tokens[t], P <= t < T - 1, predicted by logits row t - P
        last = T - 1 if ended else T - 1 - (window + slack)
        if last <= P:
            continue
        cache = KVCache.for_model(config, 1, T)
        logits = target(tokens[None, :-1], cache=cache, logits_slice=slice(P - 1, last - 1)).logits[0].float()
        alternatives = logits.softmax(-1)  # (A, V), row a predicts tokens[P + a]; then zeroed where barred
        top = alternatives.argmax(-1)
        alternatives[torch.arange(len(top)), top] = 0
        alternatives[:, sorted(stop_ids)] = 0
        alternatives[top != tokens[P:last]] = 0  # rows where the stored answer is not the argmax (numerics)
        mass = alternatives.sum(-1)  # (A,)
        k = min(substitutes_per_answer, int((mass > 0).sum()))
        if k == 0:
            continue
        rows = torch.multinomial(mass, k, replacement=False, generator=generator)  # (k,)
        substitutes = torch.multinomial(alternatives[rows], 1, generator=generator)[:, 0]  # (k,)
        starts = P + rows  # (k,) the substituted positions
        positions.append(starts)
        substitutes_all.append(substitutes)

        rollout_cache = KVCache.for_model(config, k, T + window + 1)
        rollout_cache.k[:, :, :, : T - 1] = cache.k[:, :1, :, : T - 1]
        rollout_cache.v[:, :, :, : T - 1] = cache.v[:, :1, :, : T - 1]
        rollout_cache.lengths = starts.clone()
        out = target(substitutes[:, None], cache=rollout_cache, hidden_layers=(L,))
        features.append(out.hidden_states[L][:, 0].to(torch.float16))
        signals.append(judge_signals(logits[rows], substitutes))
        steps = [substitutes]
        for step in range(window):
            steps.append(out.logits[:, -1].argmax(-1))
            if step + 1 < window:
                out = target(steps[-1][:, None], cache=rollout_cache)
        rollouts = torch.stack(steps, dim=1).tolist()  # (k, window + 1)
        for i, start in enumerate(starts.tolist()):
            original = tokens[start + 1 : start + 1 + window + slack].tolist()
            labels.append(rejoins(rollouts[i], original, min_match, stop_ids))
    if not labels:
        raise ConfigError(f"{desc}: no answer long enough to draw a substitute from")
    return {"features": torch.cat(features), "signals": torch.cat(signals), "labels": torch.tensor(labels),
            "positions": torch.cat(positions), "substitutes": torch.cat(substitutes_all)}


class JudgeDataModule(AnswerSamplesDataModule):
    cache_name: ClassVar[str] = "judge"
    sample_keys: ClassVar[tuple[str, ...]] = ("features", "signals", "labels")

    def __init__(
        self,
        target: str = "smollm2-135m-instruct",
        prompts: list[str] | None = None,
        max_prompts: int = 2048,
        max_new_tokens: int = 192,
        max_length: int = 512,
        val_fraction: float = 0.05,
        max_train_answers: int = 448,
        max_val_answers: int = 64,
        substitutes_per_answer: int = 12,
        window: int = 16,
        slack: int = 8,
        min_match: int = 6,
        batch_size: int = 256,
        seed: int = 0,
        cache_dir: str | None = None,
    ) -> None:
        """
        Args:
            target: The model to judge for.
            prompts, max_prompts, max_new_tokens, max_length, val_fraction, cache_dir: the self-distillation data
                (`SelfDistillDataModule`; the defaults reuse the drafter recipes' cache).
            max_train_answers: Draw substitutes from at most this many answers of the train split.
            max_val_answers: ... and of the val split.
            substitutes_per_answer: Substitutes drawn per answer (at distinct positions).
            window: Greedy tokens the target writes after a substitute.
            slack: How much further into the original answer the rollout may rejoin it.
            min_match: Tokens at the rollout's end that must occur in the original continuation.
            batch_size: Samples per batch.
            seed: Seed of the substitute draws.
        """
        super().__init__(target, prompts, max_prompts, max_new_tokens, max_length, val_fraction, max_train_answers,
                         max_val_answers, batch_size, cache_dir)
        for name, value in (("substitutes_per_answer", substitutes_per_answer), ("window", window),
                            ("min_match", min_match)):
            if value < 1:
                raise ConfigError(f"{name} must be positive, got {value}")
        if slack < 0 or min_match > window + 1:
            raise ConfigError(f"need slack >= 0 and min_match <= window + 1, got slack={slack}, "
                              f"min_match={min_match}, window={window}")
        self.save_hyperparameters()
        self.rollout = {"substitutes_per_answer": substitutes_per_answer, "window": window, "slack": slack,
                        "min_match": min_match, "seed": seed}

    def cache_key(self) -> dict[str, Any]:
        return {"version": CACHE_VERSION, **self.rollout}

    def make_samples(self, target: Transformer, examples: list[Example], desc: str) -> dict[str, Tensor]:
        return judge_samples(target, examples, stop_ids=stop_token_ids(target, None), desc=desc, **self.rollout)
