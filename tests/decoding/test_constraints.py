"""Grammar-constrained decoding: exact against a naive constrained greedy loop for every drafter,
always inside the grammar, the constrained distribution when sampling, and one-line errors."""

import json
import re

import jsonschema
import pytest
import torch
from tiny_models import json_char_pair, tv

from warpdecode.decoding import registry
from warpdecode.decoding.constraints.formats import compile_response_format
from warpdecode.decoding.constraints.protocol import mask_words, unpack_mask
from warpdecode.decoding.constraints.tree_mask import ConstrainedDecoding
from warpdecode.decoding.generate import build_method, generate
from warpdecode.decoding.tree import DraftTree
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.models.tokenizer import char_tokenizer

pytestmark = pytest.mark.usefixtures("single_thread")

"""62 characters: with the two special tokens, one token per id of the 64-token tiny target."""

SCHEMA = {"type": "object",
          "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}, "tag": {"enum": ["ab", "c"]},
                         "ok": {"type": "boolean"}, "s": {"type": "string", "maxLength": 3}},
          "required": ["n", "tag", "ok", "s"], "additionalProperties": False}
FORMATS = {
    "json_schema": {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}},
    "regex": {"type": "regex", "regex": "[a-c]{2,4}-[0-9]{1,3}"},
    "grammar": {"type": "grammar", "grammar": 'start: item ("," item)*\nitem: "x" | "yz" | /[0-9]/'},
    "choice": {"type": "choice", "choices": ["alpha", "beta", "be"]},
}
PROMPTS = ['{"n":1,"tag":"ab","ok":true,"s":"ab"} {"n":1,', "abc-12 ab", "x,yz,x,3"]


@pytest.fixture(scope="module")
def pair():
    return json_char_pair()


@pytest.fixture(scope="module")
def tokenizer(pair):
    return pair[1]


@pytest.fixture(scope="module")
def target(pair):
    return pair[0]


def naive_constrained_greedy(model, tokenizer, prompt: list[int], response_format, n: int) -> list[int]:
    """Recompute the whole sequence every step; argmax over the tokens the grammar allows; stop at EOS."""
    grammar = compile_response_format(response_format, tokenizer, vocab_size=64, stop_ids={tokenizer.eos_token_id})
    state, bits, seq = grammar.state(), torch.zeros(1, mask_words(64), dtype=torch.int32), list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            state.fill_mask(bits[0])
            logits = model(torch.tensor([seq])).logits[0, -1]
            token = int(logits.masked_fill(~unpack_mask(bits, 64)[0], float("-inf")).argmax())
            assert state.advance([token]) == 1
            seq.append(token)
            if state.is_terminated():
                break
    return seq[len(prompt):]


@pytest.mark.parametrize("name", registry.names("drafter"))
@pytest.mark.parametrize("fmt", ["json_schema", "regex"])
def test_every_drafter_is_exact_under_a_grammar(target, tokenizer, name, fmt, drafter_options):
    prompt = tokenizer.encode(PROMPTS[0 if fmt == "json_schema" else 1])
    reference = naive_constrained_greedy(target, tokenizer, prompt, FORMATS[fmt], 40)
    out = generate(target, tokenizer, prompt, max_new_tokens=40, response_format=FORMATS[fmt],
                   method=build_method(name, options=drafter_options.get(name, {})))
    assert out.token_ids == reference
    assert out.stats.target_forwards <= len(reference) - 1


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("jump_forward", [True, False], ids=["jump_forward", "masked"])
@pytest.mark.parametrize("name", ["none", "prompt_lookup", "draft_model"])
def test_formats_with_and_without_jump_forward(target, tokenizer, fmt, jump_forward, name):
    prompt = tokenizer.encode(PROMPTS[list(FORMATS).index(fmt) % len(PROMPTS)])
    reference = naive_constrained_greedy(target, tokenizer, prompt, FORMATS[fmt], 40)
    options = {"layers": 1, "num_tokens": 2, "top_k": 2} if name == "draft_model" else {}
    out = generate(target, tokenizer, prompt, max_new_tokens=40, response_format=FORMATS[fmt],
                   method=build_method(name, options=options), jump_forward=jump_forward)
    assert out.token_ids == reference


