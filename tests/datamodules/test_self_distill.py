"""Self-distillation data: the tiny target's own greedy answers, cached, split and batched."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from warpdecode.data.corpus import split_of
from warpdecode.datamodules import answer_cache, prompt_sources, self_distill
from warpdecode.datamodules.prompt import DistillPrompt
from warpdecode.datamodules.prompt_sources import load_prompts
from warpdecode.datamodules.self_distill import SelfDistillDataModule, encode
from warpdecode.decoding.generate import encode_prompt, generate
from warpdecode.errors import ConfigError
from warpdecode.models.checkpoint import load_pretrained

pytestmark = pytest.mark.usefixtures("single_thread")

VAL = 0.3
TEXTS = [
    "print('hello world')", "Write a story about a cat.", "for i in range(10):", "pass", "hello cat",
    "Write a story about a dog.", "print(i)", "for cat in range(3): print(cat)", "world", "a story",
    "range(10)", "Write hello world in Python.",
]
LONG = " ".join(["Write a story about a cat."] * 12)  # about 80 tokens with the tiny BPE


@pytest.fixture
def prompt_file(tmp_path: Path) -> Path:
    """The 12 TEXTS as JSONL, two of them in the chat `messages` form (one user turn)."""
    path = tmp_path / "prompts.jsonl"
    lines = [{"messages": [{"role": "user", "content": t}]} if i % 5 == 1 else {"prompt": t}
             for i, t in enumerate(TEXTS)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + "\n")
    return path


def make(target: Path, prompt_path: Path, tmp_path: Path, **kwargs: object) -> SelfDistillDataModule:
    args: dict[str, object] = {
        "target": str(target), "prompts": [str(prompt_path)], "max_prompts": 12, "max_new_tokens": 8,
        "generation_batch_size": 5, "batch_size": 4, "val_fraction": VAL,
        "cache_dir": str(tmp_path / "cache"),
    }
    args.update(kwargs)
    return SelfDistillDataModule(**args)  # type: ignore[arg-type]


def examples(dm: SelfDistillDataModule) -> list[self_distill.Example]:
    return [e for split in ("train", "val") for e in dm.datasets[split].examples]


def data_dir(tmp_path: Path) -> Path:
    (directory,) = (tmp_path / "cache" / "data").iterdir()
    return directory


def test_answers_are_greedy_output_and_features_hidden_states(tiny_model_dir, prompt_file, tmp_path):
    dm = make(tiny_model_dir, prompt_file, tmp_path)
    dm.prepare_data()
    dm.setup()
    model, tokenizer = load_pretrained(tiny_model_dir)
    expected_prompts = sorted(encode_prompt(tokenizer, text, chat=None) for text in TEXTS)
    assert sorted(e.tokens[: e.prompt_length].tolist() for e in examples(dm)) == expected_prompts
    L = model.config.n_layer
    assert dm.hidden_size == model.config.d_model and dm.target_fingerprint is not None
    for e in examples(dm):
        prompt = e.tokens[: e.prompt_length].tolist()
        alone = generate(model, tokenizer, prompt, max_new_tokens=8).token_ids
        assert e.tokens[e.prompt_length :].tolist() == alone
        assert e.features is not None and e.features.dtype == np.float16
        with torch.no_grad():
            tokens = torch.from_numpy(e.tokens.astype(np.int64))[None]  # (1, T)
            forced = model(tokens, hidden_layers=(L,)).hidden_states[L][0]  # (T, C)
        torch.testing.assert_close(torch.from_numpy(e.features[:-1].astype(np.float32)), forced[:-1],
                                   atol=2e-3, rtol=1e-3)  # float16 on disk
        assert not e.features[-1].any()
    answers = sum(len(e.tokens) - e.prompt_length for e in examples(dm))
    assert dm.stats["examples"] == 12 and dm.stats["answer_tokens"] == answers
    assert dm.stats["prompt_tokens"] == sum(map(len, expected_prompts)) and dm.stats["skipped_prompts"] == 0


@pytest.mark.parametrize("group_by_length", [True, False])
def test_batches_are_padded_and_mark_exactly_the_answers(tiny_model_dir, prompt_file, tmp_path, group_by_length):
    dm = make(tiny_model_dir, prompt_file, tmp_path, group_by_length=group_by_length)
    dm.setup()  # without prepare_data: generates on its own
    seen = 0
    for batch in dm.train_dataloader():
        B, T = batch["tokens"].shape
        assert batch["tokens"].dtype == torch.int64 and batch["features"].shape == (B, T, dm.hidden_size)
        assert T == int(batch["lengths"].max()) and batch["features"].dtype == torch.float32
        for b in range(B):
            match = [e for e in examples(dm) if len(e.tokens) == batch["lengths"][b]
                     and e.tokens.tolist() == batch["tokens"][b, : len(e.tokens)].tolist()]
            e = match[0]
            n, p = len(e.tokens), e.prompt_length
            assert batch["answer_mask"][b].tolist() == [False] * p + [True] * (n - p) + [False] * (T - n)
            assert not batch["tokens"][b, n:].any() and not batch["features"][b, n:].any()
            assert torch.equal(batch["features"][b, :n], torch.from_numpy(e.features.astype(np.float32)))
        seen += B
    assert seen == len(dm.datasets["train"])


def test_without_features_batches_have_none_and_the_cache_is_separate(tiny_model_dir, prompt_file, tmp_path):
    with_features = make(tiny_model_dir, prompt_file, tmp_path)
    with_features.setup()
    dm = make(tiny_model_dir, prompt_file, tmp_path, features=False)
    dm.setup()
    assert len(list((tmp_path / "cache" / "data").iterdir())) == 2
    batch = next(iter(dm.val_dataloader()))
    assert set(batch) == {"tokens", "answer_mask", "lengths"} and dm.hidden_size == with_features.hidden_size
    assert [e.tokens.tolist() for e in examples(dm)] == [e.tokens.tolist() for e in examples(with_features)]


def test_split_by_prompt_text_is_disjoint_and_deterministic(tiny_model_dir, prompt_file, tmp_path):
    dm = make(tiny_model_dir, prompt_file, tmp_path)
    dm.setup()
    tokenizer = dm.tokenizer
    assert tokenizer is not None
    expected = {tuple(encode(tokenizer, p)): split_of(p.key, VAL, 0.0)
                for p in prompt_sources.jsonl_prompts(prompt_file)}
    splits = {split: {tuple(e.tokens[: e.prompt_length].tolist()) for e in dm.datasets[split].examples}
              for split in ("train", "val")}
    assert splits["train"] and splits["val"] and not splits["train"] & splits["val"]
    assert {ids: split for split, ids_set in splits.items() for ids in ids_set} == expected
    again = make(tiny_model_dir, prompt_file, tmp_path, seed=1)  # the shuffle seed does not move prompts
    again.setup()
    assert {tuple(e.tokens.tolist()) for e in again.datasets["val"].examples} == {
        tuple(e.tokens.tolist()) for e in dm.datasets["val"].examples}


def test_finished_cache_is_read_without_loading_the_model(tiny_model_dir, prompt_file, tmp_path, monkeypatch):
    first = make(tiny_model_dir, prompt_file, tmp_path)
    first.prepare_data()
    first.setup()

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(self_distill, "load_pretrained", refuse)
    monkeypatch.setattr(self_distill, "load_prompts", refuse)
    second = make(tiny_model_dir, prompt_file, tmp_path)
    second.prepare_data()
    second.setup()
    assert [e.tokens.tolist() for e in examples(second)] == [e.tokens.tolist() for e in examples(first)]
    assert second.stats == first.stats and second.target_fingerprint == first.target_fingerprint


def counting_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The batch sizes of every generation batch from now on."""
    calls: list[int] = []
    decode_batch = answer_cache.decode_batch

    def counting(model, prompts, *args, **kwargs):
        calls.append(len(prompts))
        return decode_batch(model, prompts, *args, **kwargs)

    monkeypatch.setattr(answer_cache, "decode_batch", counting)
    return calls


