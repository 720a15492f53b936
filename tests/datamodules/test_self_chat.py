"""Self-chat prompts: user turns sampled from the target's own chat template (Magpie-style)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from warpdecode.datamodules import prompt_sources, self_chat
from warpdecode.datamodules.prompt import DistillPrompt
from warpdecode.datamodules.prompt_sources import generated_share, interleave, jsonl_prompts, load_prompts
from warpdecode.datamodules.self_chat import (
    SelfChatSource,
    append_self_chat,
    pre_query_ids,
    read_user_turns,
    usable,
)
from warpdecode.datamodules.self_distill import SelfDistillDataModule
from warpdecode.errors import ConfigError
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.identity import model_fingerprint

pytestmark = pytest.mark.usefixtures("single_thread")

TEMPLATE = ("<system>be helpful\n{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture
def tiny(tiny_model_dir):
    model, tokenizer = load_pretrained(tiny_model_dir)
    tokenizer.chat_template = TEMPLATE
    return model, tokenizer


def test_pre_query_is_the_template_up_to_the_user_content(tiny):
    _, tokenizer = tiny
    assert pre_query_ids(tokenizer) == tokenizer.encode("<system>be helpful\n<user>", add_special_tokens=False)


@pytest.mark.parametrize(("template", "message"), [
    (None, "no chat template"),
    ("<user>{{ messages[0].content | upper }}", "verbatim"),
    ("{{ messages[0].content }}", "renders nothing before"),
])
def test_pre_query_needs_a_template_that_renders_the_user_turn(tiny, template, message):
    _, tokenizer = tiny
    tokenizer.chat_template = template
    with pytest.raises(ConfigError, match=message):
        pre_query_ids(tokenizer)


def test_usable_needs_words_and_no_template_markers():
    assert usable("How do I plant tomatoes?", ("<|im_end|>",))
    assert not usable("Thanks a lot", ())
    assert not usable("How do I plant <|im_end|> tomatoes", ("<|im_end|>",))


def test_sampled_turns_are_the_turns_that_ended(tiny, monkeypatch):
    """Every kept text is a sample that ended on a stop token, decoded without it; unfinished ones are dropped."""
    model, tokenizer = tiny
    stops = set(range(100, 140))  # under the tiny model's near-uniform sampling, about 1 in 8 tokens ends a turn
    monkeypatch.setattr(self_chat, "stop_token_ids", lambda *_: stops)
    monkeypatch.setattr(self_chat, "MIN_WORDS", 1)
    calls = []
    real = self_chat.decode_batch

    def spy(*args, **kwargs):
        calls.append(real(*args, **kwargs))
        return calls[-1]

    monkeypatch.setattr(self_chat, "decode_batch", spy)
    batches = self_chat.synthesize_user_turns(model, tokenizer, batch_size=16, seed=3, max_new_tokens=12)
    first = next(batches)
    ended = [new for new, finish, _ in calls[0] if finish == "eos"]
    assert 0 < len(ended) < 16 and all(new[-1] in stops for new in ended)  # some ran out of budget
    expected = [tokenizer.decode(new[:-1]).strip() for new in ended]
    assert first == [t for t in expected if usable(t, self_chat.turn_markers(tokenizer, stops))]
    assert first
    again = self_chat.synthesize_user_turns(model, tokenizer, batch_size=16, seed=3, max_new_tokens=12)
    assert next(again) == first  # seeded
    assert next(batches) != first  # the next batch samples with the next seed


def fake_stream(batches: list[list[str]], seeds: list[int]):
    def synthesize(model, tokenizer, *, batch_size, seed, **_) -> Iterator[list[str]]:
        seeds.append(seed)
        yield from batches
        while True:
            yield []
    return synthesize


def test_append_dedupes_stops_at_count_and_resumes(monkeypatch, tmp_path):
    path = tmp_path / "chat.jsonl"
    seeds: list[int] = []
    monkeypatch.setattr(self_chat, "synthesize_user_turns", fake_stream(
        [["Plan my trip to Rome", "plan my  TRIP to rome", "Write a poem about rain"], ["Explain how tides work"]],
        seeds))
    assert append_self_chat(path, None, None, 2) == 2  # type: ignore[arg-type]
    assert read_user_turns(path) == ["Plan my trip to Rome", "Write a poem about rain"]
    assert [p.messages for p in jsonl_prompts(path)] == [(("user", "Plan my trip to Rome"),),
                                                         (("user", "Write a poem about rain"),)]
    assert append_self_chat(path, None, None, 2) == 0  # already there: nothing sampled
    monkeypatch.setattr(self_chat, "synthesize_user_turns", fake_stream(
        [["Write a poem about rain", "Explain how tides work"]], seeds))
    assert append_self_chat(path, None, None, 3) == 1  # type: ignore[arg-type]
    assert read_user_turns(path)[-1] == "Explain how tides work"
    assert seeds[0] != seeds[1]  # a resumed run samples other batches


def test_append_drops_a_torn_last_line_and_gives_up_on_barren_batches(monkeypatch, tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "Plan my trip to Rome"}]}) + '\n{"messa')
    monkeypatch.setattr(self_chat, "synthesize_user_turns", fake_stream([["Plan my trip to Rome"]], []))
    with pytest.raises(ConfigError, match="no usable new user turn in 8 batches in a row \\(1 of 5 written\\)"):
        append_self_chat(path, None, None, 5)  # type: ignore[arg-type]
    assert read_user_turns(path) == ["Plan my trip to Rome"]


def test_append_refuses_files_it_did_not_write(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"prompt": "hello there my friend"}) + "\n")
    with pytest.raises(ConfigError, match="chat.jsonl:1: not a one-user-turn prompt"):
        append_self_chat(path, None, None, 5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=">= 1"):
        append_self_chat(tmp_path / "new.jsonl", None, None, 0)  # type: ignore[arg-type]


@pytest.mark.slow
def test_the_default_model_writes_requests(smollm2):
    """SmolLM2-135M-Instruct continues its pre-query with user requests: most samples end their turn."""
    batch = next(self_chat.synthesize_user_turns(smollm2.model, smollm2.tokenizer, batch_size=8, seed=0,
                                                 max_new_tokens=64))
    assert len(batch) >= 4
    assert all(len(t.split()) >= self_chat.MIN_WORDS and "<|im_" not in t for t in batch)


def test_cli_writes_a_prompt_file(tiny_model_dir, tmp_path, capsys, monkeypatch):
    from warpdecode.cli import main

    monkeypatch.setattr(self_chat, "synthesize_user_turns", fake_stream([["Plan my trip to Rome"]], []))
    out = tmp_path / "chat.jsonl"
    main(["self-chat", str(out), "--num-prompts", "1", "--model", str(tiny_model_dir)])
    assert read_user_turns(out) == ["Plan my trip to Rome"]
    assert "added 1 prompts" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["self-chat", str(out), "--num-prompts", "0", "--model", str(tiny_model_dir)])
    assert "--num-prompts must be >= 1" in capsys.readouterr().err



def prompts_of(name: str, n: int) -> list[DistillPrompt]:
    return [DistillPrompt(f"{name}/{i}", (("user", f"{name} {i}"),)) for i in range(n)]


def test_interleave_is_round_robin_or_in_proportion_to_the_weights():
    a, b, c = prompts_of("a", 2), prompts_of("b", 5), prompts_of("c", 9)
    picks = [i for i, _ in interleave([a, b, c], [1, 1, 1], 16)]
    assert picks == [0, 1, 2, 0, 1, 2, 1, 2, 1, 2, 1, 2, 2, 2, 2, 2]  # zip_longest's order
    weighted = [i for i, _ in interleave([b, c], [1, 3], 8)]
    assert weighted == [1, 1, 0, 1, 1, 1, 0, 1]  # 3 of c per 1 of b
    doubled = [p.id for _, p in interleave([a, a + prompts_of("d", 1)], [1, 1], 5)]
    assert doubled == ["a/0", "a/1", "d/0"]  # repeats skipped, without counting against the limit


def test_generated_share_is_what_the_mix_takes_from_self_chat():
    two, ten = prompts_of("a", 2), prompts_of("b", 10)
    assert generated_share([two, ten, None], [1, 1, 1], 9) == 3  # a b u a b u, then b u (a is spent), b
    assert generated_share([None], [1], 5) == 5
    assert generated_share([ten, None], [1, 9], 10) == 9


class FakeSource:
    def __init__(self) -> None:
        self.asked: list[int] = []

    def prompts(self, count: int) -> list[DistillPrompt]:
        self.asked.append(count)
        return [DistillPrompt(f"self_chat/{i}", (("user", f"Plan trip number {i} for me"),)) for i in range(count)]


def test_load_prompts_takes_the_self_chat_share(monkeypatch):
    monkeypatch.setitem(prompt_sources.SOURCES, "writing", lambda: prompts_of("w", 2))
    source = FakeSource()
    mixed = load_prompts(["writing", "self_chat"], 5, 0, source)  # type: ignore[arg-type]
    assert source.asked == [3]
    assert [p.id.split("/")[0] for p in mixed] == ["w", "self_chat", "w", "self_chat", "self_chat"]
    weighted = load_prompts(["writing", "self_chat"], 4, 0, source, {"self_chat": 3})  # type: ignore[arg-type]
    assert source.asked[-1] == 3 and [p.id.split("/")[0] for p in weighted].count("self_chat") == 3
    with pytest.raises(ConfigError, match="needs the target"):
        load_prompts(["self_chat"], 5, 0)
    with pytest.raises(ConfigError, match="not one of the prompt sources"):
        load_prompts(["writing"], 5, 0, None, {"self_chat": 2})
    with pytest.raises(ConfigError, match="must be > 0"):
        load_prompts(["writing"], 5, 0, None, {"writing": 0})


def test_self_chat_source_caches_per_target_and_settings(tiny, monkeypatch, tmp_path):
    model, tokenizer = tiny
    seeds: list[int] = []
    monkeypatch.setattr(self_chat, "synthesize_user_turns", fake_stream(
        [["Plan my trip to Rome", "Write a poem about rain", "Explain how tides work"]], seeds))
    source = SelfChatSource(model, tokenizer, model_fingerprint(model), tmp_path)
    assert [p.messages[0][1] for p in source.prompts(2)] == ["Plan my trip to Rome", "Write a poem about rain"]
    assert [p.id for p in source.prompts(1)] == ["self_chat/0"] and len(seeds) == 1  # cached: nothing sampled
    assert read_user_turns(source.path) == ["Plan my trip to Rome", "Write a poem about rain"]
    assert SelfChatSource(model, tokenizer, model_fingerprint(model), tmp_path, temperature=0.7).path != source.path


def test_the_data_module_answers_self_chat_prompts(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(self_chat, "synthesize_user_turns", fake_stream(
        [[f"Write a story about cat number {i}" for i in range(6)]], []))
    dm = SelfDistillDataModule(target=str(tiny_model_dir), prompts=["self_chat"], max_prompts=4, max_new_tokens=4,
                               generation_batch_size=4, batch_size=2, val_fraction=0.3,
                               cache_dir=str(tmp_path / "cache"))
    dm.prepare_data()
    dm.setup()
    (written,) = (tmp_path / "cache" / "self_chat").glob("*.jsonl")
    assert len(read_user_turns(written)) == 4
    assert sum(len(d) for d in dm.datasets.values()) == 4


def test_prompts_cli_freezes_self_chat_prompts(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from warpdecode.cli import main

    monkeypatch.setenv("WARPDECODE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(self_chat, "synthesize_user_turns", fake_stream([["Plan my trip to Rome"]], []))
    out = tmp_path / "frozen.jsonl"
    main(["prompts", str(out), "--sources", "self_chat", "--max-prompts", "1", "--model", str(tiny_model_dir)])
    assert [p.messages for p in jsonl_prompts(out)] == [(("user", "Plan my trip to Rome"),)]
    assert list((tmp_path / "cache" / "self_distill" / "self_chat").glob("*.jsonl"))


def test_the_data_module_checks_prompt_weights(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match="not one of the prompt sources"):
        SelfDistillDataModule(target=str(tiny_model_dir), prompts=["writing"], prompt_weights={"self_chat": 9},
                              cache_dir=str(tmp_path))
