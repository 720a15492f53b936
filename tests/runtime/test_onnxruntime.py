"""The ONNX Runtime backend against the PyTorch backend on the same exported package (tiny model)."""

import pytest
import torch
from tiny_models import greedy_target, naive_greedy

from warpdecode.decoding import registry
from warpdecode.decoding.batch import decode_batch
from warpdecode.decoding.generate import build_method, generate
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.errors import CapabilityError
from warpdecode.models.cache import KVCache
from warpdecode.runtime.package import InferencePackage

pytestmark = pytest.mark.usefixtures("single_thread")

TOL = {"atol": 1e-4, "rtol": 1e-4}


@pytest.fixture(scope="module", params=[True, False], ids=["fused", "portable"])
def backbones(tiny_package, request):
    """The fused graph (what the CPU runs) and the portable step graph, each beside the torch backend."""
    package = InferencePackage.load(tiny_package)
    ort = package.backbone("onnxruntime" if request.param else "onnxruntime-portable", threads=1)
    assert ort.fused == request.param
    return ort, package.backbone("torch")


def test_torch_backend_of_a_package_is_the_exported_model(backbones):
    _, torch_model = backbones
    assert torch_model.fingerprint() == greedy_target().fingerprint()


def test_prefill_tree_and_batch_forwards_match_torch(backbones):
    ort, reference = backbones
    caches = [KVCache.for_model(reference.config, 2, 32) for _ in range(2)]
    prompt = torch.randint(0, 64, (2, 9))
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)[None]
    steps = torch.randint(0, 64, (2, 3))
    outs = []
    with torch.inference_mode():
        for model, cache in zip((ort, reference), caches, strict=True):
            first = model(prompt, cache=cache, hidden_layers=(3,), logits_slice=slice(-1, None))
            cache.truncate([9, 6])  # rows of different lengths: the non-uniform write path
            tree_out = model(steps, cache=cache, attention_mask=tree, hidden_layers=(1, 3))
            outs.append((first, tree_out))
    (ort_first, ort_tree), (ref_first, ref_tree) = outs
    assert ort_first.logits.shape == (2, 1, 64)
    torch.testing.assert_close(ort_first.logits, ref_first.logits, **TOL)
    torch.testing.assert_close(ort_first.hidden_states[3], ref_first.hidden_states[3], **TOL)
    torch.testing.assert_close(ort_tree.logits, ref_tree.logits, **TOL)
    for layer in (1, 3):
        torch.testing.assert_close(ort_tree.hidden_states[layer], ref_tree.hidden_states[layer], **TOL)
    assert caches[0].lengths.tolist() == caches[1].lengths.tolist() == [12, 9]
    for row, used in enumerate((12, 9)):
        torch.testing.assert_close(caches[0].k[:, row, :, :used], caches[1].k[:, row, :, :used], **TOL)
        torch.testing.assert_close(caches[0].v[:, row, :, :used], caches[1].v[:, row, :, :used], **TOL)


def test_cache_free_forward_matches_torch(backbones):
    ort, reference = backbones
    tokens = torch.randint(0, 64, (1, 6))
    with torch.inference_mode():
        torch.testing.assert_close(ort(tokens).logits, reference(tokens).logits, **TOL)


def test_unexported_hidden_state_is_refused(backbones):
    ort, _ = backbones
    with pytest.raises(CapabilityError, match="hidden states \\[1, 3\\], not \\[2\\]"):
        ort(torch.tensor([[1, 2]]), hidden_layers=(2,))


EMBEDS_INPUTS = {"ppd"}
"""Drafters whose auxiliary rows are input embeddings: they move the backbone onto the embeds graph
for good, so they get a backbone of their own (tests/export/test_embeds_graph.py)."""


@pytest.mark.parametrize("name", registry.names("drafter"))
def test_every_drafter_is_greedy_identical_on_onnxruntime(backbones, name, drafter_options, tiny_package):
    ort, reference = backbones
    if name in EMBEDS_INPUTS:
        ort = InferencePackage.load(tiny_package).backbone("onnxruntime" if ort.fused else "onnxruntime-portable", threads=1)
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    method = build_method(name, options=drafter_options.get(name, {}))
    out = generate(ort, None, prompt, max_new_tokens=20, stop_at_eos=False, method=method)
    assert out.token_ids == naive_greedy(reference, prompt, 20)


def test_batched_decoding_matches_torch(backbones):
    ort, reference = backbones
    prompts = [[1, 2, 3, 4, 5], [9, 8], [7, 7, 7, 7]]
    sampler = Sampler(SamplingConfig())
    ours = decode_batch(ort, prompts, sampler, budgets=[6, 9, 4], stop_ids=set())
    theirs = decode_batch(reference, prompts, sampler, budgets=[6, 9, 4], stop_ids=set())
    assert [r[0] for r in ours] == [r[0] for r in theirs]


def test_sampling_on_onnxruntime_follows_the_same_draws(backbones):
    """Same seed, same logits up to float noise: the sampled tokens agree with the torch backend."""
    ort, reference = backbones
    runs = [generate(model, None, [3, 1, 4, 1, 5], max_new_tokens=16, stop_at_eos=False, do_sample=True, seed=7,
                     temperature=1.0, method=build_method("prompt_lookup", do_sample=True)).token_ids
            for model in (ort, reference)]
    assert runs[0] == runs[1]


def test_unavailable_execution_provider_is_refused(tiny_package):
    package = InferencePackage.load(tiny_package)
    with pytest.raises(CapabilityError, match="could not load CUDAExecutionProvider"):
        package.backbone("onnxruntime", device="cuda")
    with pytest.raises(CapabilityError, match="device must be one of"):
        package.backbone("onnxruntime", device="tpu")
    with pytest.raises(CapabilityError, match="TensorRT"):
        package.backbone("tensorrt")


def test_chunked_prefill_matches_one_forward(backbones, monkeypatch):
    """Long causal forwards run in chunks (and from COPY_PREFIX_ROWS rows attend to a copied prefix):
    same logits, hidden states and cache as the PyTorch forward."""
    from warpdecode.runtime import onnxruntime as onnxruntime_backend

    monkeypatch.setattr(onnxruntime_backend, "PREFILL_CHUNK", 4)
    monkeypatch.setattr(onnxruntime_backend, "COPY_PREFIX_ROWS", 3)
    ort, reference = backbones
    caches = [KVCache.for_model(reference.config, 2, 40) for _ in range(2)]
    prompt, more = torch.randint(0, 64, (2, 11)), torch.randint(0, 64, (2, 9))
    outs = []
    with torch.inference_mode():
        for model, cache in zip((ort, reference), caches, strict=True):
            first = model(prompt, cache=cache, hidden_layers=(1, 3), logits_slice=slice(-3, None))
            cache.truncate([11, 7])
            second = model(more, cache=cache, hidden_layers=(3,))
            outs.append((first, second))
    for ours, theirs in zip(*outs, strict=True):
        torch.testing.assert_close(ours.logits, theirs.logits, **TOL)
        for layer, states in theirs.hidden_states.items():
            torch.testing.assert_close(ours.hidden_states[layer], states, **TOL)
    assert outs[0][0].logits.shape == (2, 3, 64)
    torch.testing.assert_close(caches[0].k[:, :, :, :20], caches[1].k[:, :, :, :20], **TOL)