def test_resume_regenerates_only_the_missing_chunk(tiny_model_dir, prompt_file, tmp_path, monkeypatch):
    make(tiny_model_dir, prompt_file, tmp_path).prepare_data()
    directory = data_dir(tmp_path)
    chunks = sorted(directory.glob("chunk-*.npz"))
    assert len(chunks) == 3 and len(list(directory.glob("set-*.json"))) == 1
    with np.load(chunks[1]) as chunk:
        before = {key: chunk[key] for key in chunk.files}
    chunks[1].unlink()  # lost, e.g. an interruption before the set was written
    calls = counting_decodes(monkeypatch)
    dm = make(tiny_model_dir, prompt_file, tmp_path)
    dm.prepare_data()
    dm.setup()
    assert calls == [len(before["keys"])]
    with np.load(chunks[1]) as chunk:  # the same prompts make the same content-named chunk
        for key in ("tokens", "offsets", "prompt_lengths", "keys", "features"):
            np.testing.assert_array_equal(chunk[key], before[key])
    assert dm.stats["examples"] == 12 and not list(directory.glob(".*tmp"))


def test_a_grown_prompt_set_answers_only_the_new_prompts(tiny_model_dir, prompt_file, tmp_path, monkeypatch, capsys):
    small = make(tiny_model_dir, prompt_file, tmp_path, max_prompts=7)
    small.setup()
    calls = counting_decodes(monkeypatch)
    capsys.readouterr()
    grown = make(tiny_model_dir, prompt_file, tmp_path)
    grown.setup()
    assert calls == [5] and grown.stats["examples"] == 12
    assert "self-distill: 12/12 prompts (100 %)" in capsys.readouterr().err  # no terminal: progress as lines
    fresh = make(tiny_model_dir, prompt_file, tmp_path / "fresh")
    fresh.setup()

    def by_prompt(dm: SelfDistillDataModule) -> dict[tuple[int, ...], list[int]]:
        return {tuple(e.tokens[: e.prompt_length].tolist()): e.tokens.tolist() for e in examples(dm)}
    assert by_prompt(grown) == by_prompt(fresh)  # the answers do not depend on how the set grew
    assert {k: v for k, v in grown.stats.items() if k != "generation_seconds"} == {
        k: v for k, v in fresh.stats.items() if k != "generation_seconds"}
    calls.clear()
    subset = make(tiny_model_dir, prompt_file, tmp_path, max_prompts=4)  # a smaller set reuses answers
    subset.setup()
    assert calls == [] and subset.stats["examples"] == 4
    assert by_prompt(subset).items() <= by_prompt(fresh).items()
    assert len(list(data_dir(tmp_path).glob("set-*.json"))) == 3


