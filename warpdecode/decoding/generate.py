"""`generate()`: the front door. Validates the request, builds the method's components from the
registry, and runs the one draft→verify loop in `engine.py` (plain decoding is the empty drafter).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from warpdecode.decoding import registry
from warpdecode.decoding.engine import Method, run
from warpdecode.decoding.outputs import DecodeStats, FinishReason, GenerateOutput
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.tokenizer import StreamDecoder, Tokenizer

if TYPE_CHECKING:
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
    in the device-resident step (`decoding/device_step`): greedy, with the greedy verifier and the
    fixed controller, for a drafter with a device form."""
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

    if method.drafter.device_drafter is None:
        raise CapabilityError(f"drafter {method.drafter.name!r} has no device form for the device step")
    if do_sample or not isinstance(method.verifier, GreedyMatch):
        raise CapabilityError("the device step runs greedy decoding (the greedy verifier) without penalties")
    if not isinstance(method.controller, FixedBudget):
        raise CapabilityError("the device step drafts a static tree: it takes the fixed controller only")


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
    response_format: Mapping[str, Any] | None = None,
    jump_forward: bool = True,
    constrained_sampling: str = "mask",
) -> GenerateOutput:
    """Generate a continuation of `prompt` (text, or token ids used as they are).

    Keyword names follow Hugging Face `generate()` (`frequency_penalty` / `presence_penalty`: the
    OpenAI / vLLM ones); see `SamplingConfig` for each. Greedy unless `do_sample`; penalties apply
    to greedy decoding too, the other filters only when sampling. `method` is a
    registered drafter name (`warpdecode methods`) or a built `Method`. `streamer` receives text
    increments as tokens are produced. Without a tokenizer the prompt must be token ids and the
    output text is empty. An empty prompt is allowed when it still gives the model a token: the chat
    template's, or else the model's BOS token (`prompt_ids`); a `ConfigError` says so otherwise.
    `device_step` runs greedy decoding with the device-resident step (`decoding/device_step`), for the
    methods whose drafter has a device form.

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
    """
    if max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    config = SamplingConfig(do_sample, temperature, top_k, top_p, seed, min_p, typical_p, repetition_penalty,
                            frequency_penalty, presence_penalty)
    sampler = Sampler(config, device=model.embed.weight.device)
    ids = prompt_ids(model, tokenizer, prompt, chat=chat)
    built = build_method(method, do_sample=do_sample) if isinstance(method, str) else method
    budget = min(max_new_tokens, model.config.max_seq_len - len(ids))
    stream = StreamDecoder(tokenizer) if streamer is not None and tokenizer is not None else None

    def on_tokens(tokens: list[int]) -> None:
        assert stream is not None and streamer is not None
        streamer(stream.push(tokens))

    stops = stop_token_ids(model, tokenizer) if stop_at_eos else set()
    constraint = _constraint(model, tokenizer, response_format, jump_forward, constrained_sampling, sampler)
    if constraint is not None and (device_step or built.device_step):
        raise CapabilityError("the device step does not take a response_format; use the engine's loop")
    if device_step or built.device_step:
        from warpdecode.decoding.controllers.fixed import FixedBudget
        from warpdecode.decoding.device_step.loop import device_form, run_device

        _check_device_step(built, do_sample)
        controller = cast(FixedBudget, built.controller)
        if sampler.penalties:
            raise CapabilityError("the device step runs greedy decoding (the greedy verifier) without penalties")
        new, finish, stats = run_device(model, ids, device_form(built.drafter), max_new_tokens=budget, stop_ids=stops,
                                        max_nodes=min(built.max_tree_nodes, controller.max_nodes),
                                        on_tokens=on_tokens if stream is not None else None)
    else:
        new, finish, stats = run(model, ids, built, sampler, max_new_tokens=budget, stop_ids=stops,
                                 on_tokens=on_tokens if stream is not None else None, constraint=constraint)
    if finish == "length" and budget < max_new_tokens:
        finish = "context"
    return GenerateOutput(token_ids=new, text=tokenizer.decode(new) if tokenizer else "", finish_reason=finish, stats=stats)


def _constraint(model: Backbone, tokenizer: Tokenizer | None, response_format: Mapping[str, Any] | None,
                jump_forward: bool, constrained_sampling: str, sampler: Sampler) -> ConstrainedDecoding | None:
    """The engine's grammar hook for `response_format` (None: unconstrained)."""
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
    if constrained_sampling == "awrs":
        from warpdecode.decoding.constraints.awrs import AdaptiveRejection

        return AdaptiveRejection(grammar.state(), sampler, jump_forward=jump_forward)
    return ConstrainedDecoding(grammar.state(), jump_forward=jump_forward)


def generate_batch(
    model: Backbone,
    tokenizer: Tokenizer | None,
    prompts: Sequence[str | list[int]],
    *,
    max_new_tokens: int = 128,
    chat: bool | None = None,
    stop_at_eos: bool = True,
    **sampling: Any,
) -> list[GenerateOutput]:
    """Plain decoding of several prompts in one batch (one forward per step for all of them).

    `sampling` takes `generate()`'s sampling keywords (`do_sample`, `temperature`, `top_k`, `top_p`,
    `min_p`, `typical_p`, the penalties, `seed`); one random generator serves the whole batch, so
    sampled outputs differ from one-by-one runs with the same seed. Greedy outputs equal
    `generate()`'s up to floating-point ties (batched matmuls may round differently). Each output's
    `stats.seconds` runs from the batch's start to that prompt's last token.
    """
    from warpdecode.decoding.batch import decode_batch

    if max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    if not prompts:
        raise ConfigError("generate_batch needs at least one prompt")
    try:
        config = SamplingConfig(**sampling)
    except TypeError as error:
        raise ConfigError(f"generate_batch: {error}; sampling options: {', '.join(SamplingConfig.__dataclass_fields__)}") from None
    ids = [prompt_ids(model, tokenizer, p, chat=chat) for p in prompts]
    budgets = [min(max_new_tokens, model.config.max_seq_len - len(i)) for i in ids]
    results = decode_batch(model, ids, Sampler(config, device=model.embed.weight.device), budgets=budgets,
                           stop_ids=stop_token_ids(model, tokenizer) if stop_at_eos else set())
    outputs = []
    for (new, finish, stats), budget in zip(results, budgets, strict=True):
        if finish == "length" and budget < max_new_tokens:
            finish = "context"
        outputs.append(GenerateOutput(new, tokenizer.decode(new) if tokenizer else "", finish, stats))
    return outputs
