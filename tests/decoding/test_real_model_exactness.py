"""The exactness suite on the real default model: every drafter, verified losslessly at temperature 0,
emits exactly what plain greedy decoding emits; penalties match Hugging Face `generate()`."""

import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_models import (
    acceptance_head_package,
    clover_package,
    distilled_package,
    eagle_package,
    heads_package,
    layer_router_package,
    ppd_package,
    save_diffusion_drafter,
)

from warpdecode.decoding import registry
from warpdecode.decoding.generate import build_method, encode_prompt, generate
from warpdecode.models.tokenizer import Tokenizer

pytestmark = pytest.mark.slow

REAL_OPTIONS = {"draft_model": {"layers": 10, "num_tokens": 4}}
PROMPTS = [
    (
        "Summarize in one sentence: The city council met on Tuesday to discuss the new bicycle lanes. "
        "Residents said the bicycle lanes make the streets safer, while shop owners worried that the "
        "bicycle lanes remove parking spaces in front of their shops."
    ),
    "Write a Python function that returns the squares of the even numbers in a list.",
]
"""An input-grounded prompt (what lookup-style drafters copy from) and an open one, 40 tokens each for every
drafter: about 20 s of real-model decoding per drafter (untrained drafters cost ~2x plain); the tiny-model
exactness suite covers the many more shapes and prompts."""
NEW_TOKENS = 40


@pytest.fixture(scope="module")
def greedy_reference(smollm2):
    return {p: generate(smollm2.model, smollm2.tokenizer, p, max_new_tokens=NEW_TOKENS, stop_at_eos=False).token_ids
            for p in PROMPTS}


@pytest.fixture(scope="module", autouse=True)
def retrieval_corpus(smollm2, tmp_path_factory):
    """A small retrieval datastore: a few standard-library modules in the target's tokens."""
    root = Path(sysconfig.get_paths()["stdlib"])
    text = "\n".join((root / name).read_text(encoding="utf-8") for name in ("textwrap.py", "json/encoder.py"))
    path = tmp_path_factory.mktemp("retrieval") / "corpus.npy"
    np.save(path, np.array(smollm2.tokenizer.encode(text), dtype=np.int32))
    REAL_OPTIONS["retrieval"] = {"corpus": str(path)}
    yield
    del REAL_OPTIONS["retrieval"]


@pytest.fixture(scope="module", autouse=True)
def learned_drafters(smollm2, tmp_path_factory):
    """Untrained EAGLE, Medusa, Hydra, Clover, PPD and distilled packages, a fixed-decision layer router and a random
    diffusion drafter with the target's tokenizer for the real target (exactness needs no training)."""
    root = tmp_path_factory.mktemp("learned")
    REAL_OPTIONS["eagle"] = {"path": eagle_package(smollm2.model, root / "eagle")}
    for kind in ("medusa", "hydra"):
        REAL_OPTIONS[kind] = {"path": heads_package(smollm2.model, root / kind, kind)}
    ACCEPTANCE_HEAD["acceptance_head"] = acceptance_head_package(smollm2.model, root / "acceptance_head")
    REAL_OPTIONS["first"] = {"router": layer_router_package(smollm2.model, root / "first", skip=(9, 19))}
    REAL_OPTIONS["diffuspec"] = {"model": str(save_diffusion_drafter(root / "dlm", smollm2.model.config.vocab_size,
                                                                     Tokenizer.load(smollm2.directory)))}
    REAL_OPTIONS["distilled"] = {"path": distilled_package(smollm2.model, root / "distilled", std=0.0,
                                                           init_layers=(0, 14, 29), vocab=8192)}
    DISTILLED_INT4["path"] = REAL_OPTIONS["distilled"]["path"]
    REAL_OPTIONS["clover"] = {"path": clover_package(smollm2.model, root / "clover", std=0.02)}
    REAL_OPTIONS["ppd"] = {"path": ppd_package(smollm2.model, root / "ppd")}
    HYDRA_LOOKUP["path"] = REAL_OPTIONS["hydra"]["path"]
    yield
    for kind in ("eagle", "medusa", "hydra", "first", "diffuspec", "distilled", "clover", "ppd"):
        del REAL_OPTIONS[kind]
    del DISTILLED_INT4["path"], HYDRA_LOOKUP["path"]


