"""The non-training subcommands: typed functions whose signatures and docstrings are the CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from warpdecode.models.named import DEFAULT_MODEL


def convert(source: str, out: Path) -> None:
    """Convert a checkpoint into a warpdecode model directory (safetensors, config.json, tokenizer.json).

    Args:
        source: a Hugging Face checkpoint directory, a .gguf file, or a model name such as
            smollm2-135m-instruct.
        out: output directory (created; replaced if it exists).
    """
    from warpdecode.models.checkpoint import convert as run_convert

    path = run_convert(source, out)
    print(f"wrote {path}")


def generate(
    *,
    model: str = DEFAULT_MODEL,
    prompt: str,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    chat: bool | None = None,
    json_output: bool = False,
    threads: int | None = None,
) -> None:
    """Generate text from a prompt, streaming it to the terminal.

    Args:
        model: model directory, .gguf file, or model name.
        prompt: the prompt text.
        max_new_tokens: largest number of tokens to generate.
        temperature: 0 for greedy decoding; > 0 samples at this temperature.
        top_k: sample only among the k most likely tokens.
        top_p: nucleus sampling mass in (0, 1].
        seed: random seed for sampling.
        chat: wrap the prompt in the model's chat template (default: when the model has one).
        json_output: print one JSON object {"text", "token_ids", "stats"} instead of streaming (also --json).
        threads: CPU threads for torch (default: torch's choice).
    """
    from warpdecode.decoding.generate import generate as run_generate
    from warpdecode.errors import ConfigError
    from warpdecode.models.checkpoint import load_pretrained

    if temperature < 0:
        raise ConfigError(f"--temperature must be >= 0, got {temperature}")
    if threads is not None:
        torch.set_num_threads(threads)
    target, tokenizer = load_pretrained(model)

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
        seed=seed,
        chat=chat,
        streamer=None if json_output else stream,
    )
    if json_output:
        print(json.dumps({"text": out.text, "token_ids": out.token_ids, "finish_reason": out.finish_reason,
                          "stats": out.stats.to_dict()}))
    else:
        s = out.stats
        print()
        print(f"[{s.new_tokens} tokens in {s.seconds:.2f} s, {s.tokens_per_second:.1f} tok/s, "
              f"first token {s.time_to_first_token * 1000:.0f} ms, stop: {out.finish_reason}]", file=sys.stderr)
