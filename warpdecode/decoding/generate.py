"""`generate()`: the front door. Validates the request, builds the method's components from the
registry, and runs the one draft→verify loop in `engine.py` (plain decoding is the empty drafter).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from warpdecode.decoding import registry
from warpdecode.decoding.engine import Method, run
from warpdecode.decoding.hooks import LogitsHooks, LogitsProcessorFn
from warpdecode.decoding.outputs import DecodeStats, FinishReason, GenerateOutput
from warpdecode.decoding.rules.protocols import DecodingRule
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.decoding.search.dispatch import generate_search, strategy_from_flags
from warpdecode.decoding.search.protocols import SearchStrategy
from warpdecode.decoding.stop_strings import StopMatcher, StopStrings, stop_tuple
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.tokenizer import StreamDecoder, Tokenizer

if TYPE_CHECKING:
    from warpdecode.decoding.constraints.closing import BudgetClosing
    from warpdecode.decoding.constraints.llguidance_matcher import Grammar
    from warpdecode.decoding.constraints.tree_mask import ConstrainedDecoding

__all__ = ["DecodeStats", "FinishReason", "GenerateOutput", "build_method", "encode_prompt", "generate", "generate_batch"]


def encode_prompt(tokenizer: Tokenizer, prompt: str, *, chat: bool | None) -> list[int]:
    """Token ids of `prompt`, wrapped in the chat template when `chat` (None: if the model has one)."""
    use_chat = tokenizer.chat_template is not None if chat is None else chat
    if use_chat:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
        return tokenizer.encode(text, add_special_tokens=False)
    return tokenizer.encode(prompt)


def bos_token_id(model: Backbone, tokenizer: Tokenizer | None) -> int | None:
    """The model's beginning-of-sequence token: its config's, else the tokenizer's (None: it has none)."""
    if model.config.bos_token_id is not None:
        return model.config.bos_token_id
    if tokenizer is not None and tokenizer.bos_token is not None:
        return tokenizer.backend.token_to_id(tokenizer.bos_token)
    return None


def prompt_ids(model: Backbone, tokenizer: Tokenizer | None, prompt: str | list[int], *, chat: bool | None) -> list[int]:
    """Token ids of a text or id prompt, checked to be non-empty and to leave room in the context.

    One rule for every prompt: the model needs at least one token to condition on. An empty text
    prompt wrapped in the chat template has the template's tokens; a prompt that gives no tokens at
    all (an empty text without the template, or an empty id list) starts from the model's BOS token,
    as Hugging Face's `generate()` does without inputs, and is refused only when there is none.
    """
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ConfigError("a text prompt needs a tokenizer")
        prompt = encode_prompt(tokenizer, prompt, chat=chat)
    ids = list(prompt)
    context = model.config.max_seq_len
    if not ids:
        bos = bos_token_id(model, tokenizer)
        if bos is None:
            hint = " or the chat template (--chat true)" if tokenizer is not None and tokenizer.chat_template else ""
            raise ConfigError("the prompt is empty: it gives no tokens and this model has no BOS token to start "
                              f"from; give some text{hint}")
        ids = [bos]
    if len(ids) >= context:
        raise ConfigError(f"the prompt has {len(ids)} tokens but the model's context is {context} tokens")
    return ids


def stop_token_ids(model: Backbone, tokenizer: Tokenizer | None) -> set[int]:
    ids = set(model.config.eos_token_ids)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def build_method(
    method: str = "none",
    *,
    do_sample: bool = False,
    verifier: str | None = None,
    controller: str = "fixed",
    options: dict[str, Any] | None = None,
    verifier_options: dict[str, Any] | None = None,
    controller_options: dict[str, Any] | None = None,
    device_step: bool = False,
) -> Method:
    """Components of a decoding method. `verifier=None` picks the lossless one for the sampling mode:
    greedy matching at temperature 0, speculative sampling when sampling. `device_step` runs the method
    in the device-resident step (`decoding/device_step`): with the lossless verifier and the fixed
    controller, for a drafter with a device form."""
    verifier = verifier or ("speculative_sampling" if do_sample else "greedy")
    built = registry.build("verifier", verifier, **(verifier_options or {}))
    if built.needs_sampling and not do_sample:
        raise CapabilityError(f"verifier {verifier!r} needs sampling (--temperature > 0)")
    result = Method(
        drafter=registry.build("drafter", method, **(options or {})),
        verifier=built,
        controller=registry.build("controller", controller, **(controller_options or {})),
        device_step=device_step,
    )
    if device_step:
        _check_device_step(result, do_sample)
    return result


