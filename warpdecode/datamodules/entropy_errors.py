"""Where is greedy decoding wrong? The data of AdaDec's learned entropy threshold.

The target reads held-out text teacher-forced (Python files of the stdlib corpus by default: code,
like the tasks AdaDec is for, and never an evaluation set); at every position it gives the entropy H
(nats) of its next-token distribution and whether its top-1 token differs from the text's next token
(`wrong`). The `train` split's files train the fit, the `val` split's validate it. Each file gives
its first `block_size` tokens, so `max_documents` files span many modules instead of a few long
ones. Batches are `entropy` (B,) float32 and `wrong` (B,) float32.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler, TensorDataset
from tqdm.auto import tqdm

from warpdecode.data.corpus import STDLIB
from warpdecode.data.stdlib import split_sources
from warpdecode.decoding.rules.adadec import entropy
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.tokenizer import Tokenizer
from warpdecode.models.transformer import Transformer


@torch.inference_mode()
def entropy_errors(model: Transformer, blocks: list[list[int]], desc: str = "entropy") -> dict[str, Tensor]:
    """`entropy` (N,) float32 and `wrong` (N,) bool at every position of `blocks` that has a next token
    (teacher-forced: position t's distribution predicts token t + 1)."""
    entropies, wrong = [], []
    for block in tqdm(blocks, desc=desc, unit="block", disable=None):
        if len(block) < 2:
            continue
        tokens = torch.tensor([block], device=model.embed.weight.device)
        logits = model(tokens, logits_slice=slice(0, len(block) - 1)).logits[0]  # (T - 1, V)
        entropies.append(entropy(logits).cpu())
        wrong.append((logits.argmax(-1) != tokens[0, 1:]).cpu())
    if not wrong:
        raise ConfigError(f"{desc}: no block of two or more tokens to read")
    return {"entropy": torch.cat(entropies), "wrong": torch.cat(wrong)}


def text_blocks(tokenizer: Tokenizer, texts: list[str], block_size: int) -> list[list[int]]:
    """The first `block_size` tokens of each text."""
    return [tokenizer.encode(text)[:block_size] for text in texts]


class EntropyErrorsDataModule(LightningDataModule):
    def __init__(self, target: str = "smollm2-135m-instruct", source: str = STDLIB, max_documents: int = 48,
                 max_val_documents: int = 16, block_size: int = 256, batch_size: int = 65536, seed: int = 0) -> None:
        """
        Args:
            target: The model whose threshold is fit (name, directory or `.gguf`).
            source: `stdlib` (the corpus's train / val files), or a folder whose `train/` and `val/`
                subfolders hold text files.
            max_documents: Files read for training (a seeded sample of the split).
            max_val_documents: ... and for validation.
            block_size: Tokens read from the start of each file.
            batch_size: Positions per batch (the default fits every training position in one batch, as
                the full-batch L-BFGS fit wants).
            seed: Which files are sampled.
        """
        super().__init__()
        if min(max_documents, max_val_documents, batch_size) < 1 or block_size < 2:
            raise ConfigError(f"need max_documents, max_val_documents, batch_size >= 1 and block_size >= 2; got "
                              f"{max_documents}, {max_val_documents}, {batch_size}, {block_size}")
        self.save_hyperparameters()
        self.target_source = target
        self.target: Backbone | None = None
        """The target model, after `setup` (its fingerprint names the fitted package's target)."""
        self.datasets: dict[str, TensorDataset] = {}
        self.stats: dict[str, float] = {}

    def texts(self, split: str, count: int) -> list[str]:
        """A seeded sample of `count` texts of `split` (sorted files first, so the sample is reproducible)."""
        source = self.hparams["source"]
        if source == STDLIB:
            texts = [text for _, text in split_sources(split)]
        else:
            folder = Path(source) / split
            if not folder.is_dir():
                raise ConfigError(f"{folder} is not a folder of {split} text files (source is stdlib or a folder "
                                  f"with train/ and val/)")
            texts = [p.read_text(encoding="utf-8", errors="replace") for p in sorted(folder.iterdir()) if p.is_file()]
        random.Random(self.hparams["seed"]).shuffle(texts)
        return [t for t in texts if t.strip()][:count]

    def make_samples(self, model: Transformer, tokenizer: Tokenizer, split: str) -> dict[str, Tensor]:
        count = self.hparams["max_documents" if split == "train" else "max_val_documents"]
        blocks = text_blocks(tokenizer, self.texts(split, count), self.hparams["block_size"])
        return entropy_errors(model, blocks, desc=f"entropy {split}")

    def setup(self, stage: str) -> None:
        if self.datasets:
            return
        model, tokenizer = load_pretrained(self.target_source)
        self.target = model
        splits = {split: self.make_samples(model, tokenizer, split) for split in ("train", "val")}
        self.datasets = {split: TensorDataset(s["entropy"].float(), s["wrong"].float()) for split, s in splits.items()}
        train = splits["train"]
        self.stats = {"train_positions": len(train["wrong"]), "val_positions": len(splits["val"]["wrong"]),
                      "wrong_rate": round(float(train["wrong"].float().mean()), 4),
                      "mean_entropy": round(float(train["entropy"].mean()), 4)}
        rank_zero_info(f"adadec data: {self.stats}")

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        dataset = self.datasets[split]
        order = RandomSampler(dataset) if shuffle else SequentialSampler(dataset)
        batches = BatchSampler(order, self.hparams["batch_size"], drop_last=False)  # one index-list read per batch
        return DataLoader(dataset, sampler=batches, batch_size=None,
                          collate_fn=lambda columns: {"entropy": columns[0], "wrong": columns[1]})

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)
