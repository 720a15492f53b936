"""Grammar-constrained diffusion decoding: every answer stays completable, bounded grammars end in a
valid string, and a grammar that takes every string changes nothing."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch
from oracle_dlm import EOS, MASK, OracleDLM

from warpdecode.decoding import registry
from warpdecode.decoding.constraints.formats import compile_response_format
from warpdecode.decoding.diffusion.decoder import diffusion_generate
from warpdecode.decoding.diffusion.policies.fixed import FixedCommit
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.models.config import ModelConfig
from warpdecode.models.tokenizer import char_tokenizer
from warpdecode.models.transformer import Transformer

TASKS = "abcdefghijklmnopqrstuvwxyz0123456789()[]{}+=:_"
JSON_CHARS = TASKS + '",'
POLICIES = ["fixed", "fixed:tokens_per_step=3", "threshold:threshold=0.3", "prophet", "local_leap", "credit"]
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "ok": {"type": "boolean"}},
          "required": ["n", "ok"], "additionalProperties": False}
BRACKETS = 'start: x*\nx: "(" x* ")" | "[" x* "]"'


def char_dlm(alphabet: str, seed: int = 2):
    """An untrained masked diffusion LM over `alphabet` (peaked random weights, as tests/conftest.py's)."""
    tokenizer = char_tokenizer(alphabet)
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(vocab_size=tokenizer.vocab_size, n_layer=2, n_head=2, d_model=32, d_ff=64,
                                    max_seq_len=64, causal=False, mask_token_id=tokenizer.backend.token_to_id("<|mask|>"),
                                    eos_token_ids=[0]))
    model.init_weights(std=0.6)
    return model.eval(), tokenizer


def policy(spec: str):
    name, *options = spec.split(":")
    return registry.build("commit_policy", name, **{k: float(v) if "." in v else int(v)
                                                     for k, v in (o.split("=") for o in options)})


def states(fmt, tokenizer, rows: int, model) -> list:
    grammar = compile_response_format(fmt, tokenizer, vocab_size=model.config.vocab_size, stop_ids={0})
    return [grammar.state() for _ in range(rows)]


PROMPTS = ["copy:ab=", "add:12+345=", "x"]


def decode(model, tokenizer, spec: str, constraints=None, **options):
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    return diffusion_generate(model, prompts, policy(spec), gen_length=options.pop("gen_length", 16),
                              block_length=options.pop("block_length", 8), eos_token_id=0, constraints=constraints,
                              **options)


@pytest.mark.parametrize("spec", POLICIES)
def test_a_grammar_that_takes_every_string_changes_nothing(spec: str) -> None:
    model, tokenizer = char_dlm(TASKS)
    free = decode(model, tokenizer, spec)
    everything = states({"type": "regex", "regex": "(?s:.*)"}, tokenizer, 3, model)
    constrained = decode(model, tokenizer, spec, [everything[0], None, everything[2]])
    assert torch.equal(constrained.sequences, free.sequences)
    assert constrained.stats.steps == free.stats.steps
    assert constrained.stats.committed_per_step == free.stats.committed_per_step


@pytest.mark.parametrize("spec", POLICIES)
def test_every_answer_of_a_bounded_grammar_is_valid(spec: str) -> None:
    model, tokenizer = char_dlm(TASKS)
    fmt = {"type": "regex", "regex": "[0-9]{2,5}"}
    out = decode(model, tokenizer, spec, states(fmt, tokenizer, 3, model))
    answers = [tokenizer.decode(a) for a in out.answers]
    assert all(re.fullmatch("[0-9]{2,5}", a) for a in answers), answers
    free = decode(model, tokenizer, spec)
    assert not any(re.fullmatch("[0-9]{2,5}", tokenizer.decode(a)) for a in free.answers)  # the model alone: none


@pytest.mark.parametrize("spec", ["fixed", "threshold:threshold=0.3", "prophet"])
def test_json_answers_validate_against_the_schema(spec: str) -> None:
    model, tokenizer = char_dlm(JSON_CHARS, seed=3)
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}}
    out = decode(model, tokenizer, spec, states(fmt, tokenizer, 3, model), gen_length=24)
    for answer in out.answers:
        jsonschema.validate(json.loads(tokenizer.decode(answer)), SCHEMA)