def _check_device_step(method: Method, do_sample: bool) -> None:
    """CapabilityError unless the device step can run `method` (`generate(device_step=True)` or `step=device`)."""
    from warpdecode.decoding.controllers.fixed import FixedBudget
    from warpdecode.decoding.verifiers.greedy_match import GreedyMatch
    from warpdecode.decoding.verifiers.oracle import OracleAcceptance
    from warpdecode.decoding.verifiers.speculative_sampling import SpeculativeSampling

    if method.drafter.device_drafter is None:
        raise CapabilityError(f"drafter {method.drafter.name!r} has no device form for the device step")
    if not isinstance(method.verifier, SpeculativeSampling if do_sample else (GreedyMatch, OracleAcceptance)):
        raise CapabilityError("the device step verifies losslessly only (greedy matching, or speculative sampling "
                              "when sampling), or with the oracle verifier for timing")
    if not isinstance(method.controller, FixedBudget):
        raise CapabilityError("the device step drafts a static tree: it takes the fixed controller only")


def _oracle_settings(method: Method) -> tuple[float, int] | None:
    """(accept, seed) when the method verifies with the oracle verifier (the device step's form of it)."""
    from warpdecode.decoding.verifiers.oracle import OracleAcceptance

    verifier = method.verifier
    return (verifier.accept_probability, verifier.seed) if isinstance(verifier, OracleAcceptance) else None


