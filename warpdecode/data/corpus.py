"""Text corpora: reading, splitting by document, and tokenising into cached token blocks.

A corpus is the Python standard library of the running interpreter, a folder of text files or a
`.jsonl` file. Documents are assigned to train/val/test by a hash of their name (relative path,
or the record text for JSONL), so a held-out file never leaks into training and adding files never
moves old ones between splits. The tokenizer (a model's, or a byte-level BPE trained on the train
split only) and the token blocks are cached on disk, keyed by a corpus fingerprint, the tokenizer's
hash and the block size; the second build of the same configuration reads the cache.

Training reads a corpus through `datamodules.corpus.CorpusDataModule`; the runtime (a retrieval
drafter's datastore) and the benchmark (held-out stdlib prompts) read it here, without Lightning.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sysconfig
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from warpdecode.errors import ConfigError
from warpdecode.io import atomic_directory, sha256_file
from warpdecode.models.checkpoint import cache_dir as warpdecode_cache_dir
from warpdecode.models.checkpoint import resolve
from warpdecode.models.tokenizer import Tokenizer, train_bpe
from warpdecode.progress import log_line

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


def cut_blocks(documents: Sequence[Sequence[int]], eos_token_id: int, block_size: int) -> np.ndarray:
    """Concatenate documents with EOS after each one and cut the stream into overlapping windows.

    Window i covers stream[i * block_size : i * block_size + block_size + 1], so consecutive
    windows share one token and every stream token except the first is a target exactly once.
    Example with block_size=3: stream [a b c d e f g h] → [[a b c d], [d e f g]]; `h` is dropped.

    Returns:
        (N, block_size + 1) uint16 when the ids fit, int32 otherwise.
    """
    lengths = [len(doc) + 1 for doc in documents]
    stream = np.empty(sum(lengths), dtype=np.int64)
    pos = 0
    for doc, length in zip(documents, lengths):
        stream[pos : pos + length - 1] = doc
        stream[pos + length - 1] = eos_token_id
        pos += length
    n_blocks = max(0, (len(stream) - 1) // block_size)
    dtype = np.uint16 if stream.size == 0 or int(stream.max()) < 2**16 else np.int32
    starts = np.arange(n_blocks)[:, None] * block_size  # (N, 1)
    return stream[starts + np.arange(block_size + 1)].astype(dtype)  # (N, block_size + 1)


def train_subset(blocks: np.ndarray, max_train_tokens: int | None, block_size: int, seed: int) -> np.ndarray:
    """A seeded random subset of about `max_train_tokens` tokens of `blocks` (N, block_size + 1), in
    corpus order; all of `blocks` when `max_train_tokens` is None or covers them."""
    if max_train_tokens is None:
        return blocks
    keep = max(1, max_train_tokens // block_size)
    if keep >= len(blocks):
        return blocks
    subset = np.sort(np.random.default_rng(seed).permutation(len(blocks))[:keep])
    return np.ascontiguousarray(blocks[subset])


@dataclass(frozen=True)
class CorpusBlocks:
    """A tokenised corpus: its tokenizer, the cache's meta.json and each split's blocks
    (N, block_size + 1), memory-mapped."""

    tokenizer: Tokenizer
    meta: dict[str, Any]
    splits: dict[str, np.ndarray]
    cache_hit: bool
    """Whether the blocks were found in the cache."""


class Corpus:
    """The documents of a corpus source, split by a hash of each document's key."""

    def __init__(self, source: str = STDLIB, glob: str | None = None,
                 exclude_dirs: Sequence[str] = DEFAULT_EXCLUDE, text_field: str = "text",
                 val_fraction: float = 0.05, test_fraction: float = 0.05, max_chars: int | None = None) -> None:
        """Args: as `CorpusDataModule`'s arguments of the same names."""
        if not 0 < val_fraction < 1 or not 0 <= test_fraction < 1 or val_fraction + test_fraction >= 1:
            raise ConfigError(
                f"need 0 < val_fraction, 0 <= test_fraction and val_fraction + test_fraction < 1, "
                f"got val_fraction={val_fraction}, test_fraction={test_fraction}"
            )
        if max_chars is not None and max_chars <= 0:
            raise ConfigError(f"max_chars must be positive, got {max_chars}")
        if source != STDLIB and not Path(source).exists():
            raise ConfigError(f"corpus source {source!r} not found (expected 'stdlib', a folder or a .jsonl file)")
        self.source = source
        self.glob = glob or ("**/*.py" if source == STDLIB else "**/*.txt")
        self.exclude_dirs = list(exclude_dirs)
        self.text_field = text_field
        self.fractions = {"train": 1 - val_fraction - test_fraction, "val": val_fraction, "test": test_fraction}
        self.max_chars = max_chars

    # ---- listing and reading --------------------------------------------------------------------

    def root(self) -> Path:
        path = Path(sysconfig.get_paths()["stdlib"]) if self.source == STDLIB else Path(self.source)
        if not path.exists():
            raise ConfigError(f"corpus source {self.source!r} not found (expected 'stdlib', a folder or a .jsonl file)")
        if path.is_file() and path.suffix != ".jsonl":
            raise ConfigError(f"corpus file {path} is not a .jsonl file; pass its folder with a glob instead")
        return path.resolve()

    def source_files(self) -> list[Path]:
        """The files a folder source reads (sorted), or the JSONL file itself."""
        root = self.root()
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

    def fingerprint(self, root: Path) -> str:
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

    def documents(self, root: Path) -> Documents:
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

    def split_files(self, split: str) -> list[tuple[str, Path]]:
        """(relative path, path) of the files of a folder source that fall into `split`, sorted."""
        root = self.root()
        files = [(path.relative_to(root).as_posix(), path) for path in self.source_files()]
        return [(key, path) for key, path in files
                if split_of(key, self.fractions["val"], self.fractions["test"]) == split]

    # ---- cached tokenizer and blocks ------------------------------------------------------------

    def blocks(self, *, block_size: int, tokenizer: str | None = None, bpe_vocab_size: int = 8192,
               cache_dir: Path | None = None, log: Callable[[str], None] = log_line) -> CorpusBlocks:
        """Load the tokenizer and every split's blocks of `block_size` + 1 tokens, building (and
        caching) whatever the cache lacks.

        Args:
            block_size: Tokens per training window.
            tokenizer: A model directory or model name whose tokenizer to use; None trains a
                byte-level BPE of `bpe_vocab_size` tokens on the train split (cached).
            cache_dir: Where tokenizers and blocks are cached; default `$WARPDECODE_CACHE/corpus`.
            log: Where the one-line notes of long steps go.
        """
        if block_size <= 0:
            raise ConfigError(f"block_size must be positive, got {block_size}")
        cache_root = cache_dir if cache_dir is not None else warpdecode_cache_dir() / "corpus"
        root = self.root()
        fingerprint = self.fingerprint(root)
        documents = cache(lambda: self.documents(root))
        tokenizer_dir = self._tokenizer_dir(tokenizer, bpe_vocab_size, cache_root, fingerprint, documents, log)
        loaded = Tokenizer.load(tokenizer_dir)
        tokenizer_hash = sha256_file(tokenizer_dir / "tokenizer.json")
        key = _sha256(f"{fingerprint}:{tokenizer_hash}:{block_size}")[:24]
        directory = cache_root / "blocks" / key
        cache_hit = (directory / "meta.json").is_file()
        if not cache_hit:
            with atomic_directory(directory, replace=False) as tmp:  # a concurrent writer may win
                meta: dict[str, Any] = {"source": str(root), "block_size": block_size, "splits": {}}
                for split, docs in documents().items():
                    split_blocks = encode_split(loaded, split, docs, block_size)
                    np.save(tmp / f"{split}.npy", split_blocks)
                    meta["splits"][split] = {"documents": [k for k, _ in docs], "blocks": len(split_blocks)}
                (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        meta = json.loads((directory / "meta.json").read_text())
        splits = {split: np.load(directory / f"{split}.npy", mmap_mode="r") for split in SPLITS}
        return CorpusBlocks(loaded, meta, splits, cache_hit)

    def _tokenizer_dir(self, tokenizer: str | None, bpe_vocab_size: int, cache_root: Path, fingerprint: str,
                       documents: Callable[[], Documents], log: Callable[[str], None]) -> Path:
        if tokenizer is not None:
            return resolve(tokenizer)
        directory = cache_root / "tokenizers" / f"bpe{bpe_vocab_size}-{fingerprint[:16]}"
        if not (directory / "tokenizer.json").is_file():
            log(f"training a {bpe_vocab_size}-token byte-level BPE on the train split")
            trained = train_bpe(iter(text for _, text in documents()["train"]), bpe_vocab_size)
            with atomic_directory(directory, replace=False) as tmp:  # a concurrent writer may win
                trained.save(tmp)
        return directory


def encode_split(tokenizer: Tokenizer, split: str, docs: list[tuple[str, str]], block_size: int) -> np.ndarray:
    """The blocks (N, block_size + 1) of one split's documents, each followed by the EOS token."""
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
    return cut_blocks(ids, eos, block_size)


def stdlib_split_files(split: str) -> list[tuple[str, Path]]:
    """(relative path, path) of the files of `split` ("train", "val" or "test") of the stdlib corpus
    with its default fractions, sorted: the drafter recipes' docstring prompts come from `train`, the
    bench's `stdlib_code` prompts from `test`."""
    return Corpus(source=STDLIB).split_files(split)
