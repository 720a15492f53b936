"""Contrastive search against a full-recompute reference of Hugging Face's rule.

The installed transformers moved contrastive search to a hub repository (`custom_generate=
"transformers-community/contrastive-search"`), which is not on this machine, so the reference is
written here from its semantics (HF 4.x `_contrastive_search` / `_ranking_fast`): softmax of the
processed logits, the top-k tokens, each candidate's final hidden state against every earlier
position's, score (1 - α) p - α max cos, first best on a tie. It recomputes every sequence from
scratch with Hugging Face's model (or warpdecode's without a cache), so it shares neither the cache
nor the one-level tree forward with the implementation under test.
"""

import pytest
import torch
from tiny_models import greedy_target, id_tokenizer

from warpdecode.decoding.generate import generate
from warpdecode.decoding.rules.contrastive import contrastive_choice
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.models.checkpoint import load_pretrained

pytestmark = pytest.mark.usefixtures("single_thread")


def reference(forward, ids, n, alpha, k, process=None):
    """Contrastive search by full recompute; `forward(seq)` gives ((T, V) logits, (T, C) final hidden states)."""
    seq = list(ids)
    with torch.inference_mode():
        for _ in range(n):
            logits = forward(seq)[0][-1]
            if process is not None:
                logits = process(torch.tensor([seq]), logits[None].clone())[0]
            probs, top = torch.softmax(logits.float(), -1).topk(k)
            scores = []
            for p, v in zip(probs.tolist(), top.tolist(), strict=True):
                hidden = forward(seq + [v])[1].float()
                cosine = torch.nn.functional.cosine_similarity(hidden[:-1], hidden[-1:], dim=-1)
                scores.append((1 - alpha) * p - alpha * float(cosine.max()))
            seq.append(top.tolist()[max(range(k), key=lambda i: (scores[i], -i))])
    return seq[len(ids):]


def ours_forward(model):
    def forward(seq):
        out = model(torch.tensor([seq]), hidden_layers=(model.config.n_layer,))
        return out.logits[0], out.hidden_states[model.config.n_layer][0]
    return forward


def hf_forward(hf):
    def forward(seq):
        out = hf(torch.tensor([seq]), output_hidden_states=True)
        return out.logits[0], out.hidden_states[-1][0]
    return forward


PROMPT = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]


@pytest.fixture(scope="module")
def target():
    return greedy_target()


def test_choice_trades_probability_for_novelty():
    context = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    candidates = torch.tensor([[1.0, 0.1], [1.0, -1.0]])  # the likelier one repeats context row 0
    probs = torch.tensor([0.6, 0.4])
    assert contrastive_choice(context, candidates, probs, 0.1) == 0
    assert contrastive_choice(context, candidates, probs, 0.6) == 1


@pytest.mark.parametrize("alpha, k", [(0.6, 4), (0.3, 2), (0.9, 6)])
def test_equals_the_full_recompute_reference(target, alpha, k):
    out = generate(target, None, PROMPT, max_new_tokens=16, stop_at_eos=False, penalty_alpha=alpha, top_k=k)
    assert out.token_ids == reference(ours_forward(target), PROMPT, 16, alpha, k)
    assert out.stats.target_forwards == 16


def test_runs_to_the_end_of_the_context(target):
    """The last top_k - 1 slots of the context cannot hold the candidates side by side: one at a time there."""
    prompt = PROMPT * 25  # 250 of the 256 positions
    out = generate(target, None, prompt, max_new_tokens=20, stop_at_eos=False, penalty_alpha=0.6, top_k=4)
    assert out.finish_reason == "context" and out.token_ids == reference(ours_forward(target), prompt, 6, 0.6, 4)