def generate(
    model: Backbone,
    tokenizer: Tokenizer | None,
    prompt: str | list[int],
    *,
    max_new_tokens: int = 128,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    typical_p: float | None = None,
    repetition_penalty: float = 1.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    seed: int | None = None,
    chat: bool | None = None,
    stop_at_eos: bool = True,
    method: str | Method = "none",
    streamer: Callable[[str], None] | None = None,
    device_step: bool = False,
    logits_processor: Sequence[LogitsProcessorFn] | None = None,
    stop: str | Sequence[str] | None = None,
    stop_strings: str | Sequence[str] | None = None,
    bad_words_ids: Sequence[Sequence[int]] | None = None,
    sequence_bias: Mapping[tuple[int, ...], float] | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    penalty_alpha: float | None = None,
    mirostat: int = 0,
    mirostat_tau: float = 5.0,
    mirostat_eta: float = 0.1,
    response_format: Mapping[str, Any] | None = None,
    jump_forward: bool = True,
    constrained_sampling: str = "mask",
    close_at_budget: bool = False,
    num_beams: int = 1,
    num_return_sequences: int = 1,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    no_repeat_ngram_size: int = 0,
    num_beam_groups: int = 1,
    diversity_penalty: float = 0.0,
    search: SearchStrategy | None = None,
    rule: DecodingRule | None = None,
) -> GenerateOutput:
    """Generate a continuation of `prompt` (text, or token ids used as they are).

    Keyword names follow Hugging Face `generate()` (`frequency_penalty` / `presence_penalty`: the
    OpenAI / vLLM ones); see `SamplingConfig` for each. Greedy unless `do_sample`; penalties apply
    to greedy decoding too, the other filters only when sampling. `method` is a
    registered drafter name (`warpdecode methods`) or a built `Method`. `streamer` receives text
    increments as tokens are produced. Without a tokenizer the prompt must be token ids and the
    output text is empty. An empty prompt is allowed when it still gives the model a token: the chat
    template's, or else the model's BOS token (`prompt_ids`); a `ConfigError` says so otherwise.
    `device_step` runs the method in the device-resident step (`decoding/device_step`), greedy or sampled, for the
    methods whose drafter has a device form.

    Hooks (docs/decoding-rules.md), with Hugging Face's names and semantics: `logits_processor`,
    callables `(input_ids (1, T) int64, scores (1, V) float32) -> scores` applied after the penalties
    (with every speculative method, each tree row gets its own `input_ids`, so lossless methods stay
    exact); `bad_words_ids` (token-id sequences never generated); `sequence_bias` (token-id tuple →
    bias added to its last token's logit after the rest of the tuple); `eos_token_id` (the stop
    tokens, instead of the model's). `stop` (OpenAI's name; `stop_strings` is Hugging Face's) ends
    generation at the first stop string in the generated text, finish reason "stop": `token_ids` end
    with the token that completes it, `text` ends before it, and nothing from it on is streamed.

    `penalty_alpha` > 0 with `top_k` > 1 runs contrastive search (Hugging Face's rule,
    `decoding/rules/contrastive.py`) instead of greedy decoding; `mirostat` 1 or 2 samples with
    llama.cpp's Mirostat v1 / v2 (`mirostat_tau`, `mirostat_eta`; `decoding/rules/mirostat.py`) at
    `temperature`, instead of the top-k / top-p / min-p / typical filters. Neither takes a speculative
    method or a `response_format`. `rule` runs any built decoding rule (`registry.build("rule", NAME,
    ...)`, `warpdecode methods` lists them) in its own loop the same way.

    `response_format` constrains the output, in OpenAI's shape (`{"type": "json_schema", "json_schema":
    {"name": ..., "schema": {...}}}`, `{"type": "json_object"}`) or warpdecode's (`{"type": "regex",
    "regex": ...}`, `{"type": "grammar", "grammar": LARK}`, `{"type": "choice", "choices": [...]}`);
    every method composes with it and the lossless ones stay exact against the constrained
    distribution. The output ends with the tokenizer's EOS once the grammar is complete (finish
    reason "eos", even with `stop_at_eos=False`); "length" means the budget ran out first and the
    text may be incomplete. `jump_forward` drafts the tokens the grammar forces. `constrained_sampling`
    picks how an undrafted step's token is kept in the grammar: "mask" (the full allowed-token mask)
    or "awrs" (draw from the unconstrained row and check candidates with the matcher until one is
    allowed; the same distribution, and the same greedy tokens) (docs/structured-output.md).
    `close_at_budget` ends a constrained output that the budget would cut with a closing that completes
    the grammar within it: the model's tokens up to the last point where a closing still fits, then the
    closing and the stop token (`decoding/constraints/closing.py`). The finish reason stays "length"
    (the budget cut the model's answer: a value may be cut short) and `stats.closing_tokens` counts the
    closing's tokens; an output whose grammar cannot be completed within the budget ends with "length"
    as without it. Off by default: it rewrites the model's last tokens, and OpenAI's API cuts the text.

    Several candidates (docs/search.md): `num_beams` > 1 runs beam search (`num_beam_groups` > 1: diverse
    beam search), `num_return_sequences` > 1 with sampling n samples, with Hugging Face's options; or
    `search` runs a built search strategy (`registry.build("search", ...)`: best-of-N, First Finish
    Search). The output is then the best candidate, with every returned one in `sequences`.
    """
    if max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    _check_closing(close_at_budget, response_format)
    config = SamplingConfig(do_sample, temperature, top_k, top_p, seed, min_p, typical_p, repetition_penalty,
                            frequency_penalty, presence_penalty)
    stops = set(_as_ids(eos_token_id)) if eos_token_id is not None else stop_token_ids(model, tokenizer)
    stops = stops if stop_at_eos else set()
    hooks = LogitsHooks(tuple(logits_processor or ()), sequence_bias, bad_words_ids, tuple(sorted(stops)))
    sampler = Sampler(config, device=model.embed.weight.device, hooks=hooks)
    ids = prompt_ids(model, tokenizer, prompt, chat=chat)
    texts = stop_tuple(stop) + stop_tuple(stop_strings)
    if texts and tokenizer is None:
        raise ConfigError("stop strings need a tokenizer (the prompt was token ids without one)")
    stop_check = StopStrings(tokenizer, texts) if texts and tokenizer is not None else None
    matcher = StopMatcher(texts)  # holds back streamed text that may start a stop string
    budget = min(max_new_tokens, model.config.max_seq_len - len(ids))
    strategy = strategy_from_flags(
        search, do_sample=do_sample, num_beams=num_beams, num_return_sequences=num_return_sequences,
        length_penalty=length_penalty, early_stopping=early_stopping, no_repeat_ngram_size=no_repeat_ngram_size,
        num_beam_groups=num_beam_groups, diversity_penalty=diversity_penalty)
    if strategy is not None:
        if device_step or response_format is not None or penalty_alpha or mirostat or rule is not None:
            raise CapabilityError("a search takes no device step, response_format or decoding rule (not built yet)")
        return generate_search(model, tokenizer, ids, strategy, sampler, max_new_tokens=max_new_tokens, budget=budget,
                               stop_ids=stops, method=method, streamer=streamer, stop_strings=texts)
    built = build_method(method, do_sample=do_sample) if isinstance(method, str) else method
    stream = StreamDecoder(tokenizer) if streamer is not None and tokenizer is not None else None

    def on_tokens(tokens: list[int]) -> None:
        assert stream is not None and streamer is not None
        streamer(matcher.push(stream.push(tokens)))

    constraint = _constraint(model, tokenizer, response_format, jump_forward, constrained_sampling, sampler,
                             budget if close_at_budget else None)
    if constraint is not None and (device_step or built.device_step):
        raise CapabilityError("the device step does not take a response_format; use the engine's loop")
    rule = _rule(config, penalty_alpha, mirostat, mirostat_tau, mirostat_eta, rule)
    if rule is not None:
        from warpdecode.decoding.drafters.empty import EmptyDrafter
        from warpdecode.decoding.rules.protocols import Emitter

        if not isinstance(built.drafter, EmptyDrafter) or device_step or built.device_step:
            raise CapabilityError(f"{rule.name} decoding runs its own loop: it takes no speculative method "
                                  f"(got {built.drafter.name!r})")
        if constraint is not None:
            raise CapabilityError(f"{rule.name} decoding runs its own loop: it takes no response_format")
        emitter = Emitter(stops, budget, on_tokens if stream is not None else None,
                          stop_check.check if stop_check is not None else None, tokenizer)
        rule = rule.for_prompt(prompt, lambda text: prompt_ids(model, tokenizer, text, chat=chat))
        new, finish, stats = rule.decode(model, ids, sampler, emitter)
    elif device_step or built.device_step:
        from warpdecode.decoding.controllers.fixed import FixedBudget
        from warpdecode.decoding.device_step.loop import device_form, run_device

        _check_device_step(built, do_sample)
        controller = cast(FixedBudget, built.controller)
        if sampler.penalties or stop_check is not None:
            raise CapabilityError("the device step runs without penalties, logits hooks or stop strings")
        new, finish, stats = run_device(model, ids, device_form(built.drafter), max_new_tokens=budget, stop_ids=stops,
                                        max_nodes=min(built.max_tree_nodes, controller.max_nodes),
                                        on_tokens=on_tokens if stream is not None else None,
                                        sampling=sampler.config if do_sample else None,
                                        oracle=_oracle_settings(built))
    else:
        new, finish, stats = run(model, ids, built, sampler, max_new_tokens=budget, stop_ids=stops,
                                 on_tokens=on_tokens if stream is not None else None, constraint=constraint,
                                 stop_check=stop_check.check if stop_check is not None else None)
    if finish == "length" and budget < max_new_tokens:
        finish = "context"
    answer = StopMatcher(texts)
    text = answer.push(tokenizer.decode(new)) + answer.flush() if tokenizer else ""
    if stream is not None and streamer is not None:  # what the stream still holds back: a cut character, a stop's start
        tail = matcher.push(stream.tokenizer.decode(stream.ids)[len(stream.emitted) :]) + matcher.flush()
        if tail:
            streamer(tail)
    return GenerateOutput(token_ids=new, text=text, finish_reason=finish, stats=stats)


