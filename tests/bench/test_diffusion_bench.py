"""`warpdecode bench` on a masked diffusion LM: policies side by side against static decoding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from warpdecode.bench.diffusion import BASELINE, DiffusionBenchConfig, parse_policies, run_diffusion_bench
from warpdecode.cli import main
from warpdecode.errors import ConfigError


def test_policy_specs_put_the_baseline_first_and_fail_before_loading() -> None:
    specs = parse_policies("threshold:threshold=0.8:eot_stop=true,fixed")
    assert [s.label for s in specs] == ["fixed", "threshold:threshold=0.8:eot_stop=true"]
    assert specs[1].decoder_options(8) == {"block_length": 8, "eot_stop": True, "kv_cache": "none"}
    for bad, message in (("nope", "unknown commit_policy"), ("threshold:tau=1", "no option"),
                         ("fixed:kv_cache=full", "kv_cache must be one of"),
                         ("fixed:block_length=0", "block_length"), ("credit,credit", "twice")):
        with pytest.raises(ConfigError, match=message):
            parse_policies(bad)


def test_every_policy_decodes_every_example_and_is_compared_with_the_baseline(dlm_dir: Path, tmp_path: Path) -> None:
    config = DiffusionBenchConfig(model=str(dlm_dir), methods=["threshold:threshold=0.5,prophet:eot_stop=true,free_draft",
                                                                   "fixed:kv_cache=dual"],
                                  tasks="copy,add", limit=2, gen_length=14, block_length=7, threads=1)
    result = run_diffusion_bench(config, progress=False)
    assert [r.method for r in result.rows] == [BASELINE, "threshold:threshold=0.5", "prophet:eot_stop=true", "free_draft",
                                               "fixed:kv_cache=dual"]
    assert len(result.runs) == 4 * 5
    baseline = result.rows[0]
    assert baseline.lossless and baseline.step_reduction == 1.0 and baseline.accuracy_delta == 0.0
    assert baseline.identical == 4 and not result.rows[2].lossless  # eot_stop makes prophet (any policy) lossy
    assert baseline.steps == 14  # one token per step over the whole answer region
    for row in result.rows:
        runs = [r for r in result.runs if r.method == row.method]
        assert row.accuracy == 100 * sum(r.correct for r in runs) / 4
        assert row.steps == sum(r.steps for r in runs) / 4 <= 14
        assert row.step_reduction == pytest.approx(14 / row.steps)
    assert result.rows[3].lossless and result.rows[3].identical == 4  # FreeDave reproduces the baseline
    assert not result.rows[4].lossless and result.rows[4].steps == 14  # the cache approximates, steps unchanged
    assert set(result.per_task) == {"copy", "add"}
    assert 1 < result.answer_perplexity < float("inf")
    paths = result.write(tmp_path / "out")
    saved = json.loads(paths["json"].read_text())
    assert saved["config"]["methods"] == config.methods and len(saved["runs"]) == 20
    assert "| `free_draft` | yes |" in paths["markdown"].read_text()
    assert f"4 draws of the masking): {result.answer_perplexity:.3f}" in paths["markdown"].read_text()
    assert paths["plot"].stat().st_size > 1000


def test_the_cli_benches_a_diffusion_model_and_refuses_mismatched_sets(dlm_dir: Path, tmp_path: Path,
                                                                        tiny_model_dir: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    main(["bench", "--model", str(dlm_dir), "--methods", "threshold", "--categories", "fill", "--limit", "1",
          "--max-new-tokens", "14", "--threads", "1", "--out", str(tmp_path / "b")])
    out = capsys.readouterr().out
    assert "| `fixed` | yes |" in out and "| `threshold` | no |" in out
    for argv, message in ((["--model", str(dlm_dir), "--prompts", "spec_bench"], "parallel_bench, not"),
                          (["--model", str(tiny_model_dir), "--prompts", "parallel_bench"], "autoregressive")):
        with pytest.raises(SystemExit) as exit_info:
            main(["bench", *argv, "--out", str(tmp_path / "c")])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err


def test_the_answer_perplexity_of_a_uniform_model_is_its_vocabulary_size(dlm_dir: Path) -> None:
    """All-zero logits cost log V per masked token; the 1/t weighting makes the bound's expectation
    exactly log V per answer token, so the perplexity bound is V (up to Monte Carlo error)."""
    import torch

    from warpdecode.bench.diffusion import answer_perplexity
    from warpdecode.data.parallel_tasks import evaluation_set
    from warpdecode.models.checkpoint import load_pretrained

    model, tokenizer = load_pretrained(dlm_dir)
    torch.nn.init.zeros_(model.embed.weight)  # tied head: every logit 0
    V = model.config.vocab_size
    assert answer_perplexity(model, tokenizer, evaluation_set("all", per_task=40), 16) == pytest.approx(V, rel=0.05)

