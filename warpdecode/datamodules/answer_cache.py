"""The on-disk cache of the target's greedy answers to self-distillation prompts, one answer per prompt:

    <cache_dir>/runs/<run key>.json    which prompt set a configuration produced; the run key
                                       hashes only the configuration and file stamps, so a finished
                                       cache is found without loading the model
    <cache_dir>/data/<answers key>/    keyed by the target's weight fingerprint, the stop ids,
                                       max_new_tokens, max_length and the features flag (not the prompts)
        chunk-<content hash>.npz       one generation batch, written to a temporary file and renamed;
                                       each row is the answer to one (prompt key, prompt ids)
        set-<prompts hash>.json        one prompt set: which rows of which chunks, counts and stats,
                                       written last: the set is complete
    <cache_dir>/self_chat/<hash>.jsonl the `self_chat` source's user turns, per target and sampling
                                       settings, grown as prompt sets ask for more (`self_chat.py`)

A prompt is answered once per answers folder, whatever set asks for it: a larger set, another seed or
another mix of sources generates only the prompts no chunk holds yet. An interrupted run loses at most
the batch in flight. A chunk that cannot be read is reported, and its prompts are answered again.
"""

from __future__ import annotations

import json
import time
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from tqdm.auto import tqdm

from warpdecode.datamodules.prompt import DistillPrompt
from warpdecode.decoding.batch import decode_batch
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.io import atomic_file, content_key
from warpdecode.models.transformer import Transformer
from warpdecode.progress import ProgressLines

CACHE_VERSION = 2
STATS = ("examples", "prompt_tokens", "answer_tokens", "generation_seconds", "skipped_prompts")
"""The counts a prompt-set file holds beside its rows."""

Row = tuple[str, np.ndarray, int, np.ndarray | None]
"""(split key, tokens (T,) int32 prompt then answer, prompt length, features (T, C) float16 or None)."""


def write_json(path: Path, value: Any) -> None:
    atomic_file(path, lambda f: f.write((json.dumps(value, indent=1) + "\n").encode()))


def _save_chunk(path: Path, arrays: dict[str, np.ndarray]) -> None:
    atomic_file(path, lambda f: np.savez(f, allow_pickle=False, **arrays))


def example_id(key: str, prompt_ids: Sequence[int]) -> str:
    """What names one cached answer: the prompt's split key and its token ids."""
    return content_key([key, [int(t) for t in prompt_ids]])


def answers_folder(cache_dir: Path, *, fingerprint: str, stop_ids: set[int], max_new_tokens: int,
                   max_length: int, features: bool) -> Path:
    """The folder of the answers of one target under one generation configuration."""
    return cache_dir / "data" / content_key({
        "version": CACHE_VERSION, "target": fingerprint, "stop_ids": sorted(stop_ids),
        "max_new_tokens": max_new_tokens, "max_length": max_length, "features": features,
    })


def finished_run(cache_dir: Path, run_key: str) -> Path | None:
    """The complete prompt-set file a run with this key produced, if it is still on disk."""
    run = cache_dir / "runs" / f"{run_key}.json"
    if run.is_file():
        recorded = json.loads(run.read_text())
        manifest = cache_dir / "data" / recorded["data"] / recorded["set"]
        if complete(manifest):
            return manifest
    return None


def record_run(cache_dir: Path, run_key: str, manifest: Path) -> None:
    """Remember that the run with this key produced the prompt-set file `manifest`."""
    write_json(cache_dir / "runs" / f"{run_key}.json", {"data": manifest.parent.name, "set": manifest.name})


def index_chunks(directory: Path) -> dict[str, tuple[str, int]]:
    """example id → (chunk file name, row) of every answer held by the chunk files of `directory`.
    A chunk that cannot be read is reported and left out: its prompts are answered again."""
    index: dict[str, tuple[str, int]] = {}
    for path in sorted(directory.glob("chunk-*.npz")):
        try:
            with np.load(path) as chunk:
                tokens, offsets, lengths, keys = (chunk[k] for k in ("tokens", "offsets", "prompt_lengths", "keys"))
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
            rank_zero_warn(f"ignoring the unreadable self-distillation chunk {path}: {error}")
            continue
        for row, (key, begin, length) in enumerate(zip(keys, offsets[:-1], lengths, strict=True)):
            index.setdefault(example_id(str(key), tokens[begin : begin + length]), (path.name, row))
    return index


def _totals(directory: Path, rows: dict[str, list[int]]) -> dict[str, float]:
    """Example and token counts over the chosen `rows` of each chunk file, and the generation seconds
    of those chunks in proportion to the rows chosen."""
    totals: dict[str, float] = dict.fromkeys(("examples", "prompt_tokens", "answer_tokens"), 0)
    totals["generation_seconds"] = 0.0
    for name, picked in rows.items():
        with np.load(directory / name) as chunk:
            lengths = chunk["prompt_lengths"]
            prompt_tokens = int(lengths[picked].sum())
            totals["examples"] += len(picked)
            totals["prompt_tokens"] += prompt_tokens
            totals["answer_tokens"] += int(np.diff(chunk["offsets"])[picked].sum()) - prompt_tokens
            totals["generation_seconds"] += float(chunk["seconds"]) * len(picked) / len(lengths)
    return totals


def complete(manifest: Path) -> bool:
    """A prompt-set file exists and every chunk it names is still on disk."""
    if not manifest.is_file():
        return False
    return all((manifest.parent / name).is_file() for name in json.loads(manifest.read_text())["rows"])


