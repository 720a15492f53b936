"""The device step on the `cudagraphs` backend: buffers reused across requests (`graphs.StepSession`),
the warm-up that capturing needs changes nothing the host reads, and (on a CUDA device) the captured
step decodes what plain greedy decoding decodes, with the engine's accepted lengths."""

from __future__ import annotations

import pytest
import torch
from tiny_models import greedy_target, ppd_package
from torch.utils._python_dispatch import TorchDispatchMode

from warpdecode.decoding.device_step import graphs
from warpdecode.decoding.device_step.loop import device_form, run_device
from warpdecode.decoding.engine import run
from warpdecode.decoding.generate import build_method
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.decoding.specs import parse_method
from warpdecode.runtime.cudagraphs import CudaGraphBackbone

METHODS = ["prompt_lookup", "token_recycling"]
REQUESTS = [  # (prompt, max_new_tokens, stop index in the plain output or None)
    ([1, 2, 3, 4, 1, 2, 3, 4, 1, 2], 48, None),
    ([5], 5, None),
    ([9, 8, 7, 9, 8, 7, 9, 8, 7, 9, 8, 7, 9, 8], 40, 17),
    (list(range(40, 64)), 30, 0),
    ([1, 2, 3, 4, 1, 2, 3, 4, 1, 2], 1, None),
]


@pytest.fixture(scope="module")
def ppd(tmp_path_factory) -> str:
    """A PPD package for `greedy_target()`: its prompt rows ride in the verify forward."""
    return ppd_package(greedy_target(), tmp_path_factory.mktemp("ppd") / "drafter")


def plain(target, ids: list[int], n: int, stop: set[int]) -> tuple[list[int], list[int]]:
    return run(target, ids, build_method("none"), Sampler(SamplingConfig()), max_new_tokens=n, stop_ids=stop)[0]


def check_requests(backbone: CudaGraphBackbone, model, method: str, read_every: int) -> None:
    host, device = (parse_method(method).build(do_sample=False) for _ in range(2))
    form = device_form(device.drafter)
    accepted = 0
    for ids, n, stop_at in REQUESTS:
        stop = set() if stop_at is None else {plain(model, ids, stop_at + 1, set())[stop_at]}
        want = plain(model, ids, n, stop)
        engine = run(model, ids, host, Sampler(SamplingConfig()), max_new_tokens=n, stop_ids=stop)
        new, finish, stats = run_device(backbone, ids, form, max_new_tokens=n, stop_ids=stop, read_every=read_every)
        assert new == want == engine[0]
        assert finish == engine[1]
        assert stats.accepted_per_step == engine[2].accepted_per_step
        assert stats.proposed_per_step == engine[2].proposed_per_step
        accepted += sum(stats.accepted_per_step)
    assert accepted >= 5  # the drafts were really used


@pytest.mark.parametrize("read_every", [1, 3])
@pytest.mark.parametrize("method", [*METHODS, "ppd:path={ppd}:num_nodes=3"])
def test_one_session_serves_request_after_request(method: str, read_every: int, ppd: str) -> None:
    """CPU stand-in (`graphs=False`): the same buffers, reset per request, for every prompt, budget and
    stop set of a size class; Token Recycling's matrix carries over as the engine's does, PPD's guesses
    start afresh."""
    model = greedy_target()
    backbone = CudaGraphBackbone(model, graphs=False)
    check_requests(backbone, model, method.format(ppd=ppd), read_every)
    sessions = graphs._SESSIONS[backbone]
    assert len(sessions) == 1  # every request fitted the smallest size class
    (key,) = sessions
    assert key.size == graphs.MIN_CACHE and key.stops == graphs.MIN_STOPS and key.read_every == read_every


def test_size_classes() -> None:
    assert graphs.size_class(10, 256, 4096) == 256
    assert graphs.size_class(257, 256, 4096) == 512
    assert graphs.size_class(4096, 256, 4096) == 4096
    assert graphs.size_class(5000, 256, 4200) == 5000  # past the ceiling: exactly what is needed
    assert graphs.size_class(9, 8, 9) == 9


