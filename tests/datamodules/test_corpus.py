from __future__ import annotations

import hashlib
import json
import os
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch

from warpdecode.data import corpus as corpus_module
from warpdecode.data.corpus import DEFAULT_EXCLUDE, SPLITS, cut_blocks, split_of
from warpdecode.datamodules.corpus import CorpusDataModule
from warpdecode.errors import ConfigError

VAL, TEST = 0.2, 0.1


def make(source: Path, tmp_path: Path, **kwargs: object) -> CorpusDataModule:
    args: dict[str, object] = {
        "source": str(source), "glob": "**/*.py", "bpe_vocab_size": 400, "block_size": 32, "batch_size": 4,
        "val_fraction": VAL, "test_fraction": TEST, "cache_dir": str(tmp_path / "cache"),
    }
    args.update(kwargs)
    return CorpusDataModule(**args)  # type: ignore[arg-type]


def expected_blocks(dm: CorpusDataModule, texts: list[str]) -> np.ndarray:
    assert dm.tokenizer is not None and dm.tokenizer.eos_token_id is not None
    ids = dm.tokenizer.encode_batch(texts, add_special_tokens=False)
    return cut_blocks(ids, dm.tokenizer.eos_token_id, dm.block_size)


def test_split_by_file_is_deterministic_and_disjoint(code_folder: Path, tmp_path: Path) -> None:
    dm = make(code_folder, tmp_path)
    dm.setup()
    again = make(code_folder, tmp_path, cache_dir=str(tmp_path / "other-cache"))
    again.setup()
    assert again.split_documents == dm.split_documents

    splits = {split: set(keys) for split, keys in dm.split_documents.items()}
    all_files = {p.relative_to(code_folder).as_posix() for p in code_folder.rglob("*.py")}
    assert len(all_files) == 30
    assert splits["train"] | splits["val"] | splits["test"] == all_files
    assert sum(len(keys) for keys in splits.values()) == 30  # pairwise disjoint
    assert min(len(splits["val"]), len(splits["test"])) >= 1
    for split, keys in splits.items():
        assert {split_of(key, VAL, TEST) for key in keys} == {split}

    # a new file never moves the old ones to another split
    (code_folder / "pkg" / "added.py").write_text("value = 1\n" * 200)
    grown = make(code_folder, tmp_path)
    grown.setup()
    for split in SPLITS:
        assert splits[split] <= set(grown.split_documents[split])
    assert sum(len(keys) for keys in grown.split_documents.values()) == 31


def test_blocks_hold_exactly_their_split_documents(code_folder: Path, tmp_path: Path) -> None:
    dm = make(code_folder, tmp_path)
    dm.setup()
    for split in SPLITS:
        texts = [(code_folder / key).read_text() for key in dm.split_documents[split]]
        np.testing.assert_array_equal(dm.datasets[split].blocks, expected_blocks(dm, texts))
    batch = next(iter(dm.train_dataloader()))
    assert batch.shape == (4, 33) and batch.dtype == torch.int64


def test_bpe_is_trained_on_the_train_split_only(code_folder: Path, tmp_path: Path) -> None:
    def name_in(split: str, stem: str) -> str:
        return next(f"{stem}{i}.py" for i in range(1000) if split_of(f"{stem}{i}.py", VAL, TEST) == split)

    # letters only, so byte-level pre-tokenisation keeps each marker one word
    (code_folder / name_in("train", "seen")).write_text(" wvkpqmarker" * 2000)
    (code_folder / name_in("val", "held")).write_text(" zjxqvmarker" * 2000)
    dm = make(code_folder, tmp_path, bpe_vocab_size=1000)
    dm.setup()
    assert dm.tokenizer is not None and dm.vocab_size == 1000
    assert len(dm.tokenizer.encode(" wvkpqmarker", add_special_tokens=False)) == 1
    assert len(dm.tokenizer.encode(" zjxqvmarker", add_special_tokens=False)) >= 4