def _rule(config: SamplingConfig, penalty_alpha: float | None, mirostat: int, mirostat_tau: float,
          mirostat_eta: float, rule: DecodingRule | None = None) -> DecodingRule | None:
    """The decoding rule the keywords ask for (None: the engine's loop), or `rule` when one is given,
    refusing combinations that would silently drop an option."""
    if rule is not None:
        if mirostat or penalty_alpha:
            raise ConfigError(f"rule {rule.name!r} takes its options in its spec: drop --mirostat / --penalty-alpha")
        if rule.needs_sampling and not config.do_sample:
            raise ConfigError(f"rule {rule.name!r} samples: give it a --temperature > 0")
        return rule
    if mirostat:
        if penalty_alpha:
            raise ConfigError("choose one of --mirostat and --penalty-alpha (contrastive search)")
        if not config.do_sample:
            raise ConfigError("--mirostat samples: give it a --temperature > 0")
        if config.top_k or config.top_p is not None or config.min_p is not None or config.typical_p is not None:
            raise ConfigError("--mirostat replaces the --top-k/--top-p/--min-p/--typical-p filters; drop them")
        return registry.build("rule", "mirostat", version=mirostat, tau=mirostat_tau, eta=mirostat_eta)
    if penalty_alpha is None or penalty_alpha == 0:
        return None
    if config.do_sample:
        raise ConfigError("--penalty-alpha (contrastive search) chooses greedily: it takes no --temperature")
    return registry.build("rule", "contrastive", penalty_alpha=penalty_alpha, top_k=config.top_k or 0)