def test_differs_from_greedy_and_applies_the_penalties_and_hooks(target):
    transformers = pytest.importorskip("transformers")
    plain = generate(target, None, PROMPT, max_new_tokens=16, stop_at_eos=False).token_ids
    contrastive = generate(target, None, PROMPT, max_new_tokens=16, stop_at_eos=False, penalty_alpha=0.6, top_k=4)
    assert contrastive.token_ids != plain
    penalised = generate(target, None, PROMPT, max_new_tokens=16, stop_at_eos=False, penalty_alpha=0.6, top_k=4,
                         repetition_penalty=1.5, bad_words_ids=[[contrastive.token_ids[1]]])
    def process(input_ids, scores):
        scores = transformers.RepetitionPenaltyLogitsProcessor(1.5)(input_ids, scores)
        return transformers.NoBadWordsLogitsProcessor([[contrastive.token_ids[1]]])(input_ids, scores)
    assert penalised.token_ids == reference(ours_forward(target), PROMPT, 16, 0.6, 4, process) != contrastive.token_ids


def test_stop_strings_and_stop_tokens_end_it(target):
    tokenizer = id_tokenizer(64)
    full = generate(target, tokenizer, PROMPT, max_new_tokens=16, stop_at_eos=False, penalty_alpha=0.6, top_k=4)
    chunks = []
    stop = " ".join(full.text.split()[5:7])
    out = generate(target, tokenizer, PROMPT, max_new_tokens=16, stop_at_eos=False, penalty_alpha=0.6, top_k=4,
                   stop=stop, streamer=chunks.append)
    assert out.finish_reason == "stop" and out.text == "".join(chunks) == full.text[: full.text.index(stop)]
    eos = generate(target, None, PROMPT, max_new_tokens=16, penalty_alpha=0.6, top_k=4, eos_token_id=full.token_ids[3])
    assert eos.token_ids == full.token_ids[: full.token_ids.index(full.token_ids[3]) + 1] and eos.finish_reason == "eos"


@pytest.mark.parametrize("kwargs, error", [
    ({"penalty_alpha": 0.6, "top_k": 4, "method": "prompt_lookup"}, CapabilityError),
    ({"penalty_alpha": 0.6, "top_k": 4, "do_sample": True}, ConfigError),
    ({"penalty_alpha": 0.6}, ConfigError),
    ({"penalty_alpha": 1.5, "top_k": 4}, ConfigError),
])
def test_refusals(target, kwargs, error):
    with pytest.raises(error):
        generate(target, None, PROMPT, max_new_tokens=4, **kwargs)


def test_a_built_rule_equals_the_keywords(target):
    from warpdecode.decoding import registry

    rule = registry.build("rule", "contrastive", penalty_alpha=0.6, top_k=4)
    keywords = generate(target, None, PROMPT, max_new_tokens=12, stop_at_eos=False, penalty_alpha=0.6, top_k=4)
    built = generate(target, None, PROMPT, max_new_tokens=12, stop_at_eos=False, rule=rule)
    assert built.token_ids == keywords.token_ids
    with pytest.raises(ConfigError):
        generate(target, None, PROMPT, max_new_tokens=4, rule=rule, penalty_alpha=0.6, top_k=4)
    with pytest.raises(ConfigError):  # Mirostat draws samples
        generate(target, None, PROMPT, max_new_tokens=4, rule=registry.build("rule", "mirostat"))
    with pytest.raises(CapabilityError):
        generate(target, None, PROMPT, max_new_tokens=4, rule=rule, method="prompt_lookup")


def test_equals_the_reference_on_transformers_weights(tiny_model_dir):
    transformers = pytest.importorskip("transformers")
    model, tokenizer = load_pretrained(tiny_model_dir)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    ids = tokenizer.encode("for i in")
    out = generate(model, tokenizer, ids, max_new_tokens=16, stop_at_eos=False, penalty_alpha=0.6, top_k=4)
    assert out.token_ids == reference(hf_forward(hf), ids, 16, 0.6, 4)


@pytest.mark.slow
def test_equals_the_reference_on_the_default_model(smollm2, smollm2_transformers):
    ids = smollm2.tokenizer.encode("The owl is a bird that")
    out = generate(smollm2.model, smollm2.tokenizer, ids, max_new_tokens=8, penalty_alpha=0.6, top_k=3)
    assert out.token_ids == reference(hf_forward(smollm2_transformers), ids, 8, 0.6, 3)
    assert out.token_ids != generate(smollm2.model, smollm2.tokenizer, ids, max_new_tokens=8).token_ids
