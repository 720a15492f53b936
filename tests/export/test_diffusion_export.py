"""A masked diffusion LM exported as an inference package decodes the same on ONNX Runtime as in PyTorch,
with and without KV reuse."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from warpdecode.decoding.diffusion.decoder import diffusion_generate
from warpdecode.decoding.diffusion.policies.fixed import FixedCommit
from warpdecode.decoding.diffusion.policies.threshold import ThresholdCommit
from warpdecode.export.package import export_package
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.runtime.package import InferencePackage

pytestmark = pytest.mark.usefixtures("single_thread")


def test_a_diffusion_package_decodes_identically_on_onnxruntime(dlm_dir: Path, tmp_path: Path) -> None:
    model, tokenizer = load_pretrained(dlm_dir)
    export_package(model, tokenizer, tmp_path / "pkg", source=str(dlm_dir))
    package = InferencePackage.load(tmp_path / "pkg")
    ort = package.backbone("onnxruntime", threads=1)
    assert package.manifest["backbone"]["fused_graph"] is None and not ort.fused
    assert package.manifest["backbone"]["fused_graph_unsupported"] == "bidirectional attention"
    assert ort.config.causal is False and ort.config.mask_token_id == model.config.mask_token_id
    prompts = [tokenizer.encode("copy:abc="), tokenizer.encode("sort:3918=")]
    with torch.inference_mode():
        logits = ort(torch.tensor([prompts[0]]), attention_mask=torch.ones(1, 9, 9, dtype=torch.bool)).logits
        torch.testing.assert_close(logits, model(torch.tensor([prompts[0]])).logits, atol=1e-4, rtol=1e-4)
    for policy in (FixedCommit(1), ThresholdCommit(0.5)):
        for kv_cache in ("none", "dual"):
            options = {"gen_length": 14, "block_length": 7, "eos_token_id": tokenizer.eos_token_id, "kv_cache": kv_cache}
            on_torch = diffusion_generate(model, prompts, policy, **options)
            on_ort = diffusion_generate(ort, prompts, policy, **options)
            assert torch.equal(on_ort.sequences, on_torch.sequences)
            assert on_ort.stats.steps == on_torch.stats.steps


def test_bench_sends_a_diffusion_package_to_its_model_directory(dlm_dir: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from warpdecode.cli import main

    model, tokenizer = load_pretrained(dlm_dir)
    export_package(model, tokenizer, tmp_path / "pkg", source=str(dlm_dir))
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--package", str(tmp_path / "pkg"), "--out", str(tmp_path / "b")])
    assert exit_info.value.code == 2 and "masked diffusion LM" in capsys.readouterr().err