def _as_ids(eos_token_id: int | Sequence[int]) -> list[int]:
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
        raise ConfigError(f"eos_token_id must be a token id >= 0 or a list of them, got {eos_token_id!r}")
    return ids


def _check_closing(close_at_budget: bool, response_format: object) -> None:
    """ConfigError unless `close_at_budget` is a bool, and True only with a `response_format`."""
    if not isinstance(close_at_budget, bool):
        raise ConfigError(f"close_at_budget must be true or false, got {close_at_budget!r}")
    if close_at_budget and (response_format is None or
                            (isinstance(response_format, Mapping) and response_format.get("type") == "text")):
        raise ConfigError("close_at_budget closes a constrained output: it needs a response_format "
                          "(--json-schema, --regex, --grammar or --choice)")


def _closing(tokenizer: Tokenizer | None, grammar: Grammar, budget: int | None) -> BudgetClosing | None:
    """Budget-aware closing of one output of `grammar` within `budget` tokens (None: no closing)."""
    if budget is None or tokenizer is None:
        return None
    from warpdecode.decoding.constraints.closing import BudgetClosing

    return BudgetClosing.of(tokenizer, grammar, budget)


def _constraint(model: Backbone, tokenizer: Tokenizer | None, response_format: Mapping[str, Any] | None,
                jump_forward: bool, constrained_sampling: str, sampler: Sampler,
                closing_budget: int | None = None) -> ConstrainedDecoding | None:
    """The engine's grammar hook for `response_format` (None: unconstrained), closing the output within
    `closing_budget` tokens when given."""
    if constrained_sampling not in ("mask", "awrs"):
        raise ConfigError(f"constrained_sampling must be 'mask' or 'awrs', got {constrained_sampling!r}")
    if response_format is None:
        return None
    from warpdecode.decoding.constraints.formats import compile_response_format
    from warpdecode.decoding.constraints.tree_mask import ConstrainedDecoding

    grammar = compile_response_format(response_format, tokenizer, vocab_size=model.config.vocab_size,
                                      stop_ids=stop_token_ids(model, tokenizer))
    if grammar is None:
        return None
    closing = _closing(tokenizer, grammar, closing_budget)
    if constrained_sampling == "awrs":
        from warpdecode.decoding.constraints.awrs import AdaptiveRejection

        return AdaptiveRejection(grammar.state(), sampler, jump_forward=jump_forward, closing=closing)
    return ConstrainedDecoding(grammar.state(), jump_forward=jump_forward, closing=closing)


