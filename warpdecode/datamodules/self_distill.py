"""Self-distillation data for learned drafters: the target's own greedy answers to a set of prompts.

Drafters (Medusa heads, EAGLE-style layers) learn to predict what the target generates, so they are
trained on the target's greedy continuations of real prompts, optionally with the target's final
normed hidden state at every position (the features a drafter reads). `prepare_data` regenerates the
answers once, batch by batch, and caches them on disk, one answer per prompt:

    <cache_dir>/runs/<run key>.json    which prompt set this configuration produced; the run key
                                       hashes only the configuration and file stamps, so a finished
                                       cache is found without loading the model
    <cache_dir>/data/<answers key>/    keyed by the target's weight fingerprint, the stop ids,
                                       max_new_tokens, max_length and the features flag (not the prompts)
        chunk-<content hash>.npz       one generation batch, written to a temporary file and renamed;
                                       each row is the answer to one (prompt key, prompt ids)
        set-<prompts hash>.json        one prompt set: which rows of which chunks, counts and stats,
                                       written last: the set is complete
    <cache_dir>/self_chat/<hash>.jsonl the `self_chat` source's user turns, per target and sampling
                                       settings, grown as prompt sets ask for more

A prompt is answered once per answers folder, whatever set asks for it: a larger `max_prompts`, another
seed or another mix of sources generates only the prompts no chunk holds yet (the built-in sources
keep their order when `max_prompts` grows, so growing adds to the end). An interrupted run loses at
most the batch in flight. Examples are split into train/val by a hash of the prompt text, so a
prompt never moves between splits. `setup` holds every example in memory (the features take
tokens x C x 2 bytes: about 0.35 GB for 1024 prompts of 300 tokens with C = 576).
"""

from __future__ import annotations

import ast
import json
import random
import sys
import sysconfig
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from torch.utils.data import Sampler as IndexSampler
from tqdm.auto import tqdm

from warpdecode.data.corpus import read_jsonl, split_of, stdlib_split_files
from warpdecode.data.datasets import dataset_file
from warpdecode.datamodules.blocks import Batched, EpochShuffleSampler, LengthGroupedBatches, ResumableLoader
from warpdecode.datamodules.instructions import INSTRUCTION_SOURCES
from warpdecode.datamodules.instructions import source_stamp as instruction_stamp
from warpdecode.datamodules.prompt import DistillPrompt
from warpdecode.datamodules.self_chat import SOURCE as SELF_CHAT
from warpdecode.datamodules.self_chat import VERSION as SELF_CHAT_VERSION
from warpdecode.datamodules.self_chat import SelfChatSource
from warpdecode.decoding.batch import decode_batch
from warpdecode.decoding.generate import encode_prompt, stop_token_ids
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.errors import ConfigError
from warpdecode.io import atomic_file, content_key
from warpdecode.models.checkpoint import cache_dir as warpdecode_cache_dir
from warpdecode.models.checkpoint import load_pretrained, resolve
from warpdecode.models.identity import model_fingerprint
from warpdecode.models.tokenizer import Tokenizer
from warpdecode.models.transformer import Transformer
from warpdecode.progress import ProgressLines

CACHE_VERSION = 2
DOCSTRING_MIN_CHARS = 24
"""Shorter first paragraphs ("Return x.") say too little to write a function from."""
STATS = ("examples", "prompt_tokens", "answer_tokens", "generation_seconds", "skipped_prompts")


def encode(tokenizer: Tokenizer, prompt: DistillPrompt) -> list[int]:
    """Token ids of `prompt` exactly as inference encodes it (`encode_prompt` with `chat=None`: the
    chat template when the tokenizer has one, the raw text otherwise); several turns need a template."""
    if len(prompt.messages) == 1:
        return encode_prompt(tokenizer, prompt.messages[0][1], chat=None)
    if tokenizer.chat_template is None:
        raise ConfigError(f"prompt {prompt.id} has {len(prompt.messages)} turns but the target's tokenizer "
                          "has no chat template to render them")
    messages = [{"role": role, "content": content} for role, content in prompt.messages]
    text = tokenizer.apply_chat_template(messages)
    return tokenizer.encode(text, add_special_tokens=False)