@pytest.mark.parametrize("method", [*METHODS, "ppd:path={ppd}"])
def test_warm_up_changes_nothing_the_host_reads(method: str, ppd: str) -> None:
    """Capturing runs the step first; with `done` forced on those runs leave the request as it was
    (state, Token Recycling's real rows, PPD's guesses) and the cache's committed slots untouched."""
    model = greedy_target()
    backbone = CudaGraphBackbone(model, graphs=False)
    form = device_form(parse_method(method.format(ppd=ppd)).build(do_sample=False).drafter)
    ids = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    want = run_device(backbone, ids, form, max_new_tokens=20, stop_ids=set())  # fills the matrix, makes the session
    (steps,) = graphs._SESSIONS[backbone].values()
    with torch.inference_mode():
        out = model(torch.tensor([ids]), cache=steps.cache, logits_slice=slice(-1, None))
        steps.cache.truncate(0)
        model(torch.tensor([ids]), cache=steps.cache, logits_slice=slice(-1, None))
        steps.start(ids, out.logits[:, -1].argmax(-1), max_new_tokens=20, stop_ids=[])
        for _ in range(2):  # a request under way
            steps.step()
        s = steps.state
        before = {name: getattr(s, name).clone() for name in ("history", "length", "new", "done", "steps", "limit",
                                                              "accepted", "proposed")}
        length = int(s.length)
        cached = steps.cache.k[:, :, :, :length].clone(), steps.cache.v[:, :, :, :length].clone()
        matrix = getattr(form, "matrix", None)
        rows = matrix[:-1].clone() if matrix is not None else None
        guesses = [getattr(form, name).clone() for name in ("guesses", "depth") if hasattr(form, name)]
        steps.warm_up(runs=3)
        assert all(torch.equal(getattr(form, name), value) for name, value in zip(("guesses", "depth"), guesses))
        for name, value in before.items():
            assert torch.equal(getattr(s, name), value), name
        assert torch.equal(steps.cache.k[:, :, :, :length], cached[0])
        assert torch.equal(steps.cache.v[:, :, :, :length], cached[1])
        if rows is not None:
            assert torch.equal(matrix[:-1], rows)
        while not bool(s.done):
            steps.step()
        assert s.history[len(ids) : len(ids) + int(s.new)].tolist() == want[0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("read_every", [1, 4])
@pytest.mark.parametrize("method", METHODS)
def test_captured_step_on_cuda(method: str, read_every: int) -> None:
    model = greedy_target().to("cuda")
    backbone = CudaGraphBackbone(model)
    check_requests(backbone, model, method, read_every)
    (steps,) = graphs._SESSIONS[backbone].values()
    assert steps.captures == 1  # one graph replayed by every request


HOST_READS = {"_local_scalar_dense", "nonzero", "is_nonzero", "equal", "item", "unique", "_unique2"}
"""aten ops that hand a tensor's value to the host (`int(t)`, `t[t0]` with a 0-dim index, `bool(t)`,
...): a CUDA graph cannot capture them."""


class HostReads(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in HOST_READS:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("method", [*METHODS, "token_recycling:num_nodes=16", "ppd:path={ppd}",
                                    "ppd:path={ppd}:attach=1"])
def test_the_static_step_reads_nothing_on_the_host(method: str, ppd: str) -> None:
    """What capture needs, checked on the CPU: no op of a static step passes a value to the host."""
    model = greedy_target()
    backbone = CudaGraphBackbone(model, graphs=False)
    form = device_form(parse_method(method.format(ppd=ppd)).build(do_sample=False).drafter)
    ids = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    run_device(backbone, ids, form, max_new_tokens=12, stop_ids={7})
    (steps,) = graphs._SESSIONS[backbone].values()
    with torch.inference_mode():
        steps.cache.truncate(0)
        out = model(torch.tensor([ids]), cache=steps.cache, logits_slice=slice(-1, None))
        steps.start(ids, out.logits[:, -1].argmax(-1), max_new_tokens=12, stop_ids=[7])
        with HostReads() as reads:
            steps.step()
            steps.step()
    assert reads.seen == []
    with HostReads() as reads, torch.inference_mode():
        int(steps.state.length)  # the check sees a host read
    assert reads.seen


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_captured_medusa_and_sampling_on_cuda(tmp_path) -> None:
    """The captured step with a feature-reading drafter, and sampling under capture (the same tokens as
    the eager CPU step for a seed: counter-based draws)."""
    from tiny_models import heads_package

    cpu_model = greedy_target()
    package = heads_package(cpu_model, tmp_path / "drafter", "medusa", num_layers=2)
    model = greedy_target().to("cuda")
    backbone = CudaGraphBackbone(model)
    for ids, n, _ in REQUESTS:
        host = build_method("medusa", options={"path": package})
        engine = run(model, ids, host, Sampler(SamplingConfig()), max_new_tokens=n, stop_ids=set())
        form = device_form(build_method("medusa", options={"path": package}).drafter)
        new, _, stats = run_device(backbone, ids, form, max_new_tokens=n, stop_ids=set())
        assert new == engine[0] and stats.accepted_per_step == engine[2].accepted_per_step
    sampling = SamplingConfig(do_sample=True, temperature=0.8, top_p=0.9, seed=4)
    for method in METHODS:
        ids = REQUESTS[0][0]
        on_cpu = run_device(cpu_model, ids, device_form(build_method(method).drafter), max_new_tokens=32,
                            stop_ids=set(), sampling=sampling)[0]
        on_cuda = run_device(backbone, ids, device_form(build_method(method).drafter), max_new_tokens=32,
                             stop_ids=set(), sampling=sampling)[0]
        assert on_cuda[:8] == on_cpu[:8]  # the same draws (later tokens may part at a rounding near-tie)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("read_every", [1, 4])
def test_captured_ppd_on_cuda(read_every: int, ppd: str) -> None:
    """The captured step with PPD's prompt rows in the verify forward (input embeddings, never committed)."""
    model = greedy_target().to("cuda")
    backbone = CudaGraphBackbone(model)
    check_requests(backbone, model, f"ppd:path={ppd}", read_every)
    (steps,) = graphs._SESSIONS[backbone].values()
    assert steps.captures == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_captured_eagle_on_cuda(tmp_path) -> None:
    """The captured step with EAGLE's draft cache and pairs on the device (EAGLE-3's fused features)."""
    from tiny_models import eagle_package

    package = eagle_package(greedy_target(), tmp_path / "drafter", feature_layers=(1, 3))
    model = greedy_target().to("cuda")
    backbone = CudaGraphBackbone(model)
    form = device_form(build_method("eagle", options={"path": package}).drafter)
    for ids, n, _ in REQUESTS:
        engine = run(model, ids, build_method("eagle", options={"path": package}), Sampler(SamplingConfig()),
                     max_new_tokens=n, stop_ids=set())
        new, _, stats = run_device(backbone, ids, form, max_new_tokens=n, stop_ids=set())
        assert new == engine[0] and stats.accepted_per_step == engine[2].accepted_per_step
