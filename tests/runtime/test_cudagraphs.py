"""The cudagraphs backend's static step, run eagerly on the CPU (`graphs=False`): the padded, masked
forward over the whole cache must equal the model's own forward, and every drafter must decode the
same tokens through it. Capture and replay themselves run in tests/decoding/test_cuda.py."""

import pytest
import torch
from tiny_models import greedy_target, naive_greedy

from warpdecode.decoding import registry
from warpdecode.decoding.generate import build_method, generate
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.models.cache import KVCache
from warpdecode.runtime.cudagraphs import CudaGraphBackbone, padded_mask, padded_width

pytestmark = pytest.mark.usefixtures("single_thread")

TREE_MASK = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]],
                         dtype=torch.bool)[None]  # (1, 5, 5): pending token, two children, a grandchild each


@pytest.fixture(scope="module")
def target():
    return greedy_target()


def prefilled(model, prompt, max_len=48) -> KVCache:
    cache = KVCache.for_model(model.config, 1, max_len)
    with torch.inference_mode():
        model(torch.tensor([prompt]), cache=cache)
    return cache


def test_padded_width_and_mask():
    assert [padded_width(t) for t in (1, 2, 3, 5, 64)] == [1, 2, 4, 8, 64]
    assert padded_width(65) is None
    mask = padded_mask(TREE_MASK, 8)
    assert mask.shape == (1, 8, 8)
    assert torch.equal(mask[:, :5, :5], TREE_MASK)
    assert not mask[:, :5, 5:].any()  # real rows never see padding
    assert torch.equal(mask[0, 5:, 5:], torch.eye(3, dtype=torch.bool)) and not mask[0, 5:, :5].any()


def test_static_tree_forward_matches_the_model(target):
    """Logits, hidden states and the cache after a padded tree forward equal the model's own forward."""
    prompt = list(range(3, 12))
    reference_cache, cache = prefilled(target, prompt), prefilled(target, prompt)
    tokens, positions = torch.tensor([[4, 9, 17, 2, 30]]), torch.tensor([[9, 10, 10, 11, 11]])
    with torch.inference_mode():
        expected = target(tokens, positions, reference_cache, TREE_MASK, hidden_layers=(0, 3))
    out = CudaGraphBackbone(target, graphs=False)(tokens, positions, cache, TREE_MASK, hidden_layers=(0, 3))
    assert out.logits.shape == expected.logits.shape == (1, 5, 64)
    torch.testing.assert_close(out.logits, expected.logits, atol=1e-5, rtol=1e-5)
    for layer in (0, 3):
        torch.testing.assert_close(out.hidden_states[layer], expected.hidden_states[layer], atol=1e-5, rtol=1e-5)
    assert cache.lengths.tolist() == reference_cache.lengths.tolist() == [14]
    torch.testing.assert_close(cache.k[:, :, :, :14], reference_cache.k[:, :, :, :14], atol=1e-5, rtol=1e-5)


def test_what_cannot_be_static_runs_eagerly(target):
    """Prefill (logits_slice), batches and forwards past the cache's end take the model's own path."""
    backbone = CudaGraphBackbone(target, graphs=False)
    cache = KVCache.for_model(target.config, 1, 12)
    out = backbone(torch.tensor([list(range(1, 11))]), cache=cache, logits_slice=slice(-1, None))
    assert out.logits.shape == (1, 1, 64) and cache.lengths.tolist() == [10]
    out = backbone(torch.tensor([[5, 6]]), cache=cache)  # 10 + width 2 fits: static
    assert out.logits.shape == (1, 2, 64) and cache.lengths.tolist() == [12]
    assert len(backbone._steps) == 1
    cache.truncate(9)
    out = backbone(torch.tensor([[5, 6, 7]]), cache=cache)  # width 4 would pass slot 12: eager
    assert out.logits.shape == (1, 3, 64) and cache.lengths.tolist() == [12]
    assert len(backbone._steps) == 1
    batch = KVCache.for_model(target.config, 2, 12)
    assert backbone(torch.tensor([[1, 2], [3, 4]]), cache=batch).logits.shape == (2, 2, 64)
    assert len(backbone._steps) == 1


def test_steps_are_reused_and_bounded(target):
    backbone = CudaGraphBackbone(target, graphs=False, max_graphs=2)
    cache = prefilled(target, [1, 2, 3])
    for tokens in ([[4]], [[5]], [[6, 7]], [[8, 9, 10]]):
        backbone(torch.tensor(tokens), cache=cache)
    assert [key.width for key in backbone._steps] == [2, 4]  # width 1 was used first and dropped


def test_graphs_need_a_cuda_model(target):
    with pytest.raises(CapabilityError, match="CUDA"):
        CudaGraphBackbone(target)


@pytest.mark.parametrize("name", registry.names("drafter"))
def test_every_drafter_decodes_the_same_tokens_through_the_static_step(target, name, drafter_options):
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    backbone = CudaGraphBackbone(target, graphs=False)
    out = generate(backbone, None, prompt, max_new_tokens=24, stop_at_eos=False,
                   method=build_method(name, options=drafter_options.get(name, {})))
    assert out.token_ids == naive_greedy(target, prompt, 24)
    assert backbone._steps  # the decode loop went through the static step


def test_new_cache_hands_out_one_buffer_per_size_class(target):
    backbone = CudaGraphBackbone(target, graphs=False)
    first = backbone.new_cache(1, 40)
    first.lengths[:] = 7
    again = backbone.new_cache(1, 100)
    assert again is first and first.lengths.tolist() == [0] and first.max_len == 256  # = max_seq_len here
    assert backbone.new_cache(2, 40) is not first
    with pytest.raises(ConfigError, match="exceeds the model's context"):
        backbone.new_cache(1, 300)


def test_later_generations_reuse_the_captured_steps(target):
    backbone = CudaGraphBackbone(target, graphs=False)
    method = build_method("prompt_lookup")
    outputs = [generate(backbone, None, prompt, max_new_tokens=16, stop_at_eos=False, method=method).token_ids
               for prompt in ([5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8])]
    steps = dict(backbone._steps)
    assert outputs[1] == naive_greedy(target, [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8], 16)
    generate(backbone, None, [5, 6, 7, 8, 5, 6, 7, 8, 5, 6], max_new_tokens=16, stop_at_eos=False, method=method)
    assert backbone._steps.keys() == steps.keys()  # no new step: same buffers, same widths
