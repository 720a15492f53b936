"""(prefix, continuation) pairs with hard negatives: the data of RankGen's contrastive training.

Each document (token ids of the target's tokenizer) gives `pairs_per_document` examples: a split point t
(seeded), the prefix `doc[t - prefix_tokens : t]`, the positive `doc[t : t + n]` (the true continuation,
n drawn in [min_continuation, continuation_tokens]) and negatives of the same length, RankGen's two kinds
(Krishna et al. 2022, §3.1):

* `random_negatives` spans of the same document that do not overlap the positive (INBOOK negatives:
  on topic, but not what comes next);
* `model_negatives` continuations of the prefix sampled from the target itself (generative negatives:
  fluent, but not the text), generated once at setup for at most `max_generated` training examples
  (validation examples always get them) and cached in `cache_dir` under a key of the target's
  fingerprint, the prefixes and the sampling settings; a training example past the cap gets a random
  span in their place.

Batches: `prefix`, `prefix_mask` (B, T) int64 / bool; `positive`, `positive_mask` (B, K) ; `negatives`,
`negatives_mask` (B, M, K); `negative_kind` (B, M) int64, 0 = same-document span, 1 = the target's own.
Padding is on the right. Documents: GSM8K's train split (question and solution, calculator notes removed;
a seeded part held out for validation, the test split never read) or a folder with `train/` and `val/`
text files.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from warpdecode.data.gsm8k import gsm8k_rows
from warpdecode.decoding.batch import decode_batch
from warpdecode.decoding.generate import stop_token_ids
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.errors import ConfigError
from warpdecode.io import content_key
from warpdecode.models.backbone import Backbone
from warpdecode.models.checkpoint import cache_dir as warpdecode_cache_dir
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.tokenizer import Tokenizer

GSM8K = "gsm8k"
RANDOM, MODEL = 0, 1


@dataclass
class Pair:
    prefix: list[int]
    positive: list[int]
    negatives: list[list[int]]
    kinds: list[int]


def gsm8k_documents(split: str, val_documents: int, seed: int) -> list[str]:
    """GSM8K train problems as text (question, then solution without `<<...>>` calculator notes); `val` is
    a seeded `val_documents` of them, `train` the rest."""
    texts = [f"{r['question']}\n{re.sub(r'<<[^>]*>>', '', r['answer'])}" for r in gsm8k_rows("train")]
    random.Random(seed).shuffle(texts)
    return texts[:val_documents] if split == "val" else texts[val_documents:]


def make_pairs(documents: list[list[int]], *, prefix_tokens: int, continuation_tokens: int, min_continuation: int,
               negatives: int, per_document: int, seed: int) -> list[Pair]:
    """`per_document` pairs of each document long enough (a prefix of `min_continuation` tokens, and room
    for a positive and `negatives` spans that do not overlap it), with `negatives` random spans each."""
    rng = random.Random(seed)
    pairs = []
    for doc in documents:
        for _ in range(per_document):
            n = rng.randint(min_continuation, continuation_tokens)
            if len(doc) < min_continuation + 2 * n:
                break
            t = rng.randint(min_continuation, len(doc) - n)
            starts = [u for u in range(len(doc) - n + 1) if u + n <= t or u >= t + n]
            if not starts:
                continue
            spans = [doc[u : u + n] for u in (rng.choice(starts) for _ in range(negatives))]
            pairs.append(Pair(doc[max(0, t - prefix_tokens) : t], doc[t : t + n], spans, [RANDOM] * negatives))
    return pairs


class Pairs(Dataset[Pair]):
    def __init__(self, pairs: list[Pair]) -> None:
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> Pair:
        return self.pairs[index]


def pad(rows: list[list[int]], width: int) -> tuple[Tensor, Tensor]:
    """(N, width) int64 right-padded rows and their (N, width) bool mask."""
    tokens = torch.tensor([r[:width] + [0] * (width - len(r[:width])) for r in rows], dtype=torch.int64)
    mask = torch.tensor([[True] * len(r[:width]) + [False] * (width - len(r[:width])) for r in rows])
    return tokens, mask


def collate(pairs: list[Pair]) -> dict[str, Tensor]:
    B, M = len(pairs), len(pairs[0].negatives)
    prefix, prefix_mask = pad([p.prefix for p in pairs], max(len(p.prefix) for p in pairs))
    width = max(len(p.positive) for p in pairs)
    positive, positive_mask = pad([p.positive for p in pairs], width)
    negatives, negatives_mask = pad([n for p in pairs for n in p.negatives], width)
    return {"prefix": prefix, "prefix_mask": prefix_mask, "positive": positive, "positive_mask": positive_mask,
            "negatives": negatives.view(B, M, width), "negatives_mask": negatives_mask.view(B, M, width),
            "negative_kind": torch.tensor([p.kinds for p in pairs], dtype=torch.int64)}


class RankGenDataModule(LightningDataModule):
    def __init__(self, target: str = "smollm2-135m-instruct", source: str = GSM8K, max_documents: int = 2000,
                 max_val_documents: int = 200, pairs_per_document: int = 1, prefix_tokens: int = 64,
                 continuation_tokens: int = 32, min_continuation: int = 8, random_negatives: int = 2,
                 model_negatives: int = 1, max_generated: int = 1000, generation_batch_size: int = 32,
                 top_p: float = 0.9, batch_size: int = 64, seed: int = 0, cache_dir: str | None = None) -> None:
        """
        Args:
            target: The model whose embeddings the encoder reads and whose samples are negatives.
            source: `gsm8k` (its train split: a seeded held-out part validates), or a folder whose
                `train/` and `val/` subfolders hold text files.
            max_documents: Documents read for training; max_val_documents: ... for validation.
            pairs_per_document: Split points per document.
            prefix_tokens: Prefix tokens before each split point (fewer at a document's start).
            continuation_tokens: Longest positive (and negative); min_continuation: shortest.
            random_negatives: Same-document spans per example.
            model_negatives: The target's own continuations per example.
            max_generated: Training examples that get the target's continuations (its cost).
            generation_batch_size: Prefixes the target continues at once.
            top_p: Nucleus of the target's samples (temperature 1).
            batch_size: Examples per batch (each example's positive is every other's in-batch negative).
            seed: Documents, split points, spans and the target's samples.
            cache_dir: Where the target's continuations are kept; default `$WARPDECODE_CACHE/rankgen`.
        """
        super().__init__()
        if min(max_documents, max_val_documents, pairs_per_document, batch_size, generation_batch_size) < 1:
            raise ConfigError("max_documents, max_val_documents, pairs_per_document, batch_size and "
                              "generation_batch_size must be >= 1")
        if not 1 <= min_continuation <= continuation_tokens or prefix_tokens < 1:
            raise ConfigError(f"need 1 <= min_continuation <= continuation_tokens and prefix_tokens >= 1, got "
                              f"{min_continuation}, {continuation_tokens}, {prefix_tokens}")
        if random_negatives < 0 or model_negatives < 0 or random_negatives + model_negatives < 1 or max_generated < 0:
            raise ConfigError(f"need random_negatives, model_negatives, max_generated >= 0 and at least one negative, "
                              f"got {random_negatives}, {model_negatives}, {max_generated}")
        self.save_hyperparameters()
        self.target_source = target
        self.target: Backbone | None = None
        """The target model, after `setup`."""
        self.cache_dir = Path(cache_dir) if cache_dir else warpdecode_cache_dir() / "rankgen"
        self.pairs: dict[str, list[Pair]] = {}
        self.stats: dict[str, float] = {}

    def texts(self, split: str) -> list[str]:
        h = self.hparams
        count = h["max_documents" if split == "train" else "max_val_documents"]
        if h["source"] == GSM8K:
            return gsm8k_documents(split, h["max_val_documents"], h["seed"])[:count]
        folder = Path(h["source"]) / split
        if not folder.is_dir():
            raise ConfigError(f"{folder} is not a folder of {split} text files (source is gsm8k or a folder with "
                              "train/ and val/)")
        return [p.read_text(encoding="utf-8", errors="replace") for p in sorted(folder.iterdir()) if p.is_file()][:count]

    def documents(self, tokenizer: Tokenizer, split: str) -> list[list[int]]:
        """The split's documents as token ids."""
        return [tokenizer.encode(text, add_special_tokens=False) for text in self.texts(split)]

    def continuations(self, model: Backbone, prefixes: list[list[int]], stop_ids: set[int]) -> list[list[int]]:
        """The target's sampled continuations of `continuation_tokens` tokens of each prefix (`model_negatives`
        per prefix, flattened prefix-major), read from the cache or generated and cached."""
        h = self.hparams
        copies = [p for p in prefixes for _ in range(h["model_negatives"])]
        settings = {"fingerprint": model.fingerprint(), "tokens": h["continuation_tokens"], "top_p": h["top_p"],
                    "seed": h["seed"], "prefixes": copies}
        path = self.cache_dir / f"continuations-{content_key(settings)}.json"
        if path.is_file():
            return list(json.loads(path.read_text()))
        sampler = Sampler(SamplingConfig(do_sample=True, top_p=h["top_p"], seed=h["seed"]))
        out: list[list[int]] = []
        batch = h["generation_batch_size"]
        for i in range(0, len(copies), batch):
            rows = copies[i : i + batch]
            results = decode_batch(model, rows, sampler, budgets=[h["continuation_tokens"]] * len(rows),
                                   stop_ids=stop_ids)
            out += [[t for t in new if t not in stop_ids] for new, *_ in results]
            rank_zero_info(f"rankgen negatives: {len(out)}/{len(copies)} continuations")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(out))
        tmp.replace(path)
        return out

    def build(self, model: Backbone, documents: list[list[int]], split: str, stop_ids: set[int]) -> list[Pair]:
        h = self.hparams
        pairs = make_pairs(documents, prefix_tokens=h["prefix_tokens"], continuation_tokens=h["continuation_tokens"],
                           min_continuation=h["min_continuation"], per_document=h["pairs_per_document"],
                           negatives=h["random_negatives"] + h["model_negatives"], seed=h["seed"] + (split == "val"))
        M = h["model_negatives"]
        generated = pairs if split == "val" else pairs[: h["max_generated"]]
        if M and generated:
            own = self.continuations(model, [p.prefix for p in generated], stop_ids)
            for i, pair in enumerate(generated):
                n = len(pair.positive)
                for j in range(M):
                    if own[i * M + j][:n]:  # an empty sample (a stop token first) keeps its random span
                        pair.negatives[h["random_negatives"] + j] = own[i * M + j][:n]
                        pair.kinds[h["random_negatives"] + j] = MODEL
        return pairs

    def setup(self, stage: str) -> None:
        if self.pairs:
            return
        model, tokenizer = load_pretrained(self.target_source)
        self.target = model
        stop_ids = stop_token_ids(model, tokenizer)
        for split in ("train", "val"):
            documents = self.documents(tokenizer, split)
            self.pairs[split] = self.build(model, documents, split, stop_ids)
            if not self.pairs[split]:
                raise ConfigError(f"rankgen {split}: no document is long enough for a prefix, a continuation and "
                                  f"its negatives (min_continuation={self.hparams['min_continuation']})")
        kinds = torch.tensor([p.kinds for p in self.pairs["train"]])
        self.stats = {"train_pairs": len(self.pairs["train"]), "val_pairs": len(self.pairs["val"]),
                      "train_model_negatives": int((kinds == MODEL).sum())}
        rank_zero_info(f"rankgen data: {self.stats}")

    def train_dataloader(self) -> DataLoader:
        return DataLoader(Pairs(self.pairs["train"]), batch_size=self.hparams["batch_size"], shuffle=True, collate_fn=collate,
                          drop_last=len(self.pairs["train"]) > self.hparams["batch_size"])

    def val_dataloader(self) -> DataLoader:
        return DataLoader(Pairs(self.pairs["val"]), batch_size=self.hparams["batch_size"], collate_fn=collate)
