"""Subcommands that write artifacts: `convert`, `export`, `convert-drafter`, `regress`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from warpdecode.commands.common import _check_one, _check_output_directory, _names
from warpdecode.models.named import DEFAULT_MODEL


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