# ---- prompt sources -------------------------------------------------------------------------------


def gsm8k_train_prompts() -> list[DistillPrompt]:
    """The questions of the GSM8K train split (never the test split, which the bench evaluates on)."""
    with dataset_file("gsm8k/train.jsonl").open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [DistillPrompt(f"gsm8k_train/{i}", (("user", row["question"]),)) for i, row in enumerate(rows)]


def stdlib_train_files() -> list[tuple[str, Path]]:
    """(relative path, path) of the stdlib corpus files in the `train` split, sorted."""
    return stdlib_split_files("train")


Function = ast.FunctionDef | ast.AsyncFunctionDef


def _public_functions(tree: ast.Module) -> Iterator[tuple[Function, str | None]]:
    """Module-level functions and methods of module-level classes, in file order, with their class."""
    for node in tree.body:
        if isinstance(node, Function):
            yield node, None
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            yield from ((item, node.name) for item in node.body if isinstance(item, Function))


def docstring_prompts(key: str, source: str) -> Iterator[DistillPrompt]:
    """A prompt "Write a Python function `name(args)`: <first docstring paragraph>" for each public
    function or method of one file whose first docstring paragraph has `DOCSTRING_MIN_CHARS` chars or more."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    for node, owner in _public_functions(tree):
        paragraph = " ".join((ast.get_docstring(node) or "").split("\n\n")[0].split())
        if node.name.startswith("_") or len(paragraph) < DOCSTRING_MIN_CHARS:
            continue
        kind, name = ("function", node.name) if owner is None else ("method", f"{owner}.{node.name}")
        text = f"Write a Python {kind} `{name}({ast.unparse(node.args)})`: {paragraph}"
        yield DistillPrompt(f"stdlib/{key}:{node.lineno}:{name}", (("user", text),))


def stdlib_docstring_prompts() -> list[DistillPrompt]:
    """Docstring prompts of every train-split stdlib file, in file then line order."""
    return [prompt for key, path in stdlib_train_files()
            for prompt in docstring_prompts(key, path.read_text(encoding="utf-8", errors="replace"))]


SOURCES: dict[str, Callable[[], list[DistillPrompt]]] = {
    "gsm8k_train": gsm8k_train_prompts,
    "stdlib_docstrings": stdlib_docstring_prompts,
    **INSTRUCTION_SOURCES,
}
"""Built-in prompt sources read from disk, by name. `self_chat` (the target's own user turns,
`datamodules/self_chat.py`) is built in too but needs the target; any other source is a `.jsonl` path."""


def _messages(record: Any, where: str) -> tuple[tuple[str, str], ...]:
    if isinstance(record, dict) and isinstance(record.get("prompt"), str):
        return (("user", record["prompt"]),)
    turns = record.get("messages") if isinstance(record, dict) else None
    if isinstance(turns, list) and turns and all(isinstance(t, dict) for t in turns):
        pairs = [(t.get("role"), t.get("content")) for t in turns]
        if all(isinstance(r, str) and isinstance(c, str) for r, c in pairs) and pairs[-1][0] == "user":
            return tuple(pairs)
    raise ConfigError(f'{where}: expected {{"prompt": str}} or '
                      '{"messages": [{"role": str, "content": str}, ...]} ending with a user turn')


def jsonl_prompts(path: Path) -> list[DistillPrompt]:
    """One prompt per non-blank line of a JSONL file, in file order."""
    return [DistillPrompt(f"{path.name}/{line_no}", _messages(record, f"{path}:{line_no}"))
            for line_no, record in read_jsonl(path)]


def write_jsonl_prompts(path: Path, prompts: Sequence[DistillPrompt]) -> None:
    """One `{"messages": [...]}` line per prompt, in order, written atomically: `jsonl_prompts` reads
    the same texts back, so the file gives the same train/val split and finds the same cached answers."""
    lines = [json.dumps({"messages": [{"role": role, "content": content} for role, content in p.messages]},
                        ensure_ascii=False) + "\n" for p in prompts]
    atomic_file(path, lambda f: f.write("".join(lines).encode()))


def check_source(source: str) -> None:
    if source in SOURCES or source == SELF_CHAT:
        return
    if not source.endswith(".jsonl"):
        raise ConfigError(f"unknown prompt source {source!r}; choose from {', '.join([*SOURCES, SELF_CHAT])} "
                          "or a path to a .jsonl file")
    if not Path(source).is_file():
        raise ConfigError(f"prompt file {source} not found")


def check_weights(sources: list[str], weights: dict[str, float]) -> None:
    for source, weight in weights.items():
        if source not in sources:
            raise ConfigError(f"prompt weight for {source!r}, which is not one of the prompt sources {sources}")
        if not weight > 0:
            raise ConfigError(f"prompt weights must be > 0, got {weight} for {source!r}")


def interleave(lists: Sequence[Sequence[DistillPrompt]], weights: Sequence[float],
               limit: int) -> Iterator[tuple[int, DistillPrompt]]:
    """(source index, prompt), `limit` prompts at most, none repeated: source i's k-th prompt comes at
    time k / weights[i], earlier sources first at equal times. Each source's share of every stretch is
    in proportion to its weight; equal weights give round-robin (`zip_longest` order); an exhausted
    source drops out and the others go on in the same rhythm."""
    cursors, seen, taken = [0] * len(lists), set(), 0
    while taken < limit:
        alive = [i for i, prompts in enumerate(lists) if cursors[i] < len(prompts)]
        if not alive:
            return
        pick = min(alive, key=lambda i: ((cursors[i] + 1) / weights[i], i))
        prompt = lists[pick][cursors[pick]]
        cursors[pick] += 1
        if prompt.messages not in seen:
            seen.add(prompt.messages)
            taken += 1
            yield pick, prompt


class _Unbounded(Sequence[DistillPrompt]):
    """A stand-in source that never runs out (to count how much of a generated source a mix takes)."""

    def __len__(self) -> int:
        return sys.maxsize

    def __getitem__(self, index: Any) -> Any:
        return DistillPrompt(f"unbounded/{index}", (("user", f"\0{index}"),))


def generated_share(lists: Sequence[Sequence[DistillPrompt] | None], weights: Sequence[float],
                    max_prompts: int) -> int:
    """How many prompts `interleave` takes from the generated source (the one None entry of `lists`,
    taken as unbounded) to reach `max_prompts` (duplicates among the other sources taken as they come)."""
    generated = lists.index(None)
    stand_ins = [_Unbounded() if prompts is None else prompts for prompts in lists]
    return sum(source == generated for source, _ in interleave(stand_ins, weights, max_prompts))


def load_prompts(sources: list[str], max_prompts: int, seed: int, self_chat: SelfChatSource | None = None,
                 weights: dict[str, float] | None = None) -> list[DistillPrompt]:
    """The first `max_prompts` distinct prompts, interleaved over the sources so that a cut keeps a
    mix: round-robin, or in proportion to `weights` (source → weight, 1 for a source not named).
    Built-in sources are shuffled with `seed` (their own order is by file and line); a JSONL file and
    `self_chat` keep their order. The `self_chat` source needs the `self_chat` argument (the target
    that writes it), and writes as many user turns as its share of the mix."""
    weights = weights or {}
    check_weights(sources, weights)
    lists: dict[str, list[DistillPrompt]] = {}
    for source in sources:
        check_source(source)
        if source in SOURCES:
            lists[source] = SOURCES[source]()
            random.Random(f"{seed}:{source}").shuffle(lists[source])
        elif source != SELF_CHAT:
            lists[source] = jsonl_prompts(Path(source))
    shares = [weights.get(s, 1.0) for s in sources]
    if SELF_CHAT in sources:
        if self_chat is None:
            raise ConfigError("the self_chat prompt source needs the target to write its prompts")
        lists[SELF_CHAT] = self_chat.prompts(generated_share([lists.get(s) for s in sources], shares, max_prompts))
    chosen = [prompt for _, prompt in interleave([lists[s] for s in sources], shares, max_prompts)]
    if not chosen:
        raise ConfigError(f"the prompt sources {sources} hold no prompt")
    return chosen


# ---- generation and cache -------------------------------------------------------------------------


def _stamp(path: Path) -> list[Any]:
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns]


def _source_stamp(source: str) -> list[Any]:
    """What a source's prompts depend on, without reading it."""
    if source == "gsm8k_train":
        return _stamp(dataset_file("gsm8k/train.jsonl"))
    if source == "stdlib_docstrings":
        return [source, sys.version, sysconfig.get_paths()["stdlib"]]
    if source in INSTRUCTION_SOURCES:
        return instruction_stamp(source)
    if source == SELF_CHAT:  # written by the target, whose files the run key stamps already
        return [source, SELF_CHAT_VERSION]
    return _stamp(Path(source))


