"""From `generate()`'s Hugging Face flags to a search strategy, and from its result to a `GenerateOutput`.

The flags pick the strategy as Hugging Face's `generate()` picks its mode: `num_beams > 1` with
`num_beam_groups > 1` is diverse beam search, `num_beams > 1` beam search, `num_return_sequences > 1`
with sampling n samples; anything else is single-sequence decoding (the engine).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from warpdecode.decoding import registry
from warpdecode.decoding.engine import Method
from warpdecode.decoding.outputs import FinishReason, GenerateOutput
from warpdecode.decoding.sampler import Sampler
from warpdecode.decoding.search.protocols import SearchStrategy
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.tokenizer import Tokenizer


def strategy_from_flags(search: SearchStrategy | None, *, do_sample: bool, num_beams: int, num_return_sequences: int,
                        length_penalty: float, early_stopping: bool | str, no_repeat_ngram_size: int,
                        num_beam_groups: int, diversity_penalty: float) -> SearchStrategy | None:
    """The strategy the Hugging Face flags ask for, or `search` when one is given (then the flags must keep
    their defaults: its own options hold them); None for single-sequence decoding."""
    if search is not None:
        flags = (num_beams, num_return_sequences, length_penalty, early_stopping, no_repeat_ngram_size,
                 num_beam_groups, diversity_penalty)
        if flags != (1, 1, 1.0, False, 0, 1, 0.0):
            raise ConfigError(f"search {search.name!r} takes its options in its spec (e.g. {search.name}:n=8); "
                              "drop --num-beams / --num-return-sequences and the other beam flags")
        return search
    if num_beams < 1 or num_beam_groups < 1 or num_return_sequences < 1:
        raise ConfigError(f"--num-beams, --num-beam-groups and --num-return-sequences must be >= 1, got "
                          f"{num_beams}, {num_beam_groups}, {num_return_sequences}")
    if num_beams == 1:
        if num_beam_groups > 1 or diversity_penalty:
            raise ConfigError("--num-beam-groups and --diversity-penalty need --num-beams > 1")
        if no_repeat_ngram_size:
            raise ConfigError("--no-repeat-ngram-size runs with beam search here: give --num-beams > 1")
        if num_return_sequences == 1:
            return None
        if not do_sample:
            raise ConfigError("--num-return-sequences > 1 needs --num-beams > 1 or sampling (--temperature > 0): "
                              "greedy decoding has one answer")
        return registry.build("search", "sample", n=num_return_sequences)
    beam = {"num_beams": num_beams, "num_return_sequences": num_return_sequences, "length_penalty": length_penalty,
            "early_stopping": early_stopping, "no_repeat_ngram_size": no_repeat_ngram_size}
    if num_beam_groups > 1:
        return registry.build("search", "diverse_beam", num_beam_groups=num_beam_groups,
                              diversity_penalty=diversity_penalty, **beam)
    if diversity_penalty:
        raise ConfigError("--diversity-penalty needs --num-beam-groups > 1")
    return registry.build("search", "beam", **beam)


def _per_row(method: str | Method) -> Callable[[], Method]:
    """A builder of one row's own method (drafters keep per-request state): by name, or a copy."""
    if isinstance(method, Method):
        return lambda: copy.deepcopy(method)
    from warpdecode.decoding.generate import build_method  # generate() imports this module

    return lambda: build_method(method, do_sample=True)


def generate_search(model: Backbone, tokenizer: Tokenizer | None, ids: list[int], strategy: SearchStrategy,
                    sampler: Sampler, *, max_new_tokens: int, budget: int, stop_ids: set[int], method: str | Method,
                    streamer: Callable[[str], None] | None, stop_strings: tuple[str, ...] = ()) -> GenerateOutput:
    """Run `strategy` on the prompt `ids` and return its best candidate as the output, all of them in
    `sequences`. `budget` is `max_new_tokens` cut to the context; `method` the speculative method asked
    for (a drafter name or a built method; refused unless the strategy composes with speculation, which
    then builds one per row: a built method is copied); `streamer` gets the best text once, at the end."""
    drafter = method if isinstance(method, str) else method.drafter.name
    speculative: dict[str, Callable[[], Method]] = {}
    if drafter != "none":
        if not strategy.composes_with_speculation:
            raise CapabilityError(f"search {strategy.name!r} does not run with a drafter (method {drafter!r}); "
                                  "drop --method or the search flags")
        speculative["method"] = _per_row(method)
    if strategy.needs_sampling and not sampler.config.do_sample:
        raise CapabilityError(f"search {strategy.name!r} draws samples: give --temperature > 0 (do_sample=True)")
    if stop_strings and not strategy.takes_stop_strings:
        raise CapabilityError(f"search {strategy.name!r} takes no stop strings (best_of_n, first_finish and "
                              "sampled num_return_sequences do)")
    extra: dict[str, object] = {"stop_strings": stop_strings} if stop_strings else {}
    result = strategy.search(model, tokenizer, ids, sampler, max_new_tokens=budget, stop_ids=stop_ids,
                             **extra, **speculative)  # type: ignore[arg-type]
    for candidate in result.candidates:
        if candidate.finish_reason == "length" and budget < max_new_tokens:
            candidate.finish_reason = "context"
    best = result.candidates[0]
    if streamer is not None:
        streamer(best.text)
    finish: FinishReason = best.finish_reason
    return GenerateOutput(list(best.token_ids), best.text, finish, result.stats, sequences=result.candidates)
