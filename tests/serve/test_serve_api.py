"""The server through the real `openai` client: answers equal `generate()`'s, streamed or not."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from serving import MODEL_NAME

from warpdecode.decoding.generate import generate

PROMPTS = ["print('hello", "for i in range(", "Write a story about"]


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0, timeout=60)


def expected(tiny, prompt: str, n: int, *, chat: bool = False, **sampling) -> tuple[str, str]:
    """`generate()`'s text and OpenAI finish reason for the same request."""
    target, tokenizer = tiny
    temperature = sampling.pop("temperature", 0.0)
    out = generate(target, tokenizer, prompt, max_new_tokens=n, chat=chat, do_sample=temperature > 0,
                   temperature=temperature or 1.0, **sampling)
    return out.text, "stop" if out.finish_reason == "eos" else "length"


@pytest.mark.parametrize("speculation", [None, "prompt_lookup:num_tokens=4"])
def test_completion_at_temperature_0_equals_generate(client, tiny, speculation):
    extra = {"speculation": speculation} if speculation else None
    for prompt in PROMPTS:
        out = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=24, temperature=0, extra_body=extra)
        text, finish = expected(tiny, prompt, 24)
        assert (out.choices[0].text, out.choices[0].finish_reason) == (text, finish)
        assert out.object == "text_completion" and out.model == MODEL_NAME
        assert out.usage.prompt_tokens == len(tiny[1].encode(prompt))
        assert out.usage.completion_tokens <= 24


def test_streamed_completion_is_the_same_text_in_chunks(client, tiny):
    chunks = list(client.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=24, temperature=0,
                                            stream=True))
    text, finish = expected(tiny, PROMPTS[0], 24)
    assert "".join(c.choices[0].text for c in chunks) == text
    assert [c.choices[0].finish_reason for c in chunks][-1] == finish
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert len(chunks) > 2 and len({c.id for c in chunks}) == 1


def test_chat_completion_applies_the_chat_template(client, tiny):
    messages = [{"role": "user", "content": "Write a story"}]
    out = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=16, temperature=0)
    text, finish = expected(tiny, "Write a story", 16, chat=True)
    assert (out.choices[0].message.content, out.choices[0].finish_reason) == (text, finish)
    assert out.choices[0].message.role == "assistant" and out.object == "chat.completion"
    stream = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_completion_tokens=16,
                                            temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == out.usage.completion_tokens
    assert chunks[-2].choices[0].finish_reason == finish


def test_a_seeded_sampled_request_equals_generate_with_that_seed(client, tiny):
    sampling = {"temperature": 0.9, "top_p": 0.95, "seed": 7}
    answers = [client.completions.create(model=MODEL_NAME, prompt=PROMPTS[1], max_tokens=20, **sampling)
               .choices[0].text for _ in range(2)]
    assert answers[0] == answers[1] == expected(tiny, PROMPTS[1], 20, **sampling)[0]


