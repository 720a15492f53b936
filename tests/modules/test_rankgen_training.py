"""RankGen's contrastive training: the pairs and their negatives, a fit that learns to rank the true
continuation first, the saved encoder as a search's scorer, and the recipe."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml
from jsonargparse import ArgumentParser
from lightning.pytorch import LightningDataModule, LightningModule, Trainer

from warpdecode.datamodules.rankgen_pairs import MODEL, RANDOM, RankGenDataModule, collate, make_pairs
from warpdecode.decoding import registry
from warpdecode.decoding.outputs import Candidate
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.decoding.search.rankgen import RankGenScorer
from warpdecode.errors import ConfigError
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.modules.rankgen import RankGenModule

pytestmark = pytest.mark.usefixtures("single_thread")
CYCLE = list(range(40, 70))
"""Documents walk this cycle of 30 tokens from a random start: what follows a prefix is its next tokens,
which a bag of (linearly independent) embeddings can learn to tell from any other span of the document."""


class Cycles(RankGenDataModule):
    def documents(self, tokenizer, split):
        rng = random.Random(split)
        count = self.hparams["max_documents" if split == "train" else "max_val_documents"]
        return [[CYCLE[(s + i) % len(CYCLE)] for i in range(len(CYCLE))] for s in (rng.randrange(30) for _ in range(count))]


def cycles(model_dir: Path, cache: Path, **options) -> Cycles:
    args = {"source": "cycles", "max_documents": 160, "max_val_documents": 32, "prefix_tokens": 12,
            "continuation_tokens": 6, "min_continuation": 4, "random_negatives": 2, "model_negatives": 1,
            "max_generated": 40, "generation_batch_size": 20, "batch_size": 16, "cache_dir": str(cache)} | options
    return Cycles(str(model_dir), **args)


def test_pairs_hold_the_true_continuation_and_spans_that_miss_it():
    doc = list(range(100, 140))
    pairs = make_pairs([doc, [1, 2, 3]], prefix_tokens=8, continuation_tokens=6, min_continuation=3, negatives=3,
                       per_document=5, seed=0)
    assert len(pairs) == 5  # the 3-token document is too short
    for p in pairs:
        t = doc.index(p.positive[0])
        assert p.prefix == doc[max(0, t - 8) : t] and p.positive == doc[t : t + len(p.positive)]
        assert 3 <= len(p.positive) <= 6 and p.kinds == [RANDOM] * 3
        for span in p.negatives:
            assert len(span) == len(p.positive) and not set(span) & set(p.positive)
    batch = collate(pairs)
    assert batch["negatives"].shape == (5, 3, max(len(p.positive) for p in pairs))
    assert batch["prefix_mask"].sum(1).tolist() == [len(p.prefix) for p in pairs]


def test_model_negatives_are_generated_once_and_cached(tiny_model_dir, tmp_path):
    data = cycles(tiny_model_dir, tmp_path / "cache")
    data.setup("fit")
    kinds = [p.kinds for p in data.pairs["train"]]
    assert sum(k[-1] == MODEL for k in kinds[:40]) >= 30 and all(k[-1] == RANDOM for k in kinds[40:])
    assert sum(p.kinds[-1] == MODEL for p in data.pairs["val"]) >= 24  # every one but empty samples
    files = list((tmp_path / "cache").glob("continuations-*.json"))
    assert len(files) == 2  # train and validation prefixes
    again = cycles(tiny_model_dir, tmp_path / "cache")
    again.setup("fit")
    assert [p.negatives for p in again.pairs["train"]] == [p.negatives for p in data.pairs["train"]]
    assert len(json.loads(files[0].read_text())) in (40, 32)
    with pytest.raises(ConfigError, match="not a folder"):
        RankGenDataModule(str(tiny_model_dir), source=str(tmp_path / "missing"), cache_dir=str(tmp_path)).setup("fit")
    with pytest.raises(ConfigError, match="min_continuation"):
        RankGenDataModule(str(tiny_model_dir), min_continuation=9, continuation_tokens=8)


def test_a_short_fit_ranks_the_true_continuation_first(tiny_model_dir, tmp_path):
    data = cycles(tiny_model_dir, tmp_path / "cache")
    module = RankGenModule(width=64, layers=0, heads=4, lr=1e-2, export_path=str(tmp_path / "rankgen.safetensors"))
    trainer = Trainer(max_epochs=20, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=str(tmp_path), num_sanity_val_steps=0)
    trainer.validate(module, datamodule=data)
    before = float(trainer.callback_metrics["val/loss"])
    trainer.fit(module, datamodule=data)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    assert before > 4.0 and metrics["val/loss"] < before - 1.0  # chance: log(16 + 16 * 3) = 4.16
    assert metrics["val/accuracy_random"] > 0.85 and metrics["val/accuracy"] > 0.8  # held out; chance: 1/3, 1/4

    model, _ = load_pretrained(tiny_model_dir)
    scorer = RankGenScorer.load(str(tmp_path / "rankgen.safetensors"), model)
    prefix, true, span = CYCLE[3:15], CYCLE[15:20], CYCLE[22:27]
    scores = scorer.score(prefix, [Candidate(span, "length"), Candidate(true, "length")])
    assert scores[1] > scores[0]
    strategy = registry.build("search", "rankgen", path=str(tmp_path / "rankgen.safetensors"), beams=2, samples=2,
                              chunk=3)
    out = strategy.search(model, None, prefix, Sampler(SamplingConfig(do_sample=True, seed=0)), max_new_tokens=5,
                          stop_ids=set())
    assert len(out.candidates[0].token_ids) == 5


def test_the_recipe_builds(tiny_model_dir):
    config = yaml.safe_load((Path(__file__).parents[2] / "configs" / "search" / "rankgen.yaml").read_text())
    parser = ArgumentParser()
    parser.add_subclass_arguments(LightningModule, "model")
    parser.add_subclass_arguments(LightningDataModule, "data")
    config["data"]["init_args"]["target"] = str(tiny_model_dir)
    built = parser.instantiate_classes(parser.parse_object({"model": config["model"], "data": config["data"]}))
    assert isinstance(built.model, RankGenModule) and built.model.hparams["width"] == 128
    assert isinstance(built.data, RankGenDataModule) and built.data.hparams["source"] == "gsm8k"
    with pytest.raises(ConfigError, match="heads"):
        RankGenModule(width=130, heads=4)
