"""n samples of one prompt with speculative decoding: each row drafts and verifies on its own.

The sampling strategies (`sample`, `best_of_n`, `first_finish`) compose with the drafters that can
draft for a row of a batch (`Drafter.supports_batch`: prompt lookup, token recycling, lookahead,
adaptive n-gram, copy input, retrieval): the n rows run in a `ContinuousBatch`, each with its own
method (drafter state, controller, lossless verifier: speculative sampling) and its own random
generator, seeded `seed + i` for row i. Speculative sampling keeps each row's distribution the
target's (the same filters, penalties and hooks), so the strategy draws from the same distribution
as without speculation; the draws themselves differ (each row has its own generator, and
speculative sampling uses the randomness differently), as they differ between seeds.
`tests/decoding/search/test_speculative_rows.py` checks it: greedy-limit rows equal plain decoding,
and the sampled rows' token frequencies match plain sampling's on a tiny vocabulary.

Each row is prefilled on its own (n prefills of the prompt, where `sample_rows` prefills once), and a
candidate's log-probability under the target is computed after the fact in one forward over the
prompt and its tokens (speculative steps keep no per-token log-probabilities).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

import torch

from warpdecode.decoding.continuous import ContinuousBatch, Row
from warpdecode.decoding.engine import Method
from warpdecode.decoding.outputs import Candidate, DecodeStats
from warpdecode.decoding.sampler import Sampler
from warpdecode.decoding.search.protocols import SearchResult
from warpdecode.decoding.search.rows import with_text
from warpdecode.decoding.stop_strings import StopStrings
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.tokenizer import Tokenizer


def row_sampler(sampler: Sampler, seed: int | None) -> Sampler:
    """`sampler`'s filters, penalties and hooks with a random generator of its own, seeded `seed`
    (None: from the system's entropy)."""
    row = copy.copy(sampler)
    if sampler.generator is not None:
        row.generator = torch.Generator(device=sampler.generator.device)
        if seed is None:
            row.generator.seed()
        else:
            row.generator.manual_seed(seed)
    return row


@torch.inference_mode()
def target_logprobs(model: Backbone, prompt: list[int], candidates: list[Candidate]) -> None:
    """Set each candidate's `logprob`: the sum of the target's log-probabilities of its tokens after
    `prompt` (the raw distribution), from one forward over the prompt and the tokens."""
    device = model.embed.weight.device
    for c in candidates:
        if not c.token_ids:
            continue
        logits = model(torch.tensor([prompt + c.token_ids], device=device),
                       logits_slice=slice(len(prompt) - 1, -1)).logits[0]  # (T, V)
        logp = torch.log_softmax(logits.float(), dim=-1)
        c.logprob = float(logp.gather(1, torch.tensor(c.token_ids, device=device)[:, None]).sum())


def sample_rows_speculative(model: Backbone, tokenizer: Tokenizer | None, prompt: list[int], sampler: Sampler, n: int,
                            method: Callable[[], Method], *, max_new_tokens: int, stop_ids: set[int],
                            stop_at_first: bool = False, stop_strings: tuple[str, ...] = ()) -> SearchResult:
    """`sample_rows` with speculative decoding: `method()` builds one row's method (a drafter that
    `supports_batch`, a lossless verifier). Candidates in row order, unranked; row i seeded
    `sampler.config.seed + i` (or at random without a seed)."""
    if stop_strings and tokenizer is None:
        raise ConfigError("stop strings need a tokenizer")
    start = time.perf_counter()
    stats = DecodeStats(prompt_tokens=len(prompt))
    batch = ContinuousBatch(model, max_rows=n, max_len=len(prompt) + max_new_tokens, stop_ids=stop_ids)
    seed = sampler.config.seed
    rows: list[Row] = []
    checks: dict[int, StopStrings] = {}
    for i in range(n):
        row = batch.add(prompt, max_new_tokens=max_new_tokens, sampler=row_sampler(sampler, None if seed is None else seed + i),
                        method=method())
        rows.append(row)
        if stop_strings and tokenizer is not None:
            checks[id(row)] = StopStrings(tokenizer, stop_strings)
    stats.time_to_first_token = time.perf_counter() - start
    fresh = list(rows)  # the rows whose last tokens are still to be checked for stop strings
    while True:
        for row in fresh:
            check = checks.get(id(row))
            keep = check.check(row.last) if check is not None and row.last else None
            if keep is not None:
                del row.new[len(row.new) - len(row.last) + keep :]
                row.finish = "stop"
        if stop_at_first and any(row.finish in ("eos", "stop") for row in rows):
            for row in rows:
                row.finish = row.finish or "length"
        for row in [row for row in batch.rows if row.finish is not None]:
            batch.remove(row)
        if not batch.rows:
            break
        fresh = batch.step()
        stats.target_forwards += 1
    for row in rows:
        stats.accepted_per_step += row.stats.accepted_per_step
        stats.proposed_per_step += row.stats.proposed_per_step
    candidates = [Candidate(list(row.new), row.finish or "length") for row in rows]
    stats.search_tokens = sum(len(c.token_ids) for c in candidates)
    stats.seconds = time.perf_counter() - start
    stats.target_seconds = stats.seconds - stats.time_to_first_token
    target_logprobs(model, prompt, candidates)
    return SearchResult(with_text(candidates, tokenizer, stop_strings), stats)