@pytest.mark.parametrize("options", [{"eot_stop": True}, {"kv_cache": "dual"}, {"temperature": 1.0}])
def test_an_unbounded_grammar_leaves_a_completable_answer_with_any_decoder_option(options) -> None:
    model, tokenizer = char_dlm(TASKS)
    grammar = compile_response_format({"type": "grammar", "grammar": BRACKETS}, tokenizer,
                                      vocab_size=model.config.vocab_size, stop_ids={0})
    generator = torch.Generator().manual_seed(0) if options.get("temperature") else None
    out = decode(model, tokenizer, "threshold:threshold=0.3", [grammar.state() for _ in PROMPTS], generator=generator,
                 **options)
    for answer in out.answers:
        check = grammar.state()
        assert check.advance(answer) == len(answer)  # a prefix of a string of the grammar
        if len(answer) < 16:  # it ended inside the region: a complete string
            assert check.is_accepting()


def test_a_commit_that_breaks_the_grammar_waits_and_the_frontier_takes_an_allowed_token() -> None:
    # V = 16: ids 0 EOS, 1 mask, then a b 0 1 ... 9 x y. The model says "x567" with EOS after and is most
    # confident at slot 2 ("6" replaced by "y" here), which no completion of "a[0-9]{3}" has.
    tokenizer = char_tokenizer("ab0123456789xy")
    ids = {c: tokenizer.backend.token_to_id(c) for c in "ax5y7"}
    prompt = [ids["a"]]
    truth = torch.tensor([prompt + [ids["x"], ids["5"], ids["y"], ids["7"], EOS, EOS]])
    confidence = torch.tensor([[0.99, 0.5, 0.6, 0.95, 0.7, 0.8, 0.8]])
    model = OracleDLM(truth, confidence)
    grammar = compile_response_format({"type": "regex", "regex": "a[0-9]{3}"}, tokenizer, vocab_size=16,
                                      stop_ids={EOS})
    out = diffusion_generate(model, [prompt], FixedCommit(1), gen_length=6, block_length=6, eos_token_id=EOS,
                             constraints=[grammar.state()])
    # slot 2's "y" waits each step while the frontier moves: "a" (the only token allowed) at slot 0,
    # "5" at 1, then slot 2 itself gets its most probable allowed token, "0" (all others tie), then "7"
    assert tokenizer.decode(out.answers[0]) == "a507"
    assert out.stats.steps == [6] and all(c == [1] for c in out.stats.committed_per_step)
    order = [int((before != after).nonzero()[0, 1]) - 1 for before, after in zip(model.seen, model.seen[1:])]
    assert order[:3] == [0, 1, 2]
    assert MASK not in out.sequences[0].tolist()


def test_rows_with_their_own_grammars_decode_as_they_do_alone() -> None:
    model, tokenizer = char_dlm(TASKS)
    formats = [{"type": "regex", "regex": "[0-9]{2,5}"}, None, {"type": "choice", "choices": ["yes", "no"]}]
    prompts = [tokenizer.encode(p) for p in PROMPTS]

    def run(rows: list[int]):
        constraints = [None if formats[r] is None else states(formats[r], tokenizer, 1, model)[0] for r in rows]
        return diffusion_generate(model, [prompts[r] for r in rows], policy("threshold:threshold=0.3"), gen_length=16,
                                  block_length=8, eos_token_id=0, constraints=constraints)

    together = run([0, 1, 2])
    assert [together.answers[r] for r in range(3)] == [run([r]).answers[0] for r in range(3)]
    assert tokenizer.decode(together.answers[2]) in ("yes", "no")


def test_bad_constraints_are_refused() -> None:
    model, tokenizer = char_dlm(TASKS)
    grammar = states({"type": "regex", "regex": "[0-9]+"}, tokenizer, 3, model)
    with pytest.raises(ConfigError, match="2 constraints for 3 prompts"):
        decode(model, tokenizer, "fixed", grammar[:2])
    with pytest.raises(CapabilityError, match="takes no constraint"):
        decode(model, tokenizer, "free_draft", grammar)
    no_quotes = states({"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}}, tokenizer, 3, model)
    with pytest.raises(ConfigError, match="vocabulary cannot write"):
        decode(model, tokenizer, "fixed", no_quotes)