def test_an_unreadable_chunk_is_reported_and_answered_again(tiny_model_dir, prompt_file, tmp_path, monkeypatch):
    make(tiny_model_dir, prompt_file, tmp_path).prepare_data()
    directory = data_dir(tmp_path)
    chunk = min(directory.glob("chunk-*.npz"))
    chunk.write_bytes(chunk.read_bytes()[:100])  # truncated
    for manifest in directory.glob("set-*.json"):
        manifest.unlink()
    calls = counting_decodes(monkeypatch)
    dm = make(tiny_model_dir, prompt_file, tmp_path)
    with pytest.warns(UserWarning, match="ignoring the unreadable self-distillation chunk"):
        dm.setup()
    assert len(calls) == 1 and dm.stats["examples"] == 12


def test_long_prompts_are_skipped_and_answers_cut_at_max_length(tiny_model_dir, tmp_path):
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in TEXTS + [LONG]))
    dm = make(tiny_model_dir, path, tmp_path, max_prompts=13, max_length=12, val_fraction=0.05)
    dm.setup()
    tokenizer = dm.tokenizer
    assert tokenizer is not None
    lengths = [len(encode_prompt(tokenizer, t, chat=None)) for t in TEXTS + [LONG]]
    assert dm.stats["skipped_prompts"] == sum(n >= 12 for n in lengths) >= 1
    assert dm.stats["examples"] == sum(n < 12 for n in lengths)
    assert max(len(e.tokens) for e in examples(dm)) <= 12
    assert any(len(e.tokens) == 12 and len(e.tokens) - e.prompt_length < 8 for e in examples(dm))

    only_long = tmp_path / "only_long.jsonl"
    only_long.write_text(json.dumps({"prompt": LONG}) + "\n")
    with pytest.raises(ConfigError, match="all 1 prompts are empty or longer than 11 tokens"):
        make(tiny_model_dir, only_long, tmp_path, max_length=12).prepare_data()