def test_jump_forward_drafts_the_forced_tokens(target, tokenizer):
    """The schema forces `{"n":` and every key: plain decoding with jump-forward needs fewer forwards."""
    prompt, rf = tokenizer.encode(PROMPTS[0]), FORMATS["json_schema"]
    masked = generate(target, tokenizer, prompt, max_new_tokens=60, response_format=rf, jump_forward=False)
    jumped = generate(target, tokenizer, prompt, max_new_tokens=60, response_format=rf)
    assert jumped.token_ids == masked.token_ids and masked.finish_reason == "eos"
    assert masked.stats.target_forwards == len(masked.token_ids) - 1
    assert jumped.stats.target_forwards <= masked.stats.target_forwards - 20  # 27 forced characters


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("name", ["none", "prompt_lookup", "draft_model"])
def test_outputs_are_valid(target, tokenizer, seed, name):
    """Sampled and greedy outputs that finish are valid instances; 'length' is the only other finish."""
    options = {"layers": 1, "num_tokens": 3} if name == "draft_model" else {}
    for fmt, check in (("json_schema", lambda text: jsonschema.validate(json.loads(text), SCHEMA)),
                       ("choice", lambda text: text in FORMATS["choice"]["choices"]),
                       ("regex", lambda text: re.fullmatch(FORMATS["regex"]["regex"], text) is not None)):
        out = generate(target, tokenizer, tokenizer.encode(PROMPTS[0]), max_new_tokens=60, response_format=FORMATS[fmt],
                       do_sample=seed > 0, temperature=2.0, seed=seed, method=build_method(name, do_sample=seed > 0,
                                                                                         options=options))
        assert out.finish_reason == "eos", out.text
        assert out.token_ids[-1] == tokenizer.eos_token_id
        assert check(out.text) is not False


def test_a_grammar_that_cannot_finish_ends_with_length(target, tokenizer):
    out = generate(target, tokenizer, [5, 6], max_new_tokens=8, response_format={"type": "regex", "regex": "a{20}"})
    assert out.finish_reason == "length" and out.text == "a" * 8


@pytest.mark.parametrize("name", ["none", "prompt_lookup", "draft_model"])
def test_sampling_follows_the_constrained_distribution(target, tokenizer, name):
    """Outputs of a choice grammar follow the masked target: P(first char) times P(second | first)."""
    rf = {"type": "choice", "choices": ["ab", "ac", "b"]}
    prompt = tokenizer.encode("ab ac b ab")
    ids = {c: tokenizer.encode(c)[0] for c in "abc"}
    with torch.inference_mode():
        first = torch.softmax(target(torch.tensor([prompt])).logits[0, -1, [ids["a"], ids["b"]]], -1)
        second = torch.softmax(target(torch.tensor([prompt + [ids["a"]]])).logits[0, -1, [ids["b"], ids["c"]]], -1)
    exact = torch.tensor([first[0] * second[0], first[0] * second[1], first[1]])  # ab, ac, b
    options = {"layers": 1, "num_tokens": 2} if name == "draft_model" else {}
    method = build_method(name, do_sample=True, options=options)
    texts = ["ab", "ac", "b"]
    samples = [texts.index(generate(target, tokenizer, prompt, max_new_tokens=4, response_format=rf, do_sample=True,
                                    seed=s, method=method).text) for s in range(400)]
    assert tv(samples, exact) < 0.08  # 400 samples of 3 outcomes: the bound a wrong rule exceeds


def test_forbidden_drafts_are_cut_before_the_forward(tokenizer):
    rf = {"type": "choice", "choices": ["ab", "ac"]}
    grammar = compile_response_format(rf, tokenizer, vocab_size=64, stop_ids={0})
    hook = ConstrainedDecoding(grammar.state(), jump_forward=False)
    a, b, c, z = (tokenizer.encode(x)[0] for x in "abcz")
    # pending ─┬─ a ─┬─ b ── z        z is cut; so is the whole z branch at the top
    #          │     └─ c
    #          └─ z ── a
    tree = DraftTree(torch.tensor([a, z, b, c, z, a]), torch.tensor([-1, -1, 0, 0, 2, 1]))
    kept = hook.shape(tree, 6)
    assert kept.tokens.tolist() == [a, b, c] and kept.parents.tolist() == [-1, 0, 0]
    masks = unpack_mask(hook.rows, 64)
    assert masks[0].nonzero().flatten().tolist() == [a]  # after pending: only "a"
    assert masks[1].nonzero().flatten().tolist() == sorted([b, c])
    assert masks[2].nonzero().flatten().tolist() == [0]  # after "ab": only EOS