def _write_json(path: Path, value: Any) -> None:
    atomic_file(path, lambda f: f.write((json.dumps(value, indent=1) + "\n").encode()))


def _save_chunk(path: Path, arrays: dict[str, np.ndarray]) -> None:
    atomic_file(path, lambda f: np.savez(f, allow_pickle=False, **arrays))


def example_id(key: str, prompt_ids: Sequence[int]) -> str:
    """What names one cached answer: the prompt's split key and its token ids."""
    return content_key([key, [int(t) for t in prompt_ids]])


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


def _complete(manifest: Path) -> bool:
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


# ---- dataset and batches --------------------------------------------------------------------------


class Example(NamedTuple):
    tokens: np.ndarray  # (T,) int32, prompt then answer
    prompt_length: int
    features: np.ndarray | None  # (T, C) float16, see `generate_chunk`


class DistillDataset(Dataset[Example]):
    """The examples of one split, in cache order; `collate` turns a list of them into a batch."""

    def __init__(self, examples: list[Example]) -> None:
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> Example:
        return self.examples[index]


def collate(examples: list[Example]) -> dict[str, Tensor]:
    """Right-pad examples (with 0) to the longest one; see `SelfDistillDataModule` for the batch keys."""
    lengths = torch.tensor([len(e.tokens) for e in examples])  # (B,)
    B, T = len(examples), int(lengths.max())
    tokens = torch.zeros(B, T, dtype=torch.int64)
    answer_mask = torch.zeros(B, T, dtype=torch.bool)
    for b, e in enumerate(examples):
        tokens[b, : len(e.tokens)] = torch.from_numpy(e.tokens.astype(np.int64))
        answer_mask[b, e.prompt_length : len(e.tokens)] = True
    batch = {"tokens": tokens, "answer_mask": answer_mask, "lengths": lengths}
    if examples[0].features is not None:
        features = torch.zeros(B, T, examples[0].features.shape[1])  # (B, T, C)
        for b, e in enumerate(examples):
            assert e.features is not None
            features[b, : len(e.tokens)] = torch.from_numpy(e.features.astype(np.float32))
        batch["features"] = features
    return batch


