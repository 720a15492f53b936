"""The exactness suite's greedy check and a sampling run for every drafter on a CUDA device (skipped
without one): tensors the loop creates must follow the target's device."""

import pytest
import torch
from tiny_models import greedy_target, naive_greedy

from warpdecode.decoding import registry
from warpdecode.decoding.generate import build_method, generate
from warpdecode.errors import CapabilityError

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CPU_ONLY = {"int4_self", "int8_self"}  # torch's weight-only int kernels are CPU kernels
PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], list(range(10, 40))]


@pytest.fixture(scope="module")
def target():
    return greedy_target().to("cuda")


@pytest.mark.parametrize("name", sorted(set(registry.names("drafter")) - CPU_ONLY))
@pytest.mark.parametrize("prompt", PROMPTS, ids=["repetitive", "long"])
def test_greedy_identity_on_cuda(target, name, prompt, drafter_options):
    out = generate(target, None, prompt, max_new_tokens=24, stop_at_eos=False,
                   method=build_method(name, options=drafter_options.get(name, {})))
    assert out.token_ids == naive_greedy(target, prompt, 24)


@pytest.mark.parametrize("name", sorted(set(registry.names("drafter")) - CPU_ONLY))
def test_sampling_runs_on_cuda_and_repeats_with_its_seed(target, name, drafter_options):
    def sample():
        return generate(target, None, PROMPTS[1], max_new_tokens=24, stop_at_eos=False, do_sample=True, seed=3,
                        method=build_method(name, options=drafter_options.get(name, {}), do_sample=True)).token_ids

    first = sample()
    assert len(first) == 24 and first == sample()


@pytest.mark.parametrize("name", sorted(CPU_ONLY))
def test_cpu_only_drafters_say_so(target, name):
    with pytest.raises(CapabilityError, match="CPU only"):
        generate(target, None, PROMPTS[1], max_new_tokens=4, method=build_method(name))


def test_spectr_draws_on_cuda(target):
    """SpecTr reads the drafts' distributions beside the target's: both on the target's device."""
    method = build_method("draft_model", options={"layers": 1, "num_tokens": 2, "top_k": 2}, verifier="spectr",
                          do_sample=True)
    out = generate(target, None, PROMPTS[1], max_new_tokens=16, stop_at_eos=False, do_sample=True, seed=1, method=method)
    assert len(out.token_ids) == 16


@pytest.mark.parametrize("name", sorted(set(registry.names("drafter")) - CPU_ONLY))
def test_greedy_identity_through_cuda_graphs(target, name, drafter_options):
    from warpdecode.runtime.cudagraphs import CudaGraphBackbone

    backbone = CudaGraphBackbone(target)
    out = generate(backbone, None, PROMPTS[0], max_new_tokens=24, stop_at_eos=False,
                   method=build_method(name, options=drafter_options.get(name, {})))
    assert out.token_ids == naive_greedy(target, PROMPTS[0], 24)
    assert backbone.captures > 0


def test_graph_replays_equal_the_eager_static_step(target):
    """Two steps through captured graphs give the logits the same static step gives eagerly."""
    from warpdecode.models.cache import KVCache
    from warpdecode.runtime.cudagraphs import CudaGraphBackbone

    outputs = []
    for graphs in (True, False):
        backbone, cache = CudaGraphBackbone(target, graphs=graphs), KVCache.for_model(target.config, 1, 32, device="cuda")
        backbone(torch.tensor([PROMPTS[1][:8]], device="cuda"), cache=cache, logits_slice=slice(-1, None))
        steps = [backbone(torch.tensor([[3]], device="cuda"), cache=cache).logits,
                 backbone(torch.tensor([[4, 5, 6]], device="cuda"), cache=cache).logits]
        outputs.append(steps)
    for graphed, eager in zip(*outputs, strict=True):
        torch.testing.assert_close(graphed, eager, atol=1e-5, rtol=1e-5)


def test_graphs_replay_across_generations(target):
    """The second generation on the same backend replays the first one's graphs: the engine's cache
    comes from `new_cache`, the same buffers each time."""
    from warpdecode.runtime.cudagraphs import CudaGraphBackbone

    backbone, method = CudaGraphBackbone(target), build_method("prompt_lookup")
    for prompt in PROMPTS:
        out = generate(backbone, None, prompt, max_new_tokens=24, stop_at_eos=False, method=method)
        assert out.token_ids == naive_greedy(target, prompt, 24)
    captured = backbone.captures
    generate(backbone, None, PROMPTS[0], max_new_tokens=24, stop_at_eos=False, method=method)
    assert backbone.captures == captured > 0


@pytest.fixture(scope="module")
def half_target():
    return greedy_target().to_precision(torch.bfloat16).to("cuda")


@pytest.mark.parametrize("backend", ["eager", "cudagraphs"])
@pytest.mark.parametrize("name", sorted(set(registry.names("drafter")) - CPU_ONLY))
def test_greedy_identity_in_bf16_on_cuda(half_target, backend, name, drafter_options):
    """bf16 on the GPU (`--dtype bf16`): every drafter reproduces plain greedy decoding in the same
    precision on the same backend (docs/metrics.md); learned drafters run from their fp32 packages."""
    from warpdecode.runtime.cudagraphs import CudaGraphBackbone

    target = CudaGraphBackbone(half_target) if backend == "cudagraphs" else half_target
    plain = generate(target, None, PROMPTS[1], max_new_tokens=24, stop_at_eos=False).token_ids
    out = generate(target, None, PROMPTS[1], max_new_tokens=24, stop_at_eos=False,
                   method=build_method(name, options=drafter_options.get(name, {})))
    assert out.token_ids == plain
