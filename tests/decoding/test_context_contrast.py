"""Context-aware decoding and USCD against full-recompute references (two separate uncached forwards
per step), their limits (α = 0, β = 0, the gate's extremes) against plain greedy decoding, and their
refusals."""

import pytest
import torch
from tiny_models import greedy_target, save_tiny_model

from warpdecode.decoding import registry
from warpdecode.decoding.generate import generate
from warpdecode.decoding.rules.cad import cad_logits
from warpdecode.decoding.rules.uscd import uscd_scores
from warpdecode.decoding.specs import parse_spec
from warpdecode.errors import ConfigError

CONTEXT, QUERY = [5, 9, 12, 40, 33, 7, 21, 2, 60], [3, 17, 8]


@pytest.fixture(scope="module")
def model():
    return greedy_target()


def reference(model, prompt, contrast, n, combine):
    """Each step runs both sequences from scratch, without a cache, and takes the argmax of `combine`."""
    seqs, out = [list(prompt), list(contrast)], []
    with torch.inference_mode():
        for _ in range(n):
            logits = torch.cat([model(torch.tensor([s])).logits[:, -1] for s in seqs]).float()  # (2, V)
            token = int(combine(logits)[0].argmax())
            out.append(token)
            for s in seqs:
                s.append(token)
    return out


def rule_tokens(model, prompt, name, n=24, **options):
    return generate(model, None, prompt, max_new_tokens=n, stop_at_eos=False,
                    rule=registry.build("rule", name, **options)).token_ids


@pytest.mark.parametrize("alpha", [0.5, 1.0, 3.0])
@pytest.mark.parametrize("prompt, contrast", [(CONTEXT + QUERY, QUERY), (QUERY, CONTEXT + QUERY)],
                         ids=["contrast-shorter", "contrast-longer"])
def test_cad_equals_the_full_recompute_reference(model, alpha, prompt, contrast):
    expected = reference(model, prompt, contrast, 24, lambda logits: cad_logits(logits, alpha))
    assert rule_tokens(model, prompt, "cad", alpha=alpha, contrast_prompt=contrast) == expected


def test_cad_at_alpha_zero_is_greedy_decoding(model):
    greedy = generate(model, None, CONTEXT + QUERY, max_new_tokens=24, stop_at_eos=False).token_ids
    assert rule_tokens(model, CONTEXT + QUERY, "cad", alpha=0.0, contrast_prompt=QUERY) == greedy
    assert rule_tokens(model, CONTEXT + QUERY, "cad", alpha=1.0, contrast_prompt=QUERY) != greedy


def test_cad_filters_and_hooks_apply_to_the_contrasted_logits(model):
    cad = rule_tokens(model, CONTEXT + QUERY, "cad", alpha=1.0, contrast_prompt=QUERY)
    sampled = generate(model, None, CONTEXT + QUERY, max_new_tokens=24, stop_at_eos=False, do_sample=True, top_k=1,
                       seed=3, rule=registry.build("rule", "cad", alpha=1.0, contrast_prompt=QUERY)).token_ids
    assert sampled == cad  # top-k 1 of the contrasted logits is their argmax
    banned = cad[2]
    out = generate(model, None, CONTEXT + QUERY, max_new_tokens=24, stop_at_eos=False, bad_words_ids=[[banned]],
                   rule=registry.build("rule", "cad", alpha=1.0, contrast_prompt=QUERY))
    assert out.token_ids[:2] == cad[:2] and banned not in out.token_ids


def test_cad_context_is_removed_from_a_text_prompt(tmp_path):
    from warpdecode.models.checkpoint import load_pretrained

    model, tokenizer = load_pretrained(save_tiny_model(tmp_path / "m"))
    document, question = "for i in range(10):\n    pass\n", "Write a story about a cat.\n"
    by_context = generate(model, tokenizer, document + question, max_new_tokens=12, stop_at_eos=False,
                          rule=registry.build("rule", "cad", alpha=1.0, context=document))
    by_prompt = generate(model, tokenizer, document + question, max_new_tokens=12, stop_at_eos=False,
                         rule=registry.build("rule", "cad", alpha=1.0, contrast_prompt=question))
    assert by_context.token_ids == by_prompt.token_ids
    with pytest.raises(ConfigError, match="is not in the prompt"):
        generate(model, tokenizer, question, rule=registry.build("rule", "cad", context="elephant"))