def test_jump_forward_extends_the_leaves(tokenizer):
    """A choice left with one option: the drafted "a" is extended by the forced rest and the stop token."""
    grammar = compile_response_format({"type": "choice", "choices": ["abc", "xy"]}, tokenizer, vocab_size=64,
                                      stop_ids={0})
    hook = ConstrainedDecoding(grammar.state())
    a, b, c = (tokenizer.encode(x)[0] for x in "abc")
    assert hook.shape(DraftTree.chain([a]), 8).tokens.tolist() == [a, b, c, 0]
    assert hook.shape(DraftTree.chain([a]), 2).tokens.tolist() == [a, b]  # within the budget
    masks = unpack_mask(hook.rows, 64)
    assert [m.nonzero().flatten().tolist() for m in masks] == [sorted([a, tokenizer.encode("x")[0]]), [b], [c]]


@pytest.mark.parametrize(("response_format", "message"), [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}, "Invalid type"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {"type": "string"}}}}, "Unimplemented keys"),
    ({"type": "json_schema", "json_schema": {"schema": "nope"}}, "json_schema must be"),
    ({"type": "regex", "regex": "a(b"}, "unclosed group"),
    ({"type": "regex", "regex": "a(?=b)"}, "look-around"),
    ({"type": "grammar", "grammar": "start: undefined_rule"}, "cannot compile"),
    ({"type": "choice", "choices": []}, "non-empty list"),
    ({"type": "xml"}, "type must be one of"),
    ("json", "must be an object"),
])
def test_bad_formats_are_one_line_config_errors(target, tokenizer, response_format, message):
    with pytest.raises(ConfigError, match=message) as error:
        generate(target, tokenizer, [5], max_new_tokens=4, response_format=response_format)
    assert "\n" not in str(error.value)


def test_text_format_and_refusals(target, tokenizer):
    plain = generate(target, tokenizer, [5, 6], max_new_tokens=6, stop_at_eos=False)
    assert generate(target, tokenizer, [5, 6], max_new_tokens=6, stop_at_eos=False,
                    response_format={"type": "text"}).token_ids == plain.token_ids
    with pytest.raises(ConfigError, match="needs the model's tokenizer"):
        generate(target, None, [5], max_new_tokens=4, response_format=FORMATS["regex"])
    with pytest.raises(CapabilityError, match="device step"):
        generate(target, tokenizer, [5], max_new_tokens=4, response_format=FORMATS["regex"], device_step=True)


def test_cli_choice(tiny_model_dir, capsys):
    from warpdecode.cli import main

    main(["generate", "--model", str(tiny_model_dir), "--prompt", "hi", "--choice", "yes,no", "--max_new_tokens", "8",
          "--json", "--threads", "1"])
    out = json.loads(capsys.readouterr().out)
    assert out["text"] in ("yes", "no") and out["finish_reason"] == "eos"


def test_gbnf_grammar_is_read(target, tokenizer):
    out = generate(target, tokenizer, [5, 6], max_new_tokens=8, response_format={"type": "grammar",
                                                                                  "grammar": 'root ::= "x" | "yz"'})
    assert out.text in ("x", "yz") and out.finish_reason == "eos"


@pytest.mark.slow
def test_real_model_json_with_prompt_lookup_and_jump_forward(smollm2):
    """On the default model's 49k byte-level vocabulary: the same valid JSON, in fewer forwards, and
    with adaptive rejection."""
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "population": {"type": "integer", "minimum": 0}},
              "required": ["city", "population"], "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}}
    prompt = "Name a big city and its population as JSON."
    plain = generate(smollm2.model, smollm2.tokenizer, prompt, max_new_tokens=40, response_format=rf,
                     jump_forward=False)
    fast = generate(smollm2.model, smollm2.tokenizer, prompt, max_new_tokens=40, response_format=rf,
                    method="prompt_lookup")
    assert fast.token_ids == plain.token_ids and plain.finish_reason == "eos"
    jsonschema.validate(json.loads(plain.text), schema)
    assert fast.stats.target_forwards < plain.stats.target_forwards
    # adaptive rejection: the same tokens, also where llguidance's mask keeps only the canonical
    # tokens of forced bytes (the first step: `{"` for `{"city":"`, not `{`)
    awrs = generate(smollm2.model, smollm2.tokenizer, prompt, max_new_tokens=40, response_format=rf,
                    jump_forward=False, constrained_sampling="awrs")
    assert awrs.token_ids == plain.token_ids


