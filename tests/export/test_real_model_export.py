"""The default model exported and run on ONNX Runtime: logits within tolerance of PyTorch, and every
lossless method tried here token-identical to PyTorch greedy, trained-drafter kinds included."""

import pytest
import torch
from built_once import built_once
from tiny_models import eagle_package, heads_package

from warpdecode.decoding import registry
from warpdecode.decoding.generate import build_method, generate
from warpdecode.export.package import export_package
from warpdecode.runtime.package import InferencePackage

pytestmark = pytest.mark.slow

PROMPTS = [
    "Write a Python function that returns the squares of the even numbers in a list.",
    ("Summarize in one sentence: The city council met on Tuesday to discuss the new bicycle lanes. Residents "
     "said the lanes make the streets safer, while shop owners worried that they remove parking spaces."),
]
NEW_TOKENS = 40
LOGIT_TOLERANCE = 1e-3
"""Largest |ORT - PyTorch| logit allowed (logits are O(10); measured ~5e-5 portable, ~2e-4 fused)."""


@pytest.fixture(scope="module")
def package(smollm2, tmp_path_factory):
    def build(root):
        paths = [eagle_package(smollm2.model, root / "eagle", std=0.02),
                 heads_package(smollm2.model, root / "hydra", "hydra", std=0.02)]
        export_package(smollm2.model, smollm2.tokenizer, root / "smollm2", source="smollm2-135m-instruct",
                       drafters=paths, quantize=("int8", "int4"))

    return InferencePackage.load(built_once(tmp_path_factory, "smollm2", build))


@pytest.fixture(scope="module", params=["onnxruntime", "onnxruntime-portable"])
def onnxruntime_backbone(package, request):
    """The fused graph (the CPU default) and the portable step graph."""
    backbone = package.backbone(request.param)
    assert backbone.fused == (request.param == "onnxruntime")
    return backbone


@pytest.fixture(scope="module")
def greedy_reference(smollm2):
    """PyTorch greedy continuations of `PROMPTS`, computed once for every method and backbone."""
    return {prompt: generate(smollm2.model, smollm2.tokenizer, prompt, max_new_tokens=NEW_TOKENS,
                             stop_at_eos=False).token_ids for prompt in PROMPTS}


def test_package_identity_and_torch_rebuild(package, smollm2):
    assert package.fingerprint == smollm2.model.fingerprint()
    assert package.backbone("torch").fingerprint() == smollm2.model.fingerprint()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_logits_within_tolerance(onnxruntime_backbone, smollm2, prompt):
    ids = torch.tensor([smollm2.tokenizer.encode(prompt)])
    with torch.inference_mode():
        ours = onnxruntime_backbone(ids).logits
        ref = smollm2.model(ids).logits
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() <= LOGIT_TOLERANCE


@pytest.mark.parametrize("method", ["none", "prompt_lookup", "token_recycling", "int4_self", "eagle", "hydra"])
def test_greedy_identity_on_onnxruntime(onnxruntime_backbone, package, greedy_reference, method):
    built = build_method(method, options=registry.package_options(package.drafter_directories()).get(method, {}))  # one method serves every prompt
    for prompt in PROMPTS:
        out = generate(onnxruntime_backbone, package.tokenizer(), prompt, max_new_tokens=NEW_TOKENS, stop_at_eos=False,
                       method=built)
        assert out.token_ids == greedy_reference[prompt], f"{method} diverged on {prompt[:40]!r}"


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_quantised_graphs_stay_close_to_the_model(package, kind):
    """Measured at export on the model's own greedy text (4 prompts, 192 positions): 0.78 (int8), 0.82 (int4)."""
    accuracy = package.manifest["backbone"]["variants"][kind]["accuracy"]
    assert accuracy["positions"] == 4 * 48
    assert accuracy["top1_agreement"] >= 0.7