def test_uscd_scores_gate_on_the_sum_of_squared_probabilities():
    certain = torch.tensor([[8.0, 0.0, 0.0, 0.0], [0.0, 8.0, 0.0, 0.0]])
    assert torch.allclose(uscd_scores(certain, 0.8, 0.7, 2 / 3), torch.log_softmax(certain[:1], -1))
    uncertain = torch.log(torch.tensor([[0.40, 0.35, 0.2, 0.05], [0.50, 0.10, 0.2, 0.2]]))
    scores = uscd_scores(uncertain, 0.8, 0.7, 2 / 3)  # keep p >= (2/3)/4: 0.05 is out
    expected = torch.log(torch.tensor([[0.40 - 0.35, 0.35 - 0.07, 0.2 - 0.14, 0.0]]))
    assert torch.allclose(scores, expected, atol=1e-6) and int(scores.argmax()) == 1
    assert uscd_scores(uncertain, 0.8, 0.0, 2 / 3).argmax() == 0
    everything_lame = torch.log(torch.tensor([[0.4, 0.3, 0.3], [0.1, 0.1, 0.8]])) * torch.tensor([[1.0], [0.0]])
    assert torch.allclose(uscd_scores(everything_lame, 0.8, 5.0, 2 / 3), torch.log_softmax(everything_lame[:1], -1))


def test_uscd_equals_the_full_recompute_reference(model):
    lame = CONTEXT[4:] + QUERY
    for threshold in (0.05, 1.0):
        expected = reference(model, CONTEXT + QUERY, lame, 24, lambda logits, t=threshold: uscd_scores(logits, t, 0.7, 2 / 3))
        assert rule_tokens(model, CONTEXT + QUERY, "uscd", lame_prompt=lame, threshold=threshold) == expected


def test_uscd_limits_are_greedy_decoding(model):
    greedy = generate(model, None, CONTEXT + QUERY, max_new_tokens=24, stop_at_eos=False).token_ids
    lame = CONTEXT[4:] + QUERY
    assert rule_tokens(model, CONTEXT + QUERY, "uscd", lame_prompt=lame, threshold=0.0) == greedy  # never uncertain
    assert rule_tokens(model, CONTEXT + QUERY, "uscd", lame_prompt=lame, threshold=1.0, beta=0.0) == greedy
    assert rule_tokens(model, CONTEXT + QUERY, "uscd", lame_prompt=lame, threshold=1.0, beta=2.0) != greedy


@pytest.mark.parametrize("name, options, message", [
    ("cad", {"context": "x"} | {"alpha": -1.0}, "alpha"),
    ("cad", {}, "needs one of"),
    ("cad", {"context": "a", "contrast_prompt": "b"}, "needs one of"),
    ("cad", {"context": ""}, "empty"),
    ("uscd", {"threshold": 2.0}, "threshold"),
    ("uscd", {"beta": float("nan")}, "beta"),
    ("uscd", {"plausibility": -1.0}, "plausibility"),
])
def test_bad_options_are_one_line_config_errors(name, options, message):
    with pytest.raises(ConfigError, match=message):
        registry.build("rule", name, **options)


def test_id_prompts_need_the_contrast_as_ids(model):
    with pytest.raises(ConfigError, match="text prompt"):
        generate(model, None, CONTEXT + QUERY, rule=registry.build("rule", "cad", context="x"))
    with pytest.raises(ConfigError, match="lame_prompt"):
        generate(model, None, CONTEXT + QUERY, rule=registry.build("rule", "uscd"))
    with pytest.raises(ConfigError, match="exceeds the model's context"):
        generate(model, None, QUERY, max_new_tokens=250, rule=registry.build("rule", "cad", contrast_prompt=CONTEXT * 3))


def test_a_spec_value_takes_escaped_colons():
    assert parse_spec(r"cad:alpha=0.5:context=Note\: the sky is green") == (
        "cad", {"alpha": 0.5, "context": "Note: the sky is green"})


def test_uscd_lame_prompt_defaults_to_the_prompt_without_its_examples(tmp_path):
    from warpdecode.data.humaneval import without_examples
    from warpdecode.models.checkpoint import load_pretrained

    model, tokenizer = load_pretrained(save_tiny_model(tmp_path / "m"))
    prompt = 'def f(x):\n    """Double x.\n    >>> f(2)\n    4\n    """\n'
    assert without_examples(prompt) != prompt
    default = generate(model, tokenizer, prompt, max_new_tokens=12, stop_at_eos=False,
                       rule=registry.build("rule", "uscd", threshold=1.0))
    given = generate(model, tokenizer, prompt, max_new_tokens=12, stop_at_eos=False,
                     rule=registry.build("rule", "uscd", threshold=1.0, lame_prompt=without_examples(prompt)))
    assert default.token_ids == given.token_ids