def test_constrained_rows_of_a_continuous_batch_are_exact(target, tokenizer):
    """Rows with different grammars and methods (plain, prompt lookup, token recycling) and an
    unconstrained row, decoded together: each constrained row equals the naive constrained loop."""
    from warpdecode.decoding.continuous import ContinuousBatch
    from warpdecode.decoding.sampler import Sampler, SamplingConfig

    stop = {tokenizer.eos_token_id}
    jobs = [("json_schema", "none", 0), ("regex", "prompt_lookup", 1), ("grammar", "token_recycling", 2),
            ("choice", "none", 1), (None, "prompt_lookup", 0)]
    batch = ContinuousBatch(target, max_rows=8, max_len=64, stop_ids=stop)
    rows = []
    for fmt, method, prompt in jobs:
        constraint = None
        if fmt is not None:
            grammar = compile_response_format(FORMATS[fmt], tokenizer, vocab_size=64, stop_ids=stop)
            constraint = ConstrainedDecoding(grammar.state())
        rows.append(batch.add(tokenizer.encode(PROMPTS[prompt]), max_new_tokens=18, sampler=Sampler(SamplingConfig()),
                              method=build_method(method), constraint=constraint))
    while batch.rows:
        batch.step()
        for row in [r for r in batch.rows if r.finish is not None]:
            batch.remove(row)
    for (fmt, method, prompt), row in zip(jobs, rows, strict=True):
        ids = tokenizer.encode(PROMPTS[prompt])
        if fmt is None:
            assert row.new == generate(target, tokenizer, ids, max_new_tokens=18).token_ids
        else:
            assert row.new == naive_constrained_greedy(target, tokenizer, ids, FORMATS[fmt], 18)
            assert row.finish == ("eos" if row.new[-1] in stop else "length")


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("name", ["none", "prompt_lookup"])
def test_awrs_greedy_is_the_masked_argmax(target, tokenizer, fmt, name):
    """Adaptive rejection picks the same greedy tokens as the full mask, with and without jump-forward."""
    prompt = tokenizer.encode(PROMPTS[list(FORMATS).index(fmt) % len(PROMPTS)])
    reference = naive_constrained_greedy(target, tokenizer, prompt, FORMATS[fmt], 40)
    for jump_forward in (True, False):
        out = generate(target, tokenizer, prompt, max_new_tokens=40, response_format=FORMATS[fmt], method=name,
                       jump_forward=jump_forward, constrained_sampling="awrs")
        assert out.token_ids == reference


def test_awrs_row_follows_the_masked_distribution(target, tokenizer):
    """One row, sampled by adaptive rejection 3,000 times: the masked softmax at the temperature
    (after "abc-" the regex allows the ten digits and "-" is forbidden, so most draws are rejected)."""
    from warpdecode.decoding.constraints.awrs import AdaptiveRejection
    from warpdecode.decoding.sampler import Sampler, SamplingConfig

    grammar = compile_response_format(FORMATS["regex"], tokenizer, vocab_size=64, stop_ids={tokenizer.eos_token_id})
    state = grammar.state()
    assert state.advance(tokenizer.encode("abc-")) == 4
    with torch.inference_mode():
        logits = target(torch.tensor([tokenizer.encode(PROMPTS[1] + " abc-")])).logits[0, -1:] * 3
    bits = torch.zeros(1, mask_words(64), dtype=torch.int32)
    state.fill_mask(bits[0])
    allowed = unpack_mask(bits, 64)[0]
    exact = torch.softmax(logits[0].masked_fill(~allowed, float("-inf")) / 1.5, -1)
    hook = AdaptiveRejection(state, Sampler(SamplingConfig(do_sample=True, temperature=1.5, seed=0)))
    samples = [int(hook.mask_next(logits)[0].argmax()) for _ in range(3000)]
    assert all(allowed[s] for s in samples)
    assert tv(samples, exact) < 0.05  # ~0.02 expected for 10 outcomes; an unrenormalised or masked-late rule is far off
    assert hook.checks > hook.selections == 3000 and hook.fallbacks == 0
    assert torch.softmax(logits[0] / 1.5, -1)[allowed].sum() < 0.5  # rejections are the common case here