class SelfDistillDataModule(LightningDataModule):
    """The target's greedy answers to a prompt set (plus its hidden states), cached, as padded batches.

    Each batch is a dict of `tokens` (B, T) int64, prompt then answer ids right-padded with 0;
    `answer_mask` (B, T) bool, True at the answer (generated) tokens; `lengths` (B,) int64; and, when
    `features`, `features` (B, T, C) float32 where features[b, t] is the target's final normed hidden
    state after reading tokens[b, :t + 1] (0 at each row's last token and at padding). T is the
    longest example of the batch (at most `max_length`).
    """

    def __init__(
        self,
        target: str = "smollm2-135m-instruct",
        prompts: Sequence[str] = tuple(SOURCES),
        prompt_weights: dict[str, float] | None = None,
        max_prompts: int = 1024,
        max_new_tokens: int = 192,
        generation_batch_size: int = 32,
        generation_device: str = "cpu",
        features: bool = True,
        batch_size: int = 8,
        max_length: int = 512,
        val_fraction: float = 0.05,
        cache_dir: str | None = None,
        seed: int = 0,
        num_workers: int = 0,
        group_by_length: bool = True,
    ) -> None:
        """
        Args:
            target: The model whose answers to learn: a model name, a model directory or a `.gguf` file.
            prompts: Prompt sources, interleaved: `gsm8k_train` (GSM8K train questions),
                `stdlib_docstrings` ("Write a Python function ..." from the docstrings of the train
                split of the stdlib corpus), the instruction sources of
                `warpdecode.datamodules.instructions` (`summarize`, `context_qa`, `extract`,
                `translate_de`, `writing`, `roleplay`, `explain`), `self_chat` (user turns the
                target writes itself, `warpdecode.datamodules.self_chat`; cached in
                `<cache_dir>/self_chat/`), or paths to `.jsonl` files whose lines are
                {"prompt": str} or {"messages": [{"role": str, "content": str}, ...]}.
            prompt_weights: Share of the mix per source, relative (source → weight; 1 for a source
                not named): `{self_chat: 9}` beside nine other sources makes half the prompts
                self-chat ones. Default: round-robin.
            max_prompts: Use at most this many prompts.
            max_new_tokens: Answer length limit; an answer also ends at the target's stop tokens.
            generation_batch_size: Prompts decoded together; also the unit of the resumable cache.
            generation_device: Where the fp32 target runs during regeneration (e.g. `cuda`).
            features: Also store the target's final normed hidden state at every position (float16).
            batch_size: Examples per training batch (per device).
            max_length: Prompt + answer tokens at most; longer prompts are skipped with a warning.
            val_fraction: Expected fraction of prompts held out for validation, in (0, 1).
            cache_dir: Where the regenerated data is cached; default `$WARPDECODE_CACHE/self_distill`.
            seed: Seed of the built-in sources' prompt order and of the training shuffle (per epoch).
            num_workers: DataLoader worker processes.
            group_by_length: Batch examples of similar length together (`LengthGroupedBatches`:
                shuffled groups of 32 batches, sorted within each group; validation sorted by
                length), so batches padded to their longest example waste little compute. False:
                uniformly shuffled batches.
        """
        super().__init__()
        for name, value in (("max_prompts", max_prompts), ("max_new_tokens", max_new_tokens),
                            ("generation_batch_size", generation_batch_size), ("batch_size", batch_size)):
            if value <= 0:
                raise ConfigError(f"{name} must be positive, got {value}")
        if max_length < 2:
            raise ConfigError(f"max_length must be >= 2 (a prompt and an answer token), got {max_length}")
        if not 0 < val_fraction < 1:
            raise ConfigError(f"val_fraction must be in (0, 1), got {val_fraction}")
        if not prompts:
            raise ConfigError(f"the prompt set is empty; choose from {', '.join(SOURCES)} or .jsonl files")
        for source in prompts:
            check_source(source)
        check_weights(list(prompts), prompt_weights or {})
        self.save_hyperparameters()
        self.target = target
        self.prompt_sources, self.prompt_weights = list(prompts), dict(prompt_weights or {})
        self.max_prompts, self.max_new_tokens, self.max_length = max_prompts, max_new_tokens, max_length
        self.generation_batch_size, self.generation_device = generation_batch_size, generation_device
        self.features = features
        self.batch_size, self.val_fraction, self.num_workers = batch_size, val_fraction, num_workers
        self.seed, self.group_by_length = seed, group_by_length
        self.cache_dir = Path(cache_dir) if cache_dir else warpdecode_cache_dir() / "self_distill"
        self.datasets: dict[str, DistillDataset] = {}
        self.tokenizer: Tokenizer | None = None
        """The target's tokenizer, after `setup`."""
        self.target_fingerprint: str | None = None
        """`model_fingerprint` of the target that generated the data, after `setup`."""
        self.hidden_size: int | None = None
        """C, the target's hidden size (the width of `features`), after `setup`."""
        self.stats: dict[str, float] = {}
        """examples, prompt_tokens, answer_tokens, generation_seconds, skipped_prompts, after `setup`."""

    def _run_key(self) -> str:
        """Hash of the configuration and the stamps of its input files: finds a finished cache cheaply."""
        files = sorted(p for p in resolve(self.target).iterdir() if p.is_file())
        return content_key({
            "version": CACHE_VERSION, "target": [_stamp(p) for p in files],
            "sources": [_source_stamp(s) for s in self.prompt_sources], "max_prompts": self.max_prompts,
            "seed": self.seed, "max_new_tokens": self.max_new_tokens, "max_length": self.max_length,
            "features": self.features,
            **({"weights": self.prompt_weights} if self.prompt_weights else {}),  # round-robin keys stay as they were
        })

    def data_manifest(self) -> Path:
        """The finished prompt-set file (`set-*.json`) of this configuration, answering the prompts
        that no cached chunk holds yet."""
        run = self.cache_dir / "runs" / f"{self._run_key()}.json"
        if run.is_file():
            recorded = json.loads(run.read_text())
            manifest = self.cache_dir / "data" / recorded["data"] / recorded["set"]
            if _complete(manifest):
                rank_zero_info(f"self-distillation data: reusing the finished cache {manifest}")
                return manifest
        manifest = self._answer()
        _write_json(run, {"data": manifest.parent.name, "set": manifest.name})
        return manifest

    def _answer(self) -> Path:
        """Load the target, answer the prompts no chunk of the answers folder holds, then write the
        prompt set's file."""
        model, tokenizer = load_pretrained(self.target, device=self.generation_device)
        fingerprint = model_fingerprint(model)
        self_chat = SelfChatSource(model, tokenizer, fingerprint, self.cache_dir / "self_chat", seed=self.seed)
        prompts = load_prompts(self.prompt_sources, self.max_prompts, self.seed, self_chat, self.prompt_weights)
        limit = min(self.max_length, model.config.max_seq_len)
        kept = [(p, ids) for p in prompts if 0 < len(ids := encode(tokenizer, p)) < limit]
        if not kept:
            raise ConfigError(f"all {len(prompts)} prompts are empty or longer than {limit - 1} tokens "
                              f"(max_length {self.max_length}, context {model.config.max_seq_len})")
        if len(kept) < len(prompts):
            rank_zero_warn(f"skipping {len(prompts) - len(kept)} of {len(prompts)} prompts: empty or longer "
                           f"than {limit - 1} tokens")
        stop_ids = stop_token_ids(model, tokenizer)
        directory = self.cache_dir / "data" / content_key({
            "version": CACHE_VERSION, "target": fingerprint, "stop_ids": sorted(stop_ids),
            "max_new_tokens": self.max_new_tokens, "max_length": self.max_length, "features": self.features,
        })
        wanted = [example_id(p.key, tokens) for p, tokens in kept]
        manifest = directory / f"set-{content_key(wanted)}.json"
        if _complete(manifest):
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
            for start in range(0, len(missing), self.generation_batch_size):
                batch = missing[start : start + self.generation_batch_size]
                batch_ids = [example_id(p.key, tokens) for p, tokens in batch]
                budgets = [min(self.max_new_tokens, limit - len(tokens)) for _, tokens in batch]
                chunk = generate_chunk(model, batch, budgets=budgets, stop_ids=stop_ids, features=self.features)
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
        _write_json(manifest, {
            "target": self.target, "target_fingerprint": fingerprint, "hidden_size": model.config.d_model,
            "features": self.features, "rows": rows,
            **_totals(directory, rows), "skipped_prompts": len(prompts) - len(kept),
        })
        return manifest

    def prepare_data(self) -> None:
        """Runs on one process per node before `setup`: answers the prompts the cache lacks."""
        self.data_manifest()

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        manifest = self.data_manifest()
        done = json.loads(manifest.read_text())
        splits: dict[str, list[Example]] = {"train": [], "val": []}
        for name, picked in done["rows"].items():
            with np.load(manifest.parent / name) as chunk:
                arrays = {key: chunk[key] for key in chunk.files}
            offsets, whole = arrays["offsets"], len(picked) == len(arrays["keys"])
            for i in picked:  # rows of a chunk shared with other sets are copied, so the chunk is freed
                span = slice(offsets[i], offsets[i + 1])
                features = arrays["features"][span] if "features" in arrays else None
                example = Example(arrays["tokens"][span], int(arrays["prompt_lengths"][i]),
                                  features if whole or features is None else features.copy())
                splits[split_of(str(arrays["keys"][i]), self.val_fraction, 0.0)].append(example)
        if not splits["train"]:
            raise ConfigError(f"no example fell into the train split ({done['examples']} examples, "
                              f"val_fraction {self.val_fraction}); use more prompts or a lower val_fraction")
        if not splits["val"]:
            rank_zero_warn(f"no example of {done['examples']} fell into the val split; validation is empty")
        self.datasets = {split: DistillDataset(examples) for split, examples in splits.items()}
        self.tokenizer = Tokenizer.load(resolve(self.target))
        self.target_fingerprint, self.hidden_size = done["target_fingerprint"], done["hidden_size"]
        self.stats = {key: done[key] for key in STATS}
        rank_zero_info(f"self-distillation examples: train {len(splits['train'])}, val {len(splits['val'])}")

    def token_counts(self) -> np.ndarray:
        """(V,) int64 how often each token occurs in the train split's answers (the draft
        vocabulary of a drafter is its most frequent tokens)."""
        if not self.datasets or self.tokenizer is None:
            raise RuntimeError("call setup() before asking for token counts")
        answers = [e.tokens[e.prompt_length :] for e in self.datasets["train"].examples]
        return np.bincount(np.concatenate(answers).astype(np.int64), minlength=self.tokenizer.vocab_size)

    def batch_collate(self, split: str) -> Callable[[list[Example]], dict[str, Tensor]]:
        """How a list of examples of `split` becomes a batch (`collate`; subclasses lay batches out differently)."""
        return collate

    def _loader(self, split: str) -> DataLoader:
        if not self.datasets:
            raise RuntimeError("call setup() before asking for a dataloader")
        dataset, train = self.datasets[split], split == "train"
        sampler: IndexSampler[Any] | None
        if self.group_by_length:  # whole batches from the sampler (batch_size=None)
            batches = LengthGroupedBatches([len(e.tokens) for e in dataset.examples], self.batch_size,
                                           self.seed if train else None)
            items: Dataset[Any] = Batched(dataset)
            batch_size, sampler = None, batches
        else:
            items, batch_size = dataset, self.batch_size
            sampler = EpochShuffleSampler(len(dataset), self.seed) if train else None
        loader = ResumableLoader if train else DataLoader
        return loader(items, batch_size=batch_size, sampler=sampler, collate_fn=self.batch_collate(split),
                      num_workers=self.num_workers, persistent_workers=self.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")
