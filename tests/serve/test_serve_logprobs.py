"""`logprobs` through the real `openai` client: the target's log-softmax at every new token, in OpenAI's
shapes, the same streamed or not and with speculation on or off."""

from __future__ import annotations

import itertools
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import torch
from serving import MODEL_NAME, Gate, serve_in_thread

from warpdecode.decoding.continuous import DraftBudget, Row
from warpdecode.decoding.generate import generate
from warpdecode.decoding.tree import DraftTree

PROMPT = "for i in range("  # the tiny model repeats itself after it: prompt lookup's drafts get accepted
MESSAGES = [{"role": "user", "content": "Write a story"}]
SPECULATIONS = ["none", "prompt_lookup:num_tokens=4", "draft_model:layers=1:num_tokens=3"]
"""Plain, drafting in the batch, and drafting alone in the engine's loop (a draft model)."""


class AlwaysDraft(DraftBudget):
    """Every step drafts and verifies whole trees (the measured budget may turn speculation off)."""

    def choose(self, rows: int, can_draft: bool, cut: bool = False) -> bool:
        return can_draft

    def keep(self, rows: int, row: Row, tree: DraftTree) -> int:
        return tree.depth


@pytest.fixture(scope="module")
def client(served):
    served.scheduler.budget = AlwaysDraft()
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0, timeout=60)


def reference(tiny, prompt: list[int], new: list[int]) -> torch.Tensor:
    """log_softmax of the target's raw logits before each new token, from one cache-free forward. Returns (T, V)."""
    target, _ = tiny
    with torch.inference_mode():
        logits = target(torch.tensor([prompt + new])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), dim=-1)


def completion(client, *, stream: bool = False, speculation: str = "none", **options):
    """The choice's text and logprobs as plain data (a stream's chunks joined)."""
    out = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=24, stream=stream,
                                    extra_body={"speculation": speculation}, **{"temperature": 0, **options})
    if not stream:
        return out.choices[0].text, out.choices[0].logprobs.model_dump(), out.usage.completion_tokens
    chunks = list(out)
    joined: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for chunk in chunks:
        if chunk.choices[0].logprobs is not None:
            for key, values in chunk.choices[0].logprobs.model_dump().items():
                joined[key] += values
    return "".join(c.choices[0].text for c in chunks), joined, None


def test_completion_logprobs_are_the_targets_log_softmax(client, tiny):
    target, tokenizer = tiny
    text, logprobs, used = completion(client, logprobs=3)
    ids = generate(target, tokenizer, PROMPT, max_new_tokens=24, chat=False).token_ids
    assert len(ids) == used == len(logprobs["tokens"]) and text == tokenizer.decode(ids)
    assert logprobs["tokens"] == [tokenizer.decode([t], skip_special_tokens=False) for t in ids]
    want = reference(tiny, tokenizer.encode(PROMPT), ids)
    torch.testing.assert_close(torch.tensor(logprobs["token_logprobs"]), want[torch.arange(len(ids)), ids],
                               atol=1e-5, rtol=0)
    for token, lp, top, row in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], want,
                                   strict=True):
        assert 1 <= len(top) <= 4 and top[token] == lp  # the 3 most likely tokens and the chosen one
        assert max(top.values()) == lp  # at temperature 0 the chosen token is the most likely
        assert sorted(top.values(), reverse=True)[: len(top)] == list(top.values())
        assert {tokenizer.decode([t], skip_special_tokens=False) for t in row.topk(3).indices.tolist()} <= set(top)
    lengths = [len(t) for t in logprobs["tokens"]]
    assert logprobs["text_offset"] == [sum(lengths[:i]) for i in range(len(lengths))]
    plain = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=4, temperature=0)
    assert plain.choices[0].logprobs is None


def test_logprobs_are_the_same_with_speculation_streamed_or_not(client, served):
    def tau() -> dict[str, float]:
        # a plain request first: the scheduler observed the last request's τ before it takes the next one
        client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=1)
        return {s.name: s.value for s in served.metrics.tau.collect()[0].samples}
    answers, gained = {}, {}
    for speculation, stream in itertools.product(SPECULATIONS, (False, True)):
        before = tau()
        answers[speculation, stream] = completion(client, stream=stream, speculation=speculation, logprobs=2)[:2]
        after = tau()
        gained[speculation] = (after["warpdecode_tau_sum"] - before["warpdecode_tau_sum"]
                               - (after["warpdecode_tau_count"] - before["warpdecode_tau_count"]))
    assert all(answer == answers["none", False] for answer in answers.values())  # bit for bit
    assert gained["prompt_lookup:num_tokens=4"] > 0 and gained["draft_model:layers=1:num_tokens=3"] > 0  # τ > 1


def test_chat_logprobs_in_openais_shape_streamed_or_not(client, tiny):
    out = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=16, temperature=0,
                                         logprobs=True, top_logprobs=5)
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    spoken = content if out.choices[0].finish_reason == "length" else content[:-1]  # not the stop token
    assert b"".join(bytes(e.bytes) for e in spoken).decode(errors="replace") == out.choices[0].message.content
    for entry in content:
        assert len(entry.top_logprobs) == 5
        assert [alt.logprob for alt in entry.top_logprobs] == sorted((alt.logprob for alt in entry.top_logprobs),
                                                                      reverse=True)
        assert (entry.top_logprobs[0].token, entry.top_logprobs[0].logprob) == (entry.token, entry.logprob)
        if entry.token.isascii():
            assert entry.bytes == list(entry.token.encode())
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=16, temperature=0,
                                                 logprobs=True, top_logprobs=5, stream=True))
    streamed = [entry for c in chunks if c.choices[0].logprobs is not None for entry in c.choices[0].logprobs.content]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in content]
    bare = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True)
    assert all(entry.top_logprobs == [] for entry in bare.choices[0].logprobs.content)


