"""Subcommands that make training data: `prompts`, `self-chat`."""

from __future__ import annotations

from pathlib import Path

import torch

from warpdecode.commands.common import _check_threads, _names
from warpdecode.models.named import DEFAULT_MODEL


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
