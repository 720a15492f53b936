"""Text corpora → cached token blocks for causal-LM training.

The corpus itself (listing, splitting by document, the tokenizer and block cache) is
`warpdecode.data.corpus.Corpus`; this module feeds its blocks to Lightning. The training order
depends only on the seed and the epoch, and the training loader's position is checkpointed, so a run
resumed from any checkpoint sees the same batches as the uninterrupted run.
"""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from warpdecode.data.corpus import DEFAULT_EXCLUDE, SPLITS, STDLIB, Corpus, CorpusBlocks, train_subset
from warpdecode.datamodules.blocks import EpochShuffleSampler, ResumableLoader, TokenBlocks
from warpdecode.errors import ConfigError
from warpdecode.models.tokenizer import Tokenizer


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
        for name, value in (("block_size", block_size), ("batch_size", batch_size),
                            ("max_train_tokens", max_train_tokens)):
            if value is not None and value <= 0:
                raise ConfigError(f"{name} must be positive, got {value}")
        self.corpus = Corpus(source, glob, exclude_dirs, text_field, val_fraction, test_fraction, max_chars)
        self.save_hyperparameters()
        self.tokenizer_source = tokenizer
        self.bpe_vocab_size = bpe_vocab_size
        self.block_size = block_size
        self.batch_size = batch_size
        self.fractions = self.corpus.fractions
        self.max_train_tokens = max_train_tokens
        self.num_workers = num_workers
        self.cache_dir = Path(cache_dir) if cache_dir else None
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

    def source_files(self) -> list[Path]:
        """The files a folder source reads (sorted), or the JSONL file itself."""
        return self.corpus.source_files()

    def _build(self) -> CorpusBlocks:
        built = self.corpus.blocks(block_size=self.block_size, tokenizer=self.tokenizer_source,
                                   bpe_vocab_size=self.bpe_vocab_size, cache_dir=self.cache_dir, log=rank_zero_info)
        self.cache_hit = built.cache_hit
        return built

    # ---- LightningDataModule hooks --------------------------------------------------------------

    def prepare_data(self) -> None:
        """Runs on one process per node before `setup`: trains the BPE and tokenises on a cache miss."""
        self._build()

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        built = self._build()
        meta = built.meta
        for split in SPLITS:
            blocks = built.splits[split]
            if self.fractions[split] > 0 and len(blocks) == 0:
                raise ConfigError(
                    f"the {split} split has no complete block of {self.block_size} tokens "
                    f"({len(meta['splits'][split]['documents'])} documents); lower block_size or use more text"
                )
            if split == "train":
                blocks = train_subset(blocks, self.max_train_tokens, self.block_size, self.seed)
            self.datasets[split] = TokenBlocks(blocks)
            self.split_documents[split] = meta["splits"][split]["documents"]
        self.tokenizer = built.tokenizer
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