def generate_chunk(model: Transformer, batch: list[tuple[DistillPrompt, list[int]]], *, budgets: list[int],
                   stop_ids: set[int], features: bool) -> dict[str, np.ndarray]:
    """Greedy answers of one generation batch, as the arrays of one chunk file.

    Returns: `tokens` (N_tok,) int32, every example's prompt + answer ids concatenated; `offsets`
    (N + 1,) int64, example i is tokens[offsets[i]:offsets[i + 1]]; `prompt_lengths` (N,) int32;
    `keys` (N,) str, the split keys; `seconds` () float64; with `features`, `features` (N_tok, C)
    float16 aligned with `tokens`: row t holds the final normed hidden state after reading the
    example's tokens up to t, and each example's last row is 0 (that token is never run).
    """
    layer = model.config.n_layer  # kept for free: decoding computes the final norm at every position anyway
    start = time.perf_counter()
    results = decode_batch(model, [ids for _, ids in batch], Sampler(SamplingConfig()), budgets=budgets,
                           stop_ids=stop_ids, hidden_layer=layer)
    seconds = time.perf_counter() - start
    sequences = [ids + new for (_, ids), (new, *_) in zip(batch, results, strict=True)]
    offsets = np.cumsum([0] + [len(s) for s in sequences])
    chunk: dict[str, np.ndarray] = {
        "tokens": np.array([t for s in sequences for t in s], dtype=np.int32),
        "offsets": offsets.astype(np.int64),
        "prompt_lengths": np.array([len(ids) for _, ids in batch], dtype=np.int32),
        "keys": np.array([p.key for p, _ in batch]),
        "seconds": np.array(seconds),  # () float64
    }
    if features:
        hidden = np.zeros((offsets[-1], model.config.d_model), dtype=np.float16)  # (N_tok, C)
        for begin, (*_, states) in zip(offsets[:-1], results, strict=True):
            hidden[begin : begin + len(states)] = states.float().cpu().numpy()
        chunk["features"] = hidden
    return chunk


def answer_set(model: Transformer, kept: list[tuple[DistillPrompt, list[int]]], directory: Path, *,
               max_new_tokens: int, limit: int, batch_size: int, stop_ids: set[int], features: bool,
               header: dict[str, Any], skipped: int) -> Path:
    """The prompt-set file of the (prompt, prompt ids) pairs `kept` in the answers folder `directory`.

    Answers the prompts that no chunk holds yet, `batch_size` at a time (each batch one chunk file), with
    at most `max_new_tokens` new tokens and `limit` tokens in all per example, then writes the set file:
    `header`, the chunks' `rows`, the `STATS` counts (`skipped` for `skipped_prompts`).
    """
    wanted = [example_id(p.key, tokens) for p, tokens in kept]
    manifest = directory / f"set-{content_key(wanted)}.json"
    if complete(manifest):
        return manifest
    index = index_chunks(directory) if directory.is_dir() else {}
    missing = sorted((item for item, i in zip(kept, wanted, strict=True) if i not in index),
                     key=lambda item: len(item[1]))  # similar lengths share a batch: less padding
    rank_zero_info(f"self-distillation answers in {directory}: reusing {len(kept) - len(missing)} of "
                   f"{len(kept)}, generating {len(missing)}")
    new_tokens, seconds, done = 0, 0.0, len(kept) - len(missing)
    lines = ProgressLines("self-distill", len(kept), "prompts", done=done)
    with tqdm(total=len(kept), initial=done, desc="self-distill", unit="prompt",
              disable=None) as bar:  # draws only on a terminal; the lines go to logs instead
        for start in range(0, len(missing), batch_size):
            batch = missing[start : start + batch_size]
            batch_ids = [example_id(p.key, tokens) for p, tokens in batch]
            budgets = [min(max_new_tokens, limit - len(tokens)) for _, tokens in batch]
            chunk = generate_chunk(model, batch, budgets=budgets, stop_ids=stop_ids, features=features)
            name = f"chunk-{content_key(batch_ids)}.npz"
            _save_chunk(directory / name, chunk)
            index.update({i: (name, row) for row, i in enumerate(batch_ids)})
            new_tokens += len(chunk["tokens"]) - int(chunk["prompt_lengths"].sum())
            seconds += float(chunk["seconds"])
            done += len(batch)
            bar.update(len(batch))
            bar.set_postfix(tok_s=f"{new_tokens / seconds:.0f}")
            if bar.disable:
                lines.update(done, tok_s=f"{new_tokens / seconds:.0f}")
    rows: dict[str, list[int]] = {}
    for i in wanted:
        name, row = index[i]
        rows.setdefault(name, []).append(row)
    write_json(manifest, {**header, "rows": rows, **_totals(directory, rows), "skipped_prompts": skipped})
    return manifest


def set_rows(manifest: Path, rows: dict[str, list[int]]) -> Iterator[Row]:
    """The examples a prompt-set file names (its `rows`: chunk file name → row numbers), chunk by chunk.
    Rows of a chunk shared with other sets are copied, so the chunk is freed."""
    for name, picked in rows.items():
        with np.load(manifest.parent / name) as chunk:
            arrays = {key: chunk[key] for key in chunk.files}
        offsets, whole = arrays["offsets"], len(picked) == len(arrays["keys"])
        for i in picked:
            span = slice(offsets[i], offsets[i + 1])
            features = arrays["features"][span] if "features" in arrays else None
            yield (str(arrays["keys"][i]), arrays["tokens"][span], int(arrays["prompt_lengths"][i]),
                   features if whole or features is None else features.copy())