def test_sampled_tokens_get_the_raw_logprobs_not_the_tempered_ones(client, tiny):
    target, tokenizer = tiny
    sampling = {"temperature": 0.7, "top_p": 0.9, "seed": 5}
    _, logprobs, _ = completion(client, logprobs=0, **sampling)
    ids = generate(target, tokenizer, PROMPT, max_new_tokens=24, chat=False, do_sample=True, **sampling).token_ids
    want = reference(tiny, tokenizer.encode(PROMPT), ids)[torch.arange(len(ids)), ids]
    torch.testing.assert_close(torch.tensor(logprobs["token_logprobs"]), want, atol=1e-5, rtol=0)
    assert all(top == {token: lp} for token, lp, top in zip(logprobs["tokens"], logprobs["token_logprobs"],
                                                            logprobs["top_logprobs"], strict=True))


def test_n_choices_each_carry_logprobs(client):
    out = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=6, n=2, temperature=0.9,
                                         seed=3, logprobs=True)
    assert sum(len(c.logprobs.content) for c in out.choices) == out.usage.completion_tokens


def test_bad_logprobs_values_are_400s_naming_the_field(served):
    cases = [("/v1/completions", {"prompt": "x", "logprobs": 6}, "logprobs"),
             ("/v1/chat/completions", {"messages": MESSAGES, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
             ("/v1/chat/completions", {"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs")]
    for path, body, param in cases:
        response = httpx.post(served.url + path, json=body)
        assert response.status_code == 400 and response.json()["error"]["param"] == param, body


def test_a_request_that_joins_the_batch_midway_keeps_its_logprobs(tiny, served):
    """A draft model's request decodes alone, then joins the batch when another arrives (its scorer goes on
    across the join): the same logprobs as the request decoded plainly."""
    gate = Gate(tiny[0])
    body = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "logprobs": 2}
    for server in serve_in_thread(gate, tiny[1], max_num_seqs=4):
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(httpx.post, server.url + "/v1/completions",
                                json={**body, "speculation": "draft_model:layers=1:num_tokens=3"}, timeout=120)
            gate.release(3)
            gate.hold_after(3)  # its prefill and two speculative steps, alone
            second = pool.submit(httpx.post, server.url + "/v1/completions", json={**body, "max_tokens": 6},
                                 timeout=120)
            deadline = time.monotonic() + 30
            while server.metrics.queue_depth._value.get() < 1:
                assert time.monotonic() < deadline
                time.sleep(0.001)
            gate.release(10_000)
            joined, beside = first.result().json()["choices"][0], second.result().json()["choices"][0]
        steps = {s.name + str(s.labels.get("le", "")): s.value for s in server.metrics.step_rows.collect()[0].samples}
        assert steps["warpdecode_step_rows_count"] > steps["warpdecode_step_rows_bucket1.0"]  # it joined the batch
    alone = httpx.post(served.url + "/v1/completions", json=body, timeout=120).json()["choices"][0]
    assert joined["logprobs"] == alone["logprobs"] and joined["text"] == alone["text"]
    assert beside["logprobs"]["token_logprobs"] == alone["logprobs"]["token_logprobs"][:6]


def test_echo_returns_the_prompt_and_its_logprobs_before_the_completion(client, tiny):
    _, tokenizer = tiny
    prompt = tokenizer.encode(PROMPT)
    text, logprobs, _ = completion(client, logprobs=2)
    out = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=24, temperature=0, logprobs=2,
                                    echo=True)
    echoed = out.choices[0].logprobs.model_dump()
    assert out.choices[0].text == PROMPT + text
    n = len(prompt)
    assert echoed["tokens"] == [tokenizer.decode([t], skip_special_tokens=False) for t in prompt] + logprobs["tokens"]
    assert echoed["token_logprobs"][0] is None and echoed["top_logprobs"][0] is None  # the first token: nothing before it
    assert echoed["token_logprobs"][n:] == logprobs["token_logprobs"]  # the completion's own, unchanged
    want = reference(tiny, prompt[:1], prompt[1:])  # (n - 1, V): log_softmax before each later prompt token
    torch.testing.assert_close(torch.tensor(echoed["token_logprobs"][1:n]), want[torch.arange(n - 1), prompt[1:]],
                               atol=1e-5, rtol=0)
    for top, row in zip(echoed["top_logprobs"][1:n], want, strict=True):
        assert {tokenizer.decode([t], skip_special_tokens=False) for t in row.topk(2).indices.tolist()} <= set(top)
    offsets = echoed["text_offset"]
    assert offsets[0] == 0 and offsets == sorted(offsets) and offsets[n] == len(PROMPT)
    # max_tokens=0: the prompt scored alone (a log-likelihood request), the same numbers
    scored = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=0, logprobs=2, echo=True)
    assert scored.choices[0].text == PROMPT and scored.usage.completion_tokens == 0
    assert scored.choices[0].logprobs.model_dump()["token_logprobs"] == echoed["token_logprobs"][:n]
    streamed_text, streamed, _ = completion(client, stream=True, logprobs=2, echo=True)  # the prompt's chunk first
    assert streamed_text == out.choices[0].text and streamed == echoed
    plain = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=3, temperature=0, echo=True)
    assert plain.choices[0].text.startswith(PROMPT) and plain.choices[0].logprobs is None