@pytest.mark.parametrize("kwargs, message", [
    ({"max_prompts": 0}, "max_prompts must be positive"),
    ({"batch_size": 0}, "batch_size must be positive"),
    ({"generation_batch_size": -1}, "generation_batch_size must be positive"),
    ({"max_new_tokens": 0}, "max_new_tokens must be positive"),
    ({"val_fraction": 0.0}, r"val_fraction must be in \(0, 1\)"),
    ({"val_fraction": 1.0}, r"val_fraction must be in \(0, 1\)"),
    ({"prompts": []}, "the prompt set is empty"),
    ({"prompts": ["gsm8k"]}, "unknown prompt source 'gsm8k'; choose from gsm8k_train, stdlib_docstrings"),
    ({"prompts": ["missing.jsonl"]}, "prompt file missing.jsonl not found"),
])
def test_bad_configurations_raise_config_errors(tiny_model_dir, prompt_file, tmp_path, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        make(tiny_model_dir, prompt_file, tmp_path, **kwargs)


@pytest.mark.parametrize("lines, message", [
    ("", "hold no prompt"),
    ('{"text": "x"}\n', r'expected \{"prompt": str\}'),
    ('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}\n',
     "ending with a user"),
    ("{not json\n", "invalid JSON"),
    ('{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}\n',
     "has 2 turns but the target's tokenizer has no chat template"),
])
def test_bad_prompt_files_raise_config_errors(tiny_model_dir, tmp_path, lines, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(lines)
    with pytest.raises(ConfigError, match=message):
        make(tiny_model_dir, path, tmp_path).prepare_data()


def test_chat_template_wraps_prompts_like_inference(tiny_model_dir):
    _, tokenizer = load_pretrained(tiny_model_dir)
    tokenizer.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>"
    single = DistillPrompt("a", (("user", "hello cat"),))
    assert encode(tokenizer, single) == encode_prompt(tokenizer, "hello cat", chat=None)
    expected = tokenizer.encode("<user>hello cat\n<assistant>", add_special_tokens=False)
    assert encode(tokenizer, single) == expected
    turns = DistillPrompt("b", (("system", "be brief"), ("user", "hello cat")))
    assert encode(tokenizer, turns) == tokenizer.encode("<system>be brief\n<user>hello cat\n<assistant>",
                                                        add_special_tokens=False)


def test_yaml_config_builds_the_datamodule(tmp_path):
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_class_arguments(SelfDistillDataModule, "data")
    config = parser.parse_string("data:\n  prompts: [gsm8k_train, my.jsonl]\n  max_new_tokens: 64\n"
                                 "  features: false\n", defaults=True)
    assert config.data.prompts == ["gsm8k_train", "my.jsonl"] and config.data.max_new_tokens == 64
    assert config.data.features is False and config.data.target == "smollm2-135m-instruct"


def test_a_written_prompt_file_gives_the_same_prompts_split_and_cached_answers(tiny_model_dir, prompt_file, tmp_path,
                                                                               monkeypatch):
    first = make(tiny_model_dir, prompt_file, tmp_path)
    first.prepare_data()
    first.setup()
    frozen = tmp_path / "frozen" / "prompts.jsonl"
    prompt_sources.write_jsonl_prompts(frozen, load_prompts([str(prompt_file)], 12, seed=0))
    assert [p.key for p in prompt_sources.jsonl_prompts(frozen)] == [p.key for p in prompt_sources.jsonl_prompts(prompt_file)]

    decodes = counting_decodes(monkeypatch)
    second = make(tiny_model_dir, frozen, tmp_path)
    second.prepare_data()
    second.setup()
    assert decodes == []  # every answer came from the cache the first prompt file filled
    for split in ("train", "val"):
        assert ([e.tokens.tolist() for e in second.datasets[split].examples]
                == [e.tokens.tolist() for e in first.datasets[split].examples])


@pytest.mark.parametrize("recipe", sorted(p.name for p in (Path(__file__).parents[2] / "configs" / "drafters").glob("*.yaml")))
def test_drafter_recipes_data_sections_instantiate(recipe):
    """Every drafter recipe's `data` section builds its data module (source names, weights, sizes checked)."""
    import yaml
    from jsonargparse import ArgumentParser
    from lightning.pytorch import LightningDataModule

    config = yaml.safe_load((Path(__file__).parents[2] / "configs" / "drafters" / recipe).read_text())
    parser = ArgumentParser()
    parser.add_subclass_arguments(LightningDataModule, "data")
    data = parser.instantiate_classes(parser.parse_object({"data": config["data"]})).data
    assert isinstance(data, LightningDataModule)
    if isinstance(data, SelfDistillDataModule):
        assert data.prompt_sources and data.max_prompts >= 1