def test_second_setup_reads_the_cache(code_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = make(code_folder, tmp_path)
    first.setup()
    assert first.cache_hit is False

    def cache_miss(*args: object, **kwargs: object) -> None:
        raise AssertionError("expected a cache hit")

    monkeypatch.setattr(corpus_module, "train_bpe", cache_miss)
    monkeypatch.setattr(corpus_module, "encode_split", cache_miss)
    second = make(code_folder, tmp_path)
    second.prepare_data()
    second.setup()
    assert second.cache_hit is True
    assert first.tokenizer is not None and second.tokenizer is not None
    assert second.tokenizer.backend.get_vocab() == first.tokenizer.backend.get_vocab()
    for split in SPLITS:
        np.testing.assert_array_equal(second.datasets[split].blocks, first.datasets[split].blocks)

    # another block size reuses the cached tokenizer but cuts new blocks
    monkeypatch.undo()
    monkeypatch.setattr(corpus_module, "train_bpe", cache_miss)
    shorter = make(code_folder, tmp_path, block_size=16)
    shorter.setup()
    assert shorter.cache_hit is False
    assert len(shorter.datasets["train"]) > 2 * len(first.datasets["train"]) - 2

    # an edited file changes the corpus fingerprint
    edited = code_folder / first.split_documents["val"][0]
    edited.write_text(edited.read_text() + "\n# edited\n")
    os.utime(edited, ns=(1, 1))
    monkeypatch.undo()
    changed = make(code_folder, tmp_path)
    changed.setup()
    assert changed.cache_hit is False


def test_jsonl_source_splits_by_record(tmp_path: Path) -> None:
    texts = [f"record number {i} says " + "hello world " * (5 + i % 7) for i in range(120)]
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"body": t, "id": i}) + "\n" for i, t in enumerate(texts)) + "\n")
    dm = make(path, tmp_path, text_field="body", block_size=16, bpe_vocab_size=300)
    dm.setup()
    by_key = {hashlib.sha256(t.encode()).hexdigest()[:16]: t for t in texts}
    assert sum(len(keys) for keys in dm.split_documents.values()) == 120
    for split in SPLITS:
        keys = dm.split_documents[split]
        assert all(split_of(key, VAL, TEST) == split for key in keys)
        np.testing.assert_array_equal(dm.datasets[split].blocks, expected_blocks(dm, [by_key[k] for k in keys]))

    path.write_text('{"body": "fine"}\n\n{"body": oops}\n')
    with pytest.raises(ConfigError, match=r"data.jsonl:3: invalid JSON"):
        make(path, tmp_path, text_field="body").setup()
    path.write_text('{"text": "no body"}\n')
    with pytest.raises(ConfigError, match="no string field 'body'"):
        make(path, tmp_path, text_field="body").setup()


def test_limits_cap_characters_and_training_tokens(code_folder: Path, tmp_path: Path) -> None:
    full = make(code_folder, tmp_path)
    full.setup()
    small = make(code_folder, tmp_path, max_chars=20_000)
    small.setup()
    for split in SPLITS:
        kept = small.split_documents[split]
        assert kept == full.split_documents[split][: len(kept)]  # a prefix, in document order
        sizes = [len((code_folder / key).read_text()) for key in kept]
        budget = 20_000 * small.fractions[split]
        assert sum(sizes[:-1]) < budget and (sum(sizes) >= budget or kept == full.split_documents[split])
    assert len(small.split_documents["train"]) < len(full.split_documents["train"])

    capped = make(code_folder, tmp_path, max_train_tokens=320)
    capped.setup()
    train = capped.datasets["train"].blocks
    assert train.shape == (10, 33)
    full_rows = {row.tobytes() for row in np.asarray(full.datasets["train"].blocks)}
    assert all(row.tobytes() in full_rows for row in train)
    assert len(capped.datasets["val"]) == len(full.datasets["val"])


def test_stdlib_source_skips_tests_and_site_packages(tmp_path: Path) -> None:
    dm = CorpusDataModule(cache_dir=str(tmp_path))
    root = Path(sysconfig.get_paths()["stdlib"])
    files = {p.relative_to(root).as_posix() for p in dm.source_files()}
    expected = {
        p.relative_to(root).as_posix() for p in root.rglob("*.py")
        if not set(DEFAULT_EXCLUDE) & set(p.relative_to(root).parts[:-1])
    }
    assert files == expected
    assert {"os.py", "json/decoder.py", "asyncio/events.py"} <= files
    assert not any(f.startswith(("test/", "site-packages/")) or "/idle_test/" in f for f in files)


def test_clear_errors(code_folder: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        make(tmp_path / "missing", tmp_path)
    with pytest.raises(ConfigError, match=r"no files matched '\*\*/\*.md'"):
        make(code_folder, tmp_path, glob="**/*.md").setup()
    blank = tmp_path / "blank"
    blank.mkdir()
    for i in range(5):
        (blank / f"{i}.txt").write_text("  \n")
    with pytest.raises(ConfigError, match="is empty"):
        make(blank, tmp_path, glob="*.txt").setup()
    with pytest.raises(ConfigError, match=r"the (val|test) split has no complete block of 20000 tokens"):
        make(code_folder, tmp_path, block_size=20_000).setup()
    with pytest.raises(ConfigError, match="val_fraction"):
        make(code_folder, tmp_path, val_fraction=0.0)
    few = tmp_path / "few"
    few.mkdir()
    (few / "only.py").write_text("x = 1\n")
    with pytest.raises(ConfigError, match="fell into the"):
        make(few, tmp_path).setup()
