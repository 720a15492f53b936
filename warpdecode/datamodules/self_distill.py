"""Self-distillation data for learned drafters: the target's own greedy answers to a set of prompts.

Drafters (Medusa heads, EAGLE-style layers) learn to predict what the target generates, so they are
trained on the target's greedy continuations of real prompts, optionally with the target's final
normed hidden state at every position (the features a drafter reads). The prompts come from the
sources of `datamodules/prompt_sources.py`; `prepare_data` answers them once, batch by batch, into the
cache of `datamodules/answer_cache.py`, which keeps one answer per prompt: a larger `max_prompts`,
another seed or another mix of sources generates only the prompts no chunk holds yet (the built-in
sources keep their order when `max_prompts` grows, so growing adds to the end), and an interrupted run
loses at most the batch in flight. Examples are split into train/val by a hash of the prompt text, so
a prompt never moves between splits. `setup` holds every example in memory (the features take
tokens x C x 2 bytes: about 0.35 GB for 1024 prompts of 300 tokens with C = 576).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from torch.utils.data import Sampler as IndexSampler

from warpdecode.data.corpus import split_of
from warpdecode.datamodules.answer_cache import (
    CACHE_VERSION,
    STATS,
    answer_set,
    answers_folder,
    finished_run,
    record_run,
    set_rows,
)
from warpdecode.datamodules.blocks import Batched, EpochShuffleSampler, LengthGroupedBatches, ResumableLoader
from warpdecode.datamodules.prompt import DistillPrompt
from warpdecode.datamodules.prompt_sources import (
    SOURCES,
    check_source,
    check_weights,
    file_stamp,
    load_prompts,
    source_stamp,
)
from warpdecode.datamodules.self_chat import SelfChatSource
from warpdecode.decoding.generate import encode_prompt, stop_token_ids
from warpdecode.errors import ConfigError
from warpdecode.io import content_key
from warpdecode.models.checkpoint import cache_dir as warpdecode_cache_dir
from warpdecode.models.checkpoint import load_pretrained, resolve
from warpdecode.models.identity import model_fingerprint
from warpdecode.models.tokenizer import Tokenizer


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


class Example(NamedTuple):
    tokens: np.ndarray  # (T,) int32, prompt then answer
    prompt_length: int
    features: np.ndarray | None  # (T, C) float16, see `answer_cache.generate_chunk`


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
            "version": CACHE_VERSION, "target": [file_stamp(p) for p in files],
            "sources": [source_stamp(s) for s in self.prompt_sources], "max_prompts": self.max_prompts,
            "seed": self.seed, "max_new_tokens": self.max_new_tokens, "max_length": self.max_length,
            "features": self.features,
            **({"weights": self.prompt_weights} if self.prompt_weights else {}),  # round-robin keys stay as they were
        })

    def data_manifest(self) -> Path:
        """The finished prompt-set file (`set-*.json`) of this configuration, answering the prompts
        that no cached chunk holds yet."""
        run_key = self._run_key()
        manifest = finished_run(self.cache_dir, run_key)
        if manifest is not None:
            rank_zero_info(f"self-distillation data: reusing the finished cache {manifest}")
            return manifest
        manifest = self._answer()
        record_run(self.cache_dir, run_key, manifest)
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
        directory = answers_folder(self.cache_dir, fingerprint=fingerprint, stop_ids=stop_ids,
                                   max_new_tokens=self.max_new_tokens, max_length=self.max_length,
                                   features=self.features)
        header = {"target": self.target, "target_fingerprint": fingerprint, "hidden_size": model.config.d_model,
                  "features": self.features}
        return answer_set(model, kept, directory, max_new_tokens=self.max_new_tokens, limit=limit,
                          batch_size=self.generation_batch_size, stop_ids=stop_ids, features=self.features,
                          header=header, skipped=len(prompts) - len(kept))

    def prepare_data(self) -> None:
        """Runs on one process per node before `setup`: answers the prompts the cache lacks."""
        self.data_manifest()

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        manifest = self.data_manifest()
        done = json.loads(manifest.read_text())
        splits: dict[str, list[Example]] = {"train": [], "val": []}
        for key, tokens, prompt_length, features in set_rows(manifest, done["rows"]):
            splits[split_of(key, self.val_fraction, 0.0)].append(Example(tokens, prompt_length, features))
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
