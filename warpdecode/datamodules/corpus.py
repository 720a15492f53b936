"""Text corpora → cached token blocks for causal-LM training.

A corpus is the Python standard library of the running interpreter, a folder of text files or a
`.jsonl` file. Documents are assigned to train/val/test by a hash of their name (relative path,
or the record text for JSONL), so a held-out file never leaks into training and adding files never
moves old ones between splits. The tokenizer (a model's, or a byte-level BPE trained on the train
split only) and the token blocks are cached on disk, keyed by a corpus fingerprint, the tokenizer's
hash and the block size; the second setup of the same configuration reads the cache. The training
order depends only on the seed and the epoch, and the training loader's position is checkpointed,
so a run resumed from any checkpoint sees the same batches as the uninterrupted run.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sysconfig
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from warpdecode.datamodules.blocks import EpochShuffleSampler, ResumableLoader, TokenBlocks, cut_blocks
from warpdecode.errors import ConfigError
from warpdecode.io import atomic_directory, sha256_file
from warpdecode.models.checkpoint import cache_dir as warpdecode_cache_dir
from warpdecode.models.checkpoint import resolve
from warpdecode.models.tokenizer import Tokenizer, train_bpe

STDLIB = "stdlib"
SPLITS = ("train", "val", "test")
DEFAULT_EXCLUDE = ("site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test")
CACHE_VERSION = 1

Documents = dict[str, list[tuple[str, str]]]
"""Split name → [(document key, text)] in a deterministic order."""


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def read_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed record) of every non-blank line; invalid JSON is a ConfigError naming the line."""
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield line_no, json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}:{line_no}: invalid JSON: {e}") from e


def split_of(key: str, val_fraction: float, test_fraction: float) -> str:
    """The split of a document: a uniform hash of its key into [0, 1), cut at the two fractions."""
    u = int.from_bytes(hashlib.sha256(f"warpdecode-split:{key}".encode()).digest()[:8], "big") / 2**64
    if u < val_fraction:
        return "val"
    return "test" if u < val_fraction + test_fraction else "train"


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """Compile a glob over '/'-separated relative paths: `**/` spans directories, `*` and `?` do not."""
    parts = re.split(r"(\*\*/|\*|\?)", pattern)
    table = {"**/": "(?:.*/)?", "*": "[^/]*", "?": "[^/]"}
    return re.compile("".join(table.get(part, re.escape(part)) for part in parts))