def generate_batch(
    model: Backbone,
    tokenizer: Tokenizer | None,
    prompts: Sequence[str | list[int]],
    *,
    max_new_tokens: int = 128,
    chat: bool | None = None,
    stop_at_eos: bool = True,
    response_format: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
    jump_forward: bool = True,
    close_at_budget: bool = False,
    **sampling: Any,
) -> list[GenerateOutput]:
    """Plain decoding of several prompts in one batch (one forward per step for all of them).

    `sampling` takes `generate()`'s sampling keywords (`do_sample`, `temperature`, `top_k`, `top_p`,
    `min_p`, `typical_p`, the penalties, `seed`); one random generator serves the whole batch, so
    sampled outputs differ from one-by-one runs with the same seed. Greedy outputs equal
    `generate()`'s up to floating-point ties (batched matmuls may round differently). Each output's
    `stats.seconds` runs from the batch's start to that prompt's last token.

    `response_format` (as in `generate()`): one for every prompt, or a list of one per prompt (None: free).
    The rows then decode as the server's continuous batch does, each constrained row with its own
    matcher state: each row's tokens are those of `generate()` alone with its format (greedy, or sampled
    with a seed: each row then draws from its own generator seeded with `seed`). `close_at_budget` (as in
    `generate()`) closes each constrained row within its budget.
    """
    from warpdecode.decoding.batch import decode_batch

    if max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    if not prompts:
        raise ConfigError("generate_batch needs at least one prompt")
    _check_closing(close_at_budget, response_format)
    try:
        config = SamplingConfig(**sampling)
    except TypeError as error:
        raise ConfigError(f"generate_batch: {error}; sampling options: {', '.join(SamplingConfig.__dataclass_fields__)}") from None
    ids = [prompt_ids(model, tokenizer, p, chat=chat) for p in prompts]
    budgets = [min(max_new_tokens, model.config.max_seq_len - len(i)) for i in ids]
    stops = stop_token_ids(model, tokenizer) if stop_at_eos else set()
    from warpdecode.decoding.constraints.formats import compile_row_formats

    grammars = compile_row_formats(response_format, tokenizer, rows=len(ids), vocab_size=model.config.vocab_size,
                                   stop_ids=stop_token_ids(model, tokenizer))
    if close_at_budget and all(g is None for g in grammars):
        _check_closing(close_at_budget, None)  # a list of free rows only: nothing to close
    if any(g is not None for g in grammars):
        from warpdecode.decoding.constraints.rows import decode_rows

        closings = [None if g is None or not close_at_budget else _closing(tokenizer, g, b)
                    for g, b in zip(grammars, budgets, strict=True)]
        results = decode_rows(model, ids, config, budgets=budgets, grammars=grammars, stop_ids=stops,
                              plain=lambda: build_method("none", do_sample=config.do_sample), jump_forward=jump_forward,
                              closings=closings)
    else:
        results = decode_batch(model, ids, Sampler(config, device=model.embed.weight.device), budgets=budgets,
                               stop_ids=stops)
    outputs = []
    for (new, finish, stats), budget in zip(results, budgets, strict=True):
        if finish == "length" and budget < max_new_tokens:
            finish = "context"
        outputs.append(GenerateOutput(new, tokenizer.decode(new) if tokenizer else "", finish, stats))
    return outputs