ACCEPTANCE_HEAD: dict[str, object] = {"num_tokens": 10}
"""int4_self with an (untrained) SpecDec++ acceptance head; the package path is filled in by the fixture."""
DISTILLED_INT4: dict[str, object] = {"bits": 4, "num_tokens": 3, "num_nodes": 6, "top_k": 2}
"""The distilled drafter's int4 copy growing DySpec trees; the package path is filled in by the fixture."""
HYDRA_LOOKUP: dict[str, object] = {"lookup": 10}
"""Hydra's tree fused with prompt lookup; the package path is filled in by the fixture."""
CASES = [(n, None) for n in registry.names("drafter") if n != "none"] + [
    ("int4_self", {"num_nodes": 8, "top_k": 2}),  # a DySpec dynamic tree
    ("int4_self", ACCEPTANCE_HEAD),
    ("distilled", DISTILLED_INT4),
    ("hydra", HYDRA_LOOKUP),
]


@pytest.mark.parametrize(("name", "options"), CASES, ids=[f"{n}{'-' + '-'.join(o) if o else ''}" for n, o in CASES])
def test_lossless_drafters_are_token_identical_to_greedy(smollm2, greedy_reference, name, options):
    """`options` None: the drafter's defaults, or REAL_OPTIONS where it needs some."""
    method = build_method(name, options=REAL_OPTIONS.get(name, {}) if options is None else options)
    assert method.verifier.lossless
    for prompt in PROMPTS:
        out = generate(smollm2.model, smollm2.tokenizer, prompt, max_new_tokens=NEW_TOKENS, stop_at_eos=False,
                       method=method)
        assert out.token_ids == greedy_reference[prompt], f"{name} diverged on {prompt[:40]!r}"


def test_a_judge_that_approves_everything_is_trust(smollm2, tmp_path):
    """The judge reads the real target's hidden states at every drafted token; approving all of them
    accepts what `trust` accepts, and every approval the target disagrees with is counted."""
    from tiny_models import judge_package

    judge = judge_package(smollm2.model, tmp_path / "judge", bias=10.0)
    options = {"num_tokens": 4}
    judged = generate(smollm2.model, smollm2.tokenizer, PROMPTS[1], max_new_tokens=NEW_TOKENS, stop_at_eos=False,
                      method=build_method("int4_self", options=options, verifier="judge",
                                          verifier_options={"path": judge, "threshold": 0.5}))
    trusted = generate(smollm2.model, smollm2.tokenizer, PROMPTS[1], max_new_tokens=NEW_TOKENS, stop_at_eos=False,
                       method=build_method("int4_self", options=options, verifier="trust"))
    assert judged.token_ids == trusted.token_ids
    assert judged.stats.divergent_tokens == trusted.stats.divergent_tokens


def test_prompt_lookup_accepts_drafts_on_input_grounded_text(smollm2):
    out = generate(smollm2.model, smollm2.tokenizer, PROMPTS[0], max_new_tokens=NEW_TOKENS,
                   method=build_method("prompt_lookup"))
    assert out.stats.tau > 1.2


def test_copy_input_copies_through_a_spelling_correction(smollm2):
    prompt = ("Correct the spelling mistakes in the following text. Reply with the corrected text only.\n\n"
              "A rboe takes 2 bolts of blue fiber and half taht much white fiber.  How many bolts in total does it take?")
    out = generate(smollm2.model, smollm2.tokenizer, prompt, max_new_tokens=NEW_TOKENS, method=build_method("copy_input"))
    plain = generate(smollm2.model, smollm2.tokenizer, prompt, max_new_tokens=NEW_TOKENS)
    assert out.token_ids == plain.token_ids
    assert out.stats.tau > 2.5  # measured 3.8: most of the answer is copied from the prompt


def test_repetition_penalty_matches_transformers_greedy(smollm2, smollm2_transformers):
    ids = encode_prompt(smollm2.tokenizer, PROMPTS[0], chat=True)
    with torch.inference_mode():
        ref = smollm2_transformers.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                            repetition_penalty=1.3, pad_token_id=0)[0, len(ids):].tolist()
    for method in ("none", "prompt_lookup"):
        ours = generate(smollm2.model, smollm2.tokenizer, ids, max_new_tokens=NEW_TOKENS, repetition_penalty=1.3,
                        method=method)
        assert ours.token_ids == ref[: len(ours.token_ids)], method