def test_n_sampled_choices_are_n_seeded_requests(client, tiny):
    """Choice i of a request with n and a seed equals generate() seeded seed + i; the prompt is billed once."""
    sampling = {"temperature": 0.9, "top_p": 0.95, "seed": 11}
    out = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[1], max_tokens=20, n=3, **sampling)
    wanted = [expected(tiny, PROMPTS[1], 20, **{**sampling, "seed": 11 + i}) for i in range(3)]
    assert [(c.index, c.text, c.finish_reason) for c in out.choices] == [(i, *w) for i, w in enumerate(wanted)]
    assert len({c.text for c in out.choices}) > 1
    single = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[1], max_tokens=20, **sampling)
    assert out.usage.prompt_tokens == single.usage.prompt_tokens
    lengths = [len(generate(*tiny, PROMPTS[1], max_new_tokens=20, chat=False, do_sample=True, temperature=0.9,
                            top_p=0.95, seed=11 + i).token_ids) for i in range(3)]
    assert out.usage.completion_tokens == sum(lengths)
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=12, n=3, stream=True, stream_options={"include_usage": True},
                                                 **sampling))
    texts, finishes = ["", "", ""], [None, None, None]
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        texts[choice.index] += choice.delta.content or ""
        finishes[choice.index] = choice.finish_reason or finishes[choice.index]
    assert [(t, f) for t, f in zip(texts, finishes, strict=True)] == [
        expected(tiny, "Hi", 12, chat=True, **{**sampling, "seed": 11 + i}) for i in range(3)]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_n_greedy_choices_are_one_answer_copied(client, tiny):
    out = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}],
                                         max_tokens=12, n=2, temperature=0)
    one = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}],
                                         max_tokens=12, temperature=0)
    assert [c.message.content for c in out.choices] == [one.choices[0].message.content] * 2
    assert [c.index for c in out.choices] == [0, 1]
    assert out.usage.completion_tokens == 2 * one.usage.completion_tokens


def test_stop_sequence_ends_the_answer_before_it(client, tiny):
    full, _ = expected(tiny, PROMPTS[2], 30)
    stop = full[10:13]
    assert stop and full.find(stop) >= 0
    for stream in (False, True):
        out = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[2], max_tokens=30, temperature=0,
                                        stop=[stop, "never appears"], stream=stream)
        chunks = list(out) if stream else [out]
        assert "".join(c.choices[0].text for c in chunks) == full[: full.find(stop)]
        assert chunks[-1].choices[0].finish_reason == "stop"


def test_concurrent_requests_each_get_their_own_answer(client, tiny):
    jobs = [(p, n) for p in PROMPTS for n in (5, 12)]
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda job: client.completions.create(
            model=MODEL_NAME, prompt=job[0], max_tokens=job[1], temperature=0).choices[0].text, jobs))
    assert answers == [expected(tiny, p, n)[0] for p, n in jobs]


def test_models_health_and_metrics(client, served):
    assert [m.id for m in client.models.list()] == [MODEL_NAME]
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME
    assert httpx.get(f"{served.url}/health").json() == {"status": "ok"}
    client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=4, temperature=0,
                              extra_body={"speculation": "prompt_lookup"})
    text = httpx.get(f"{served.url}/metrics").text
    for name in ("warpdecode_queue_depth", "warpdecode_batch_size", "warpdecode_tokens_per_second",
                 "warpdecode_tau_bucket", "warpdecode_time_to_first_token_seconds_bucket",
                 "warpdecode_inter_token_latency_seconds_bucket"):
        assert name in text
    assert float(re.search(r'warpdecode_requests_total\{endpoint="/health",status="200"\} (\S+)', text)[1]) >= 1
    assert float(re.search(r"^warpdecode_generated_tokens_total (\S+)$", text, re.MULTILINE)[1]) >= 4


def test_unknown_model_is_a_404_in_openai_shape(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="gpt-4", prompt="x", max_tokens=2)
    assert caught.value.body["code"] == "model_not_found" and caught.value.body["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_bad_parameters_are_400s_naming_the_field(client):
    cases = [({"n": 0}, "n"), ({"n": 129}, "n"), ({"temperature": -0.5}, "temperature"), ({"max_tokens": 10**9}, "max_tokens"),
             ({"extra_body": {"speculation": "no_such_method"}}, "speculation"),
             ({"extra_body": {"speculation": "prompt_lookup:bogus=1"}}, "speculation"),
             ({"extra_body": {"made_up": 1}}, "made_up"), ({"top_p": 0}, "top_p"), ({"stop": [""]}, "stop")]
    for options, param in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(model=MODEL_NAME, prompt="x", **{"max_tokens": 4, **options})
        assert caught.value.body["param"] == param, options
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL_NAME, prompt="hello " * 300, max_tokens=4)
    assert caught.value.body["code"] == "context_length_exceeded"
