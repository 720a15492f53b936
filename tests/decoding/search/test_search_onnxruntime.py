"""Search strategies run on any backend behind the Backbone protocol: the exported package on ONNX Runtime
gives the beams and samples of the PyTorch backend."""

import pytest

from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.decoding.search.beam import BeamSearch
from warpdecode.decoding.search.diverse_beam import DiverseBeamSearch
from warpdecode.decoding.search.sample import MultiSample
from warpdecode.runtime.package import InferencePackage

pytestmark = pytest.mark.usefixtures("single_thread")
pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("backend", ["onnxruntime", "onnxruntime-portable"])
def test_onnxruntime_gives_the_torch_beams(tiny_package, backend):
    package = InferencePackage.load(tiny_package)
    ort, reference = package.backbone(backend, threads=1), package.backbone("torch")
    prompt = [3, 14, 15, 9, 26, 5]
    for search, sampler in ((BeamSearch(num_beams=4, num_return_sequences=3, no_repeat_ngram_size=2), SamplingConfig()),
                            (DiverseBeamSearch(num_beams=4, num_beam_groups=2, num_return_sequences=2), SamplingConfig()),
                            (MultiSample(n=3), SamplingConfig(do_sample=True, seed=5, top_k=2))):
        ours, ref = (search.search(model, None, prompt, Sampler(sampler), max_new_tokens=10, stop_ids={7})
                     for model in (ort, reference))
        assert [c.token_ids for c in ours.candidates] == [c.token_ids for c in ref.candidates], search.name
