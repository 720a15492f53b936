"""`warpdecode generate`: one prompt, any method, search strategy, decoding rule or constraint."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from warpdecode.commands.common import _check_one, _check_threads, _deprecated, _load_target

if TYPE_CHECKING:
    from warpdecode.decoding.rules.protocols import DecodingRule
    from warpdecode.decoding.search.protocols import SearchStrategy
    from warpdecode.decoding.specs import MethodSpec
    from warpdecode.models.backbone import Backbone
    from warpdecode.models.tokenizer import Tokenizer




def generate(
    *,
    model: str | None = None,
    package: Path | None = None,
    backend: str = "torch",
    device: str = "cpu",
    dtype: str = "fp32",
    prompt: str,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    typical_p: float | None = None,
    repetition_penalty: float = 1.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    seed: int | None = None,
    chat: bool | None = None,
    method: str | None = None,
    method_options: dict[str, Any] | None = None,
    verifier: str | None = None,
    verifier_options: dict[str, Any] | None = None,
    controller: str | None = None,
    controller_options: dict[str, Any] | None = None,
    stop: str | list[str] | None = None,
    bad_words: str | list[str] | None = None,
    eos_token_id: int | list[int] | None = None,
    penalty_alpha: float | None = None,
    mirostat: int = 0,
    mirostat_tau: float = 5.0,
    mirostat_eta: float = 0.1,
    json_output: bool = False,
    threads: int | None = None,
    json_schema: Path | None = None,
    regex: str | None = None,
    grammar: Path | None = None,
    choice: str | None = None,
    jump_forward: bool = True,
    constrained_sampling: str = "mask",
    close_at_budget: bool = False,
    num_beams: int = 1,
    num_return_sequences: int = 1,
    length_penalty: float = 1.0,
    early_stopping: str = "false",
    no_repeat_ngram_size: int = 0,
    num_beam_groups: int = 1,
    diversity_penalty: float = 0.0,
) -> None:
    """Generate text from a prompt, streaming it to the terminal.

    A method and its options are written NAME[:KEY=VALUE...], as in `warpdecode bench --methods`:
    `warpdecode generate --prompt "Hi" --method draft_model:layers=10:num_tokens=4`.

    A masked diffusion LM (a bidirectional --model) decodes its answer in parallel instead: --method
    names a commit policy (default fixed, one token per step; `warpdecode methods` lists them) with
    its options plus block_length (8), eot_stop and kv_cache (none, prefix or dual: Fast-dLLM's
    approximate reuse of keys/values within a block), --max-new-tokens is the answer region, and
    --temperature (with --seed) samples each step's candidates: `warpdecode generate --model
    models/dlm --prompt "add:347+85=" --max-new-tokens 16 --method threshold:threshold=0.8`. A constraint
    flag keeps its answer in the grammar: a commit is made only while the answer stays completable.

    Args:
        model: model directory, .gguf file, or model name (default: smollm2-135m-instruct).
        package: an inference package (`warpdecode export`) to run instead of --model; its trained
            drafters run with --method NAME and no path.
        backend: the one backend to run on (`bench --backends` compares several; --backends NAME
            is read as --backend NAME here): torch; cudagraphs (--model on --device cuda: decode and
            verify steps replay CUDA graphs); onnxruntime (the fused graph on the CPU where the
            package has one), onnxruntime-portable (the standard-ONNX step graph), or onnxruntime-int8
            / -int4 (lossy; exported with --quantize), which need --package.
        device: cpu, or cuda (a CUDA device such as cuda:1) for --model on torch; with a package's
            onnxruntime backends also cuda or tensorrt where ONNX Runtime has those providers.
        dtype: precision of --model's weights, activations and KV cache: fp32 (the exactness
            oracle), bf16 or fp16 (for GPUs: a verify step then costs little more than a one-token
            step; outputs can differ from fp32 ones, so compare with plain decoding in the same
            precision), or q8 / q4: the target decodes from weight-only int8 / int4 weights (CPU; one
            copy of the weights; lossless methods reproduce plain decoding of the same quantised
            target), or native: a GGUF model's own quantised weights (Q4_1 blocks go into the int4
            kernel as they are). A package runs in the precision it was exported in.
        prompt: the prompt text. An empty prompt is generated from when it still gives the model a
            token: the chat template's, or else the model's BOS token (refused when it has neither).
        max_new_tokens: largest number of tokens to generate.
        temperature: 0 for greedy decoding; > 0 samples at this temperature.
        top_k: sample only among the k most likely tokens.
        top_p: nucleus sampling mass in (0, 1].
        min_p: keep tokens with at least this fraction of the top token's probability.
        typical_p: locally typical sampling mass in (0, 1].
        repetition_penalty: > 1 discourages tokens already in the prompt or output (1: off); also greedy.
        frequency_penalty: subtracted from a generated token's logit per occurrence; also greedy.
        presence_penalty: subtracted from the logit of every token generated so far; also greedy.
        seed: random seed for sampling.
        chat: wrap the prompt in the model's chat template (default: when the model has one).
        method: decoding method NAME[:KEY=VALUE...]: a drafter from `warpdecode methods` and its
            options, e.g. draft_model:layers=10:num_tokens=4; none = plain decoding (the default, or
            the method a package was exported with). Values are int, float, true/false, null or
            text. One method (`bench --methods` compares several; --methods is read as --method).
            A search strategy (best_of_n:n=8) or a decoding rule (`warpdecode methods`, kinds search
            and rule) runs its own loop instead of a drafter.
        method_options: deprecated: the drafter's options as JSON; write them in --method NAME:KEY=VALUE.
        verifier: acceptance rule NAME[:KEY=VALUE...], e.g. judge:path=models/judge:threshold=0.5;
            default: greedy matching, or speculative sampling when sampling.
        verifier_options: deprecated: the verifier's options as JSON; write --verifier NAME:KEY=VALUE.
        controller: draft budget per step NAME[:KEY=VALUE...]: fixed (the default), or adaptive
            (grows while drafts are accepted), e.g. adaptive:initial=4.
        controller_options: deprecated: the controller's options as JSON; write --controller NAME:KEY=VALUE.
        stop: stop string: generation ends at its first occurrence in the generated text, which is
            printed up to it, not including it (OpenAI's rule). Several: a JSON list, --stop
            '["END", "\\n\\n"]' (escapes such as \\n are read inside the list), or --stop+ A --stop+ B.
        bad_words: words never generated, comma-separated (or a JSON list): each is forbidden as its
            tokens as written and with a leading space (how a word appears mid-sentence).
        eos_token_id: the token id(s) that end generation instead of the model's EOS tokens (a JSON
            list for several).
        penalty_alpha: contrastive search's degeneration penalty in (0, 1] (Hugging Face's name):
            greedy over the --top-k most likely tokens, scored (1 - alpha) * probability - alpha *
            the candidate's largest cosine similarity to earlier hidden states; no --method.
        mirostat: 1 or 2 samples with llama.cpp's Mirostat v1 / v2 (0: off), steering the sampled
            tokens' surprise to --mirostat-tau; needs --temperature > 0, replaces the top-k/top-p/
            min-p/typical filters; no --method.
        mirostat_tau: Mirostat's target surprise in bits (llama.cpp's default 5.0).
        mirostat_eta: Mirostat's learning rate (llama.cpp's default 0.1).
        json_output: print one JSON object {"text", "token_ids", "stats"} instead of streaming (also --json);
            with several sequences also "sequences", best first.
        threads: CPU threads for torch (default: torch's choice).
        json_schema: constrain the output to JSON valid against the JSON Schema in this file (compact
            JSON; docs/structured-output.md). At most one of --json-schema, --regex, --grammar, --choice.
        regex: constrain the output to match this regular expression.
        grammar: constrain the output to the Lark grammar (or GBNF) in this file.
        choice: constrain the output to one of these comma-separated strings.
        jump_forward: draft the tokens a constraint forces (free draft tokens; the output is the same).
        constrained_sampling: how an undrafted step keeps a constraint: mask (the full allowed-token
            mask) or awrs (check candidates from the unconstrained row until one is allowed: the same
            distribution and greedy tokens; --temperature only, no top-k/top-p/min-p/typical-p).
        close_at_budget: with a constraint, end an output that --max-new-tokens would cut with a closing
            that completes it (valid JSON, say) within the budget: the model's tokens up to the last point
            where a closing fits, then the closing. The stop reason stays length (the answer was cut);
            --json reports stats.closing_tokens, the closing's tokens. Off by default.
        num_beams: > 1 runs beam search with this many beams (Hugging Face's rules and outputs); a search
            method (best_of_n, first_finish, sample: `warpdecode methods`) is named with --method instead,
            e.g. best_of_n:n=8:scorer=logprob. See docs/search.md.
        num_return_sequences: how many sequences to print, best first: beams, or samples when sampling.
        length_penalty: beam search ranks a finished sequence by its log-probability / length ** this.
        early_stopping: beam search stops: true (when num_beams sequences finished), false (when no open
            beam can still win, a heuristic) or never (only when none can, the canonical rule).
        no_repeat_ngram_size: beam search never repeats an n-gram of this size (prompt included); 0: off.
        num_beam_groups: > 1 runs diverse beam search with the beams split into this many groups.
        diversity_penalty: diverse beam search lowers a token's log-probability by this much per earlier
            group that chose it at the same step.
    """
    from warpdecode.decoding.generate import generate as run_generate
    from warpdecode.errors import ConfigError

    if temperature < 0:
        raise ConfigError(f"--temperature must be >= 0, got {temperature}")
    _check_one(backend, "--backend", "backend", "--backends")
    _check_threads(threads)
    if threads is not None:
        torch.set_num_threads(threads)
    response_format = _response_format(json_schema, regex, grammar, choice)
    target, tokenizer, drafter_options, default_method = _load_target(model, package, backend, device, threads, dtype)
    if not target.config.causal:
        if top_k is not None or top_p is not None or min_p is not None or typical_p is not None:
            raise ConfigError("a diffusion LM samples with --temperature only (no top-k/top-p/min-p/typical filters)")
        if constrained_sampling != "mask":
            raise ConfigError("a diffusion LM keeps a constraint by checking its commits: drop --constrained-sampling")
        if close_at_budget:
            raise ConfigError("a diffusion LM decodes a fixed answer region: drop --close-at-budget")
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        _generate_diffusion(target, tokenizer, prompt, method or "fixed", method_options, max_new_tokens,
                            json_output, temperature, generator, response_format)
        return
    search = _search_method(method)
    rule = _rule_method(method)
    spec, warnings = _generate_spec("none" if search or rule else method or default_method, method_options, verifier,
                                    verifier_options, controller, controller_options)
    built = spec.with_defaults(drafter_options).build(do_sample=temperature > 0)
    for line in warnings:  # once the method is built: a refused one is reported in one line
        print(line, file=sys.stderr)

    def stream(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    out = run_generate(
        target,
        tokenizer,
        prompt,
        max_new_tokens=max_new_tokens,
        do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else 1.0,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        typical_p=typical_p,
        repetition_penalty=repetition_penalty,
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
        seed=seed,
        chat=chat,
        method=built,
        streamer=None if json_output or num_return_sequences > 1 else stream,
        stop=stop,
        bad_words_ids=_bad_words_ids(tokenizer, bad_words) if bad_words is not None else None,
        eos_token_id=eos_token_id,
        penalty_alpha=penalty_alpha,
        mirostat=mirostat,
        mirostat_tau=mirostat_tau,
        mirostat_eta=mirostat_eta,
        response_format=response_format,
        jump_forward=jump_forward,
        constrained_sampling=constrained_sampling,
        close_at_budget=close_at_budget,
        num_beams=num_beams,
        num_return_sequences=num_return_sequences,
        length_penalty=length_penalty,
        early_stopping=_early_stopping(early_stopping),
        no_repeat_ngram_size=no_repeat_ngram_size,
        num_beam_groups=num_beam_groups,
        diversity_penalty=diversity_penalty,
        search=search,
        rule=rule,
    )
    if json_output:
        print(json.dumps({"text": out.text, "token_ids": out.token_ids, "finish_reason": out.finish_reason,
                          "stats": out.stats.to_dict()}
                         | ({"sequences": [asdict(c) for c in out.sequences]} if out.sequences else {})))
    else:
        if num_return_sequences > 1:
            for i, c in enumerate(out.sequences):
                score = "" if c.score is None else f", score {c.score:.4f}"
                print(f"--- sequence {i + 1} ({c.finish_reason}{score}) ---\n{c.text}")
        s = out.stats
        print()
        print(f"[{s.new_tokens} tokens in {s.seconds:.2f} s, {s.tokens_per_second:.1f} tok/s, tau {s.tau:.2f}, "
              f"first token {s.time_to_first_token * 1000:.0f} ms, stop: {out.finish_reason}]", file=sys.stderr)


def _bad_words_ids(tokenizer: Tokenizer | None, words: str | list[str]) -> list[list[int]]:
    """The token sequences of `--bad-words`: each word as written and after a space, without duplicates."""
    from warpdecode.errors import ConfigError

    items = [w.strip() for w in (words.split(",") if isinstance(words, str) else words)]
    if tokenizer is None or not all(items):
        raise ConfigError(f"--bad-words needs a model with a tokenizer and non-empty words, got {words!r}")
    out: list[list[int]] = []
    for word in items:
        for ids in (tokenizer.encode(word, add_special_tokens=False), tokenizer.encode(" " + word, add_special_tokens=False)):
            if ids and ids not in out:
                out.append(ids)
    return out


def _response_format(json_schema: Path | None, regex: str | None, grammar: Path | None,
                     choice: str | None) -> dict[str, Any] | None:
    """`generate`'s response_format from the constraint flags (None: none given)."""
    from warpdecode.errors import ConfigError

    given = [flag for flag, value in (("--json-schema", json_schema), ("--regex", regex), ("--grammar", grammar),
                                      ("--choice", choice)) if value is not None]
    if len(given) > 1:
        raise ConfigError(f"give one constraint, got {' and '.join(given)}")
    if choice is not None:
        return {"type": "choice", "choices": [c.strip() for c in choice.split(",")]}
    if regex is not None:
        return {"type": "regex", "regex": regex}
    for flag, path in (("--json-schema", json_schema), ("--grammar", grammar)):
        if path is None:
            continue
        try:
            text = Path(path).read_text()
            if flag == "--grammar":
                return {"type": "grammar", "grammar": text}
            return {"type": "json_schema", "json_schema": {"name": Path(path).stem, "schema": json.loads(text)}}
        except (OSError, UnicodeDecodeError, ValueError) as error:
            raise ConfigError(f"{flag} {path}: cannot read it: {' '.join(str(error).split())[:200]}") from None
    return None


def _early_stopping(value: str) -> bool | str:
    """--early-stopping's text as Hugging Face's value: True, False or "never"."""
    from warpdecode.errors import ConfigError

    choices: dict[str, bool | str] = {"true": True, "false": False, "never": "never"}
    if value.lower() not in choices:
        raise ConfigError(f"--early-stopping must be true, false or never, got {value!r}")
    return choices[value.lower()]


def _search_method(method: str | None) -> SearchStrategy | None:
    """The search strategy --method names (`best_of_n:n=8`), or None when it names a drafter."""
    from warpdecode.decoding import registry
    from warpdecode.decoding.specs import parse_spec

    if method is None:
        return None
    name, options = parse_spec(method)
    return registry.build("search", name, **options) if name in registry.names("search") else None


def _rule_method(method: str | None) -> DecodingRule | None:
    """The decoding rule --method names (`momentum:alpha=0.2`), or None when it names a drafter or a search."""
    from warpdecode.decoding import registry
    from warpdecode.decoding.specs import parse_spec

    if method is None:
        return None
    name, options = parse_spec(method)
    return registry.build("rule", name, **options) if name in registry.names("rule") else None


def _generate_spec(method: str, method_options: dict[str, Any] | None, verifier: str | None,
                   verifier_options: dict[str, Any] | None, controller: str | None,
                   controller_options: dict[str, Any] | None) -> tuple[MethodSpec, list[str]]:
    """The method `generate` runs, from --method and --verifier / --controller (each NAME[:KEY=VALUE...]),
    and a deprecation warning for each JSON options flag given (their options are merged in)."""
    from warpdecode.decoding.specs import MethodSpec, parse_spec, spec_text
    from warpdecode.errors import ConfigError

    _check_one(method, "--method", "method", "--methods")
    name, options = parse_spec(method)
    warnings = []
    if method_options is not None:
        options |= method_options
        warnings.append(_deprecated("--method-options", f"--method {spec_text(name, options)}"))
    for kind, text, json_options, default in (("verifier", verifier, verifier_options, None),
                                              ("controller", controller, controller_options, "fixed")):
        if text is None and json_options is None:
            continue
        if kind in options:
            raise ConfigError(f"the {kind} is named twice: in --method {method!r} and by --{kind}; give one")
        if text is None and default is None:
            raise ConfigError(f"--{kind}-options needs --{kind} NAME (or write --{kind} NAME:KEY=VALUE)")
        component, component_options = parse_spec(text or str(default))
        if json_options is not None:
            component_options |= json_options
            warnings.append(_deprecated(f"--{kind}-options", f"--{kind} {spec_text(component, component_options)}"))
        options[kind] = component
        options |= {f"{kind}.{key}": value for key, value in component_options.items()}
    return MethodSpec(name, options), warnings


def _generate_diffusion(model: Backbone, tokenizer: Tokenizer | None, prompt: str, method: str,
                        method_options: dict[str, Any] | None, gen_length: int, json_output: bool,
                        temperature: float, generator: torch.Generator | None,
                        response_format: dict[str, Any] | None) -> None:
    """Decode a masked diffusion LM's answer under a commit policy (`--method`, default one token per step),
    in the grammar of `response_format` when given (`decoding/diffusion/constrained.py`)."""
    from warpdecode.decoding import registry
    from warpdecode.decoding.constraints.formats import compile_row_formats
    from warpdecode.decoding.diffusion.decoder import diffusion_generate, split_decoder_options
    from warpdecode.decoding.specs import parse_spec, spec_text
    from warpdecode.errors import ConfigError

    if tokenizer is None or tokenizer.eos_token_id is None:
        raise ConfigError("this diffusion LM has no tokenizer with an end-of-text token")
    _check_one(method, "--method", "commit policy", "--methods")
    policy_name, options = parse_spec(method)
    if method_options is not None:
        options |= method_options
    decoder, policy_options = split_decoder_options(options)
    policy = registry.build("commit_policy", policy_name, **policy_options)
    if method_options is not None:
        print(_deprecated("--method-options", f"--method {spec_text(policy_name, options)}"), file=sys.stderr)
    grammar = compile_row_formats(response_format, tokenizer, rows=1, vocab_size=model.config.vocab_size,
                                  stop_ids={tokenizer.eos_token_id})[0]
    out = diffusion_generate(model, [tokenizer.encode(prompt)], policy, gen_length=gen_length,
                             eos_token_id=tokenizer.eos_token_id, temperature=temperature, generator=generator,
                             constraints=None if grammar is None else [grammar.state()], **decoder)
    text, stats = tokenizer.decode(out.answers[0]), out.stats
    finish = "eos" if len(out.answers[0]) < gen_length else "length"
    if json_output:
        print(json.dumps({"text": text, "token_ids": out.answers[0], "finish_reason": finish, "stats": {"steps": stats.steps[0],
                          "seconds": stats.seconds, "committed_per_step": [c[0] for c in stats.committed_per_step]}}))
    else:
        print(text)
        print(f"[{len(out.answers[0])} tokens in {stats.steps[0]} steps, {stats.seconds:.3f} s, stop: {finish}]",
              file=sys.stderr)