def test_awrs_sampling_follows_the_constrained_distribution(target, tokenizer):
    rf = {"type": "choice", "choices": ["ab", "ac", "b"]}
    prompt = tokenizer.encode("ab ac b ab")
    ids = {c: tokenizer.encode(c)[0] for c in "abc"}
    with torch.inference_mode():
        first = torch.softmax(target(torch.tensor([prompt])).logits[0, -1, [ids["a"], ids["b"]]], -1)
        second = torch.softmax(target(torch.tensor([prompt + [ids["a"]]])).logits[0, -1, [ids["b"], ids["c"]]], -1)
    exact = torch.tensor([first[0] * second[0], first[0] * second[1], first[1]])  # ab, ac, b
    texts = ["ab", "ac", "b"]
    samples = [texts.index(generate(target, tokenizer, prompt, max_new_tokens=4, response_format=rf, do_sample=True,
                                    seed=s, jump_forward=False, constrained_sampling="awrs").text) for s in range(300)]
    assert tv(samples, exact) < 0.09  # 300 samples of 3 outcomes (the row-level test above is the sharp one)


def test_awrs_refusals(target, tokenizer):
    with pytest.raises(CapabilityError, match="temperature only"):
        generate(target, tokenizer, [5], max_new_tokens=4, response_format=FORMATS["regex"], do_sample=True, top_k=5,
                 constrained_sampling="awrs")
    with pytest.raises(ConfigError, match="constrained_sampling must be"):
        generate(target, tokenizer, [5], max_new_tokens=4, response_format=FORMATS["regex"], constrained_sampling="x")


def test_asap_converges_to_the_exact_conditional(target, tokenizer):
    """On a finite language, ASAp's sampling distribution starts as masking's and, after corrections,
    approaches the model conditioned on the language, which masking stays far from."""
    from warpdecode.decoding.constraints.asap import ASAp, exact_conditional, kl, masked_policy

    prompt = tokenizer.encode("ab ba")
    memo = {}

    def next_probs(prefix):
        if prefix not in memo:
            with torch.inference_mode():
                memo[prefix] = torch.softmax(target(torch.tensor([prompt + list(prefix)])).logits[0, -1].double() * 3, -1)
        return memo[prefix]

    grammar = compile_response_format({"type": "regex", "regex": "[a-c]{1,3}x|b{4}"}, tokenizer, vocab_size=64,
                                      stop_ids={tokenizer.eos_token_id})
    exact = exact_conditional(grammar.state(), next_probs)
    masked = exact_conditional(grammar.state(), next_probs, policy=masked_policy(next_probs))
    assert len(exact) == 3 + 9 + 27 + 1 and abs(sum(exact.values()) - 1) < 1e-9 and abs(sum(masked.values()) - 1) < 1e-9
    asap = ASAp(grammar.state(), next_probs)
    start = exact_conditional(grammar.state(), next_probs, policy=asap.distribution)
    assert max(abs(start[s] - masked[s]) for s in masked) < 1e-9
    generator = torch.Generator().manual_seed(0)
    samples = [asap.sample(generator) for _ in range(1000)]
    assert all(tuple(s) in exact for s in samples)
    after = exact_conditional(grammar.state(), next_probs, policy=asap.distribution)
    assert kl(masked, exact) > 0.3 and kl(after, exact) < 0.1 * kl(masked, exact), (kl(masked, exact), kl(after, exact))


@pytest.mark.parametrize(("name", "sampling"), [("none", "mask"), ("prompt_lookup", "mask"), ("none", "awrs")])
def test_a_grammar_the_vocabulary_cannot_write_is_a_config_error(target, name, sampling):
    tokenizer = char_tokenizer("abcdefghijklmnopqrstuvwxyz0123456789{}[]ABCDEFGHIJKLMNOPQRSTUV")  # no '"'
    keyed = {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}}  # `{` then a key needs '"'
    with pytest.raises(ConfigError, match="vocabulary cannot write"):
        generate(target, tokenizer, [5, 6], max_new_tokens=8, response_format=keyed, method=name,
                 do_sample=sampling == "awrs", constrained_sampling=sampling)