class CorpusDataModule(LightningDataModule):
    """Next-token training blocks from a text corpus, split by document and cached on disk."""

    def __init__(
        self,
        source: str = STDLIB,
        glob: str | None = None,
        exclude_dirs: tuple[str, ...] = DEFAULT_EXCLUDE,
        text_field: str = "text",
        tokenizer: str | None = None,
        bpe_vocab_size: int = 8192,
        block_size: int = 256,
        batch_size: int = 16,
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
        max_chars: int | None = None,
        max_train_tokens: int | None = None,
        num_workers: int = 0,
        cache_dir: str | None = None,
        seed: int = 0,
    ) -> None:
        """
        Args:
            source: `stdlib` (the `.py` sources of the running Python's standard library), a folder
                of text files, or a `.jsonl` file with one JSON object per line.
            glob: Files to read under a folder source; default `**/*.py` for `stdlib`, `**/*.txt`
                for folders.
            exclude_dirs: Skip files below a directory with one of these names (site-packages and
                test directories by default, so tests never become training data).
            text_field: Key of the text in each JSONL record.
            tokenizer: A model directory or model name whose tokenizer to use; None trains a
                byte-level BPE on the train split (cached).
            bpe_vocab_size: Vocabulary size of the trained BPE (ignored when `tokenizer` is set).
            block_size: Tokens per training window (each block holds block_size + 1 ids).
            batch_size: Blocks per batch (per device).
            val_fraction: Expected fraction of documents held out for validation.
            test_fraction: Expected fraction of documents held out for testing (0 disables `test`).
            max_chars: Read at most about this many characters in total, each split taking its
                fraction of the budget from its documents in order; for quick runs.
            max_train_tokens: Keep a seeded random subset of about this many training tokens.
            num_workers: DataLoader worker processes.
            cache_dir: Where tokenizers and blocks are cached; default `$WARPDECODE_CACHE/corpus`.
            seed: Seed of the training shuffle (per epoch) and of the `max_train_tokens` subset.
        """
        super().__init__()
        if not 0 < val_fraction < 1 or not 0 <= test_fraction < 1 or val_fraction + test_fraction >= 1:
            raise ConfigError(
                f"need 0 < val_fraction, 0 <= test_fraction and val_fraction + test_fraction < 1, "
                f"got val_fraction={val_fraction}, test_fraction={test_fraction}"
            )
        for name, value in (("block_size", block_size), ("batch_size", batch_size), ("max_chars", max_chars),
                            ("max_train_tokens", max_train_tokens)):
            if value is not None and value <= 0:
                raise ConfigError(f"{name} must be positive, got {value}")
        if source != STDLIB and not Path(source).exists():
            raise ConfigError(f"corpus source {source!r} not found (expected 'stdlib', a folder or a .jsonl file)")
        self.save_hyperparameters()
        self.source = source
        self.glob = glob or ("**/*.py" if source == STDLIB else "**/*.txt")
        self.exclude_dirs = list(exclude_dirs)
        self.text_field = text_field
        self.tokenizer_source = tokenizer
        self.bpe_vocab_size = bpe_vocab_size
        self.block_size = block_size
        self.batch_size = batch_size
        self.fractions = {"train": 1 - val_fraction - test_fraction, "val": val_fraction, "test": test_fraction}
        self.max_chars = max_chars
        self.max_train_tokens = max_train_tokens
        self.num_workers = num_workers
        self.cache_dir = Path(cache_dir) if cache_dir else warpdecode_cache_dir() / "corpus"
        self.seed = seed
        self.tokenizer: Tokenizer | None = None
        """The tokenizer, available after `setup`."""
        self.datasets: dict[str, TokenBlocks] = {}
        self.split_documents: dict[str, list[str]] = {}
        """Split name → document keys (relative paths, or record hashes for JSONL), after `setup`."""
        self.cache_hit: bool | None = None
        """Whether the last `prepare_data`/`setup` found the token blocks in the cache."""

    @property
    def vocab_size(self) -> int:
        if self.tokenizer is None:
            raise RuntimeError("call setup() before reading vocab_size")
        return self.tokenizer.vocab_size

    # ---- corpus listing and reading -------------------------------------------------------------

    def _root(self) -> Path:
        path = Path(sysconfig.get_paths()["stdlib"]) if self.source == STDLIB else Path(self.source)
        if not path.exists():
            raise ConfigError(f"corpus source {self.source!r} not found (expected 'stdlib', a folder or a .jsonl file)")
        if path.is_file() and path.suffix != ".jsonl":
            raise ConfigError(f"corpus file {path} is not a .jsonl file; pass its folder with a glob instead")
        return path.resolve()

    def source_files(self) -> list[Path]:
        """The files a folder source reads (sorted), or the JSONL file itself."""
        root = self._root()
        return [root] if root.is_file() else self._files(root)

    def _files(self, root: Path) -> list[Path]:
        # os.walk prunes excluded directories before descending (the stdlib's site-packages holds
        # ten times more files than the stdlib itself); the glob is matched as a regex on the path.
        excluded = set(self.exclude_dirs)
        pattern = _glob_regex(self.glob)
        files = []
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d not in excluded]
            rel = Path(folder).relative_to(root)
            files += [root / rel / n for n in names if pattern.fullmatch((rel / n).as_posix())]
        files.sort()
        if not files:
            raise ConfigError(f"no files matched {self.glob!r} under {root} (excluding directories {sorted(excluded)})")
        return files

    def _fingerprint(self, root: Path) -> str:
        """Hash of everything that decides the documents of each split (stat-based, no reading)."""
        if root.is_file():
            stat = root.stat()
            entries = [[root.name, stat.st_size, stat.st_mtime_ns]]
        else:
            entries = [[p.relative_to(root).as_posix(), p.stat().st_size, p.stat().st_mtime_ns] for p in self._files(root)]
        spec = {
            "version": CACHE_VERSION, "root": str(root), "glob": self.glob, "exclude_dirs": self.exclude_dirs,
            "text_field": self.text_field, "fractions": self.fractions, "max_chars": self.max_chars,
            "entries": entries,
        }
        return _sha256(json.dumps(spec, sort_keys=True))

    def _records(self, root: Path) -> list[tuple[str, str]]:
        if root.is_file():
            records = []
            for line_no, record in read_jsonl(root):
                text = record.get(self.text_field) if isinstance(record, dict) else None
                if not isinstance(text, str):
                    raise ConfigError(f"{root}:{line_no}: no string field {self.text_field!r}")
                records.append((_sha256(text)[:16], text))
            return records
        return [
            (p.relative_to(root).as_posix(), p.read_text(encoding="utf-8", errors="replace")) for p in self._files(root)
        ]

    def _documents(self, root: Path) -> Documents:
        docs: Documents = {split: [] for split in SPLITS}
        records = [(key, text) for key, text in self._records(root) if text.strip()]
        if not records:
            raise ConfigError(f"corpus {root} is empty: every document is blank")
        for key, text in records:
            docs[split_of(key, self.fractions["val"], self.fractions["test"])].append((key, text))
        for split in SPLITS:
            if self.fractions[split] > 0 and not docs[split]:
                raise ConfigError(
                    f"no document of {root} fell into the {split} split ({len(records)} documents, "
                    f"{split} fraction {self.fractions[split]:.3f}); use a larger corpus or a larger fraction"
                )
            if self.max_chars is not None:
                budget, total = self.max_chars * self.fractions[split], 0
                kept: list[tuple[str, str]] = []
                for doc in docs[split]:
                    if kept and total >= budget:
                        break
                    kept.append(doc)
                    total += len(doc[1])
                docs[split] = kept
        return docs

    # ---- cached tokenizer and blocks ------------------------------------------------------------

    def _tokenizer_dir(self, fingerprint: str, documents: Callable[[], Documents]) -> Path:
        if self.tokenizer_source is not None:
            return resolve(self.tokenizer_source)
        directory = self.cache_dir / "tokenizers" / f"bpe{self.bpe_vocab_size}-{fingerprint[:16]}"
        if not (directory / "tokenizer.json").is_file():
            rank_zero_info(f"training a {self.bpe_vocab_size}-token byte-level BPE on the train split")
            tokenizer = train_bpe(iter(text for _, text in documents()["train"]), self.bpe_vocab_size)
            with atomic_directory(directory, replace=False) as tmp:  # a concurrent writer may win
                tokenizer.save(tmp)
        return directory

    def _encode_split(self, tokenizer: Tokenizer, split: str, docs: list[tuple[str, str]]) -> np.ndarray:
        eos = tokenizer.eos_token_id
        if eos is None:
            raise ConfigError("the tokenizer has no end-of-text token to separate documents")
        ids: list[list[int]] = []
        chunk = 32
        with tqdm(total=len(docs), desc=f"tokenising {split}", unit="doc", disable=None) as bar:
            for i in range(0, len(docs), chunk):
                texts = [text for _, text in docs[i : i + chunk]]
                ids.extend(tokenizer.encode_batch(texts, add_special_tokens=False))
                bar.update(len(texts))
        return cut_blocks(ids, eos, self.block_size)

    def _build(self) -> tuple[Tokenizer, dict[str, Any], dict[str, np.ndarray]]:
        """Load the tokenizer and every split's blocks, building whatever the cache lacks."""
        root = self._root()
        fingerprint = self._fingerprint(root)
        documents = cache(lambda: self._documents(root))
        tokenizer_dir = self._tokenizer_dir(fingerprint, documents)
        tokenizer = Tokenizer.load(tokenizer_dir)
        tokenizer_hash = sha256_file(tokenizer_dir / "tokenizer.json")
        key = _sha256(f"{fingerprint}:{tokenizer_hash}:{self.block_size}")[:24]
        directory = self.cache_dir / "blocks" / key
        self.cache_hit = (directory / "meta.json").is_file()
        if not self.cache_hit:

            def write(tmp: Path) -> None:
                meta: dict[str, Any] = {"source": str(root), "block_size": self.block_size, "splits": {}}
                for split, docs in documents().items():
                    blocks = self._encode_split(tokenizer, split, docs)
                    np.save(tmp / f"{split}.npy", blocks)
                    meta["splits"][split] = {"documents": [k for k, _ in docs], "blocks": len(blocks)}
                (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")

            with atomic_directory(directory, replace=False) as tmp:
                write(tmp)
        meta = json.loads((directory / "meta.json").read_text())
        arrays = {split: np.load(directory / f"{split}.npy", mmap_mode="r") for split in SPLITS}
        return tokenizer, meta, arrays

    # ---- LightningDataModule hooks --------------------------------------------------------------

    def prepare_data(self) -> None:
        """Runs on one process per node before `setup`: trains the BPE and tokenises on a cache miss."""
        self._build()

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        tokenizer, meta, arrays = self._build()
        for split in SPLITS:
            blocks = arrays[split]
            if self.fractions[split] > 0 and len(blocks) == 0:
                raise ConfigError(
                    f"the {split} split has no complete block of {self.block_size} tokens "
                    f"({len(meta['splits'][split]['documents'])} documents); lower block_size or use more text"
                )
            if split == "train" and self.max_train_tokens is not None:
                keep = max(1, self.max_train_tokens // self.block_size)
                if keep < len(blocks):
                    subset = np.sort(np.random.default_rng(self.seed).permutation(len(blocks))[:keep])
                    blocks = np.ascontiguousarray(blocks[subset])
            self.datasets[split] = TokenBlocks(blocks)
            self.split_documents[split] = meta["splits"][split]["documents"]
        self.tokenizer = tokenizer
        summary = ", ".join(f"{s} {len(d)} from {len(self.split_documents[s])} docs" for s, d in self.datasets.items())
        rank_zero_info(f"corpus blocks of {self.block_size} tokens: {summary}")

    def _loader(self, split: str) -> DataLoader:
        if not self.datasets:
            raise RuntimeError("call setup() before asking for a dataloader")
        if self.fractions[split] == 0:
            raise ConfigError(f"the {split} split is disabled ({split}_fraction=0)")
        dataset = self.datasets[split]
        if split == "train":
            return ResumableLoader(
                dataset,
                batch_size=self.batch_size,
                sampler=EpochShuffleSampler(len(dataset), self.seed),
                num_workers=self.num_workers,
                persistent_workers=self.num_workers > 0,
            )
        return DataLoader(
            dataset, batch_size=self.batch_size, num_workers=self.num_workers, persistent_workers=self.num_workers > 0
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")


def stdlib_split_files(split: str) -> list[tuple[str, Path]]:
    """(relative path, path) of the files of `split` ("train", "val" or "test") of
    `CorpusDataModule(source="stdlib")` with its default fractions, sorted: the drafter recipes'
    docstring prompts come from `train`, the bench's `stdlib_code` prompts from `test`."""
    corpus = CorpusDataModule(source=STDLIB)
    root = Path(sysconfig.get_paths()["stdlib"]).resolve()
    files = [(path.relative_to(root).as_posix(), path) for path in corpus.source_files()]
    return [(key, path) for key, path in files
            if split_of(key, corpus.fractions["val"], corpus.fractions["test"]) == split]
