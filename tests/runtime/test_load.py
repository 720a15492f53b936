"""`runtime.load`: one loader for generate and bench, (model | package) x backends."""

from __future__ import annotations

import pytest

from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.runtime.cudagraphs import CudaGraphBackbone
from warpdecode.runtime.load import load_backbones, parse_backends
from warpdecode.runtime.package import InferencePackage


def test_a_models_backends_share_one_loaded_model(tiny_model_dir, monkeypatch):
    from warpdecode.runtime import load

    monkeypatch.setattr(load, "CudaGraphBackbone", lambda model: CudaGraphBackbone(model, graphs=False))  # CPU stand-in
    backbones, tokenizer = load_backbones(str(tiny_model_dir), None, ["torch", "cudagraphs"])
    assert isinstance(backbones["cudagraphs"], CudaGraphBackbone) and backbones["cudagraphs"].model is backbones["torch"]
    assert tokenizer is not None


def test_a_package_opens_each_backend(tiny_package):
    package = InferencePackage.load(tiny_package)
    backbones, tokenizer = load_backbones(None, package, ["torch", "onnxruntime-portable"])
    assert set(backbones) == {"torch", "onnxruntime-portable"} and tokenizer is None  # exported without one
    assert backbones["torch"].fingerprint() == backbones["onnxruntime-portable"].fingerprint() == package.fingerprint


@pytest.mark.parametrize(("model", "with_package", "backends", "dtype", "error", "message"), [
    ("tiny", False, ["onnxruntime"], "fp32", ConfigError, "--backend onnxruntime runs an exported package"),
    ("tiny", True, ["torch"], "fp32", ConfigError, "give --model or --package, not both"),
    (None, True, ["cudagraphs"], "fp32", ConfigError, "--backend cudagraphs runs --model on --device cuda"),
    (None, True, ["torch"], "bf16", CapabilityError, "a package runs in the precision it was exported in"),
    ("tiny", False, ["torch"], "fp8", ConfigError, "--dtype must be one of fp32, bf16, fp16"),
    ("tiny", False, ["bogus"], "fp32", ConfigError, "unknown backend 'bogus'; choose from torch, cudagraphs"),
    (None, True, ["bogus"], "fp32", ConfigError, "unknown backend 'bogus'; choose from torch, cudagraphs"),
])
def test_combinations_that_cannot_run_are_refused_before_loading(model, with_package, backends, dtype, error, message,
                                                                 tiny_model_dir, tiny_package):
    package = InferencePackage.load(tiny_package) if with_package else None
    with pytest.raises(error, match=message):
        load_backbones(str(tiny_model_dir) if model else None, package, backends, dtype=dtype)


def test_parse_backends():
    assert parse_backends("torch, cudagraphs,torch") == ["torch", "cudagraphs"]
    with pytest.raises(ConfigError, match="--backends must list some of torch, onnxruntime"):
        parse_backends("torch,bogus")
