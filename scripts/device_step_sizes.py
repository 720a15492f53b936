"""What one step of the device-resident speculative step costs under CUDA graphs, against the engine's
plain step under graphs, at the shapes of real models with random weights (`--model random:NAME`'s shapes) (a step's time does not
depend on the weights' values; acceptance does, and is taken from real runs: τ below).

    PYTHONUNBUFFERED=1 PYTHONPATH=. python scripts/device_step_sizes.py --out runs/device-step-sizes \
        --sizes smollm2-135m,llama3.2-1b,llama3.1-8b --dtypes bf16,fp32
    PYTHONPATH=. python scripts/device_step_sizes.py --device cpu --sizes smollm2-135m --dtypes fp32 --steps 4  # dry run

Per (size, precision): the device copy bandwidth (the floor of a step is reading the weights once);
the engine's plain step (`none` on the `cudagraphs` backend: host loop, one replay and one host read per
token); then for each device method the replay of one captured step (`replay ms`, `done` forced on so
the state stays put: the same kernels run) and the host loop of the device step (`loop ms`: replays plus
the host's read of `done` after each). Predicted speedup over the engine's plain step at τ tokens per
forward = τ x plain ms / loop ms; the oracle rows measure it end to end (a 16-node tree whose first
path the oracle verifier accepts at τ 2.4 and 3.5, `run_device(oracle=...)`). Writes `sizes.jsonl` under --out and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from warpdecode.decoding.device_step import graphs
from warpdecode.decoding.device_step.loop import device_form, run_device
from warpdecode.decoding.device_step.oracle import DeviceOracle
from warpdecode.decoding.device_step.prompt_lookup import DevicePromptLookup
from warpdecode.decoding.device_step.state import DeviceDrafter, forward_rows
from warpdecode.decoding.engine import run
from warpdecode.decoding.generate import build_method
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.decoding.specs import parse_method
from warpdecode.decoding.verifiers.oracle import accept_for_tau
from warpdecode.models.random_shapes import PREFIX, random_model
from warpdecode.models.transformer import Transformer
from warpdecode.runtime.cudagraphs import CudaGraphBackbone

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
METHODS = ["plain (device step, no draft)", "prompt_lookup", "token_recycling", "token_recycling:num_nodes=16",
           "token_recycling:num_nodes=32"]
ORACLE_TAUS = (2.4, 3.5)
"""τ the oracle pair runs at (`run_device(oracle=...)`), measured end to end."""
TAU = {"prompt_lookup": 1.38, "token_recycling": 1.41, "τ 2.4": 2.4, "τ 3.5": 3.5}
"""Tokens per forward: the first two measured on Spec-Bench with the default model (docs/benchmarks.md),
the others what a stronger drafter reaches (EAGLE-class)."""


def weight_bytes_read(model: Transformer) -> int:
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if model.lm_head is not None:  # untied: the input embedding is read one row per token
        total -= model.embed.weight.numel() * model.embed.weight.element_size()
    return total


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def copy_bandwidth(device: str) -> float:
    """Bytes per second of a device-to-device copy (read + write counted), 1 GiB each way."""
    if not device.startswith("cuda"):
        return float("nan")
    a = torch.empty(1 << 28, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    sync(device)
    start = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    sync(device)
    return 2 * a.numel() * 4 * 10 / (time.perf_counter() - start)


def drafter_of(spec: str) -> DeviceDrafter:
    if spec.startswith("plain"):
        return DevicePromptLookup(num_tokens=0)
    return device_form(parse_method(spec).build(do_sample=False).drafter)


def timed_replays(session: graphs.StepSession, steps: int, device: str) -> float:
    """Seconds per `session.run()` with `done` forced on (every kernel runs; nothing advances)."""
    session.state.done.fill_(True)
    session.run()
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        session.run()
    sync(device)
    return (time.perf_counter() - start) / steps


def measure(size: str, dtype_name: str, args: argparse.Namespace, out: Path) -> list[dict]:
    model = random_model(PREFIX + size, device=torch.device(args.device), dtype=DTYPES[dtype_name])
    backbone = CudaGraphBackbone(model, graphs=args.device.startswith("cuda"))
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(model.config.vocab_size, (args.prompt_tokens,), generator=generator).tolist()
    greedy = Sampler(SamplingConfig())
    bandwidth = copy_bandwidth(args.device)
    run(backbone, prompt, build_method("none"), greedy, max_new_tokens=8, stop_ids=set())  # capture
    sync(args.device)
    _, _, stats = run(backbone, prompt, build_method("none"), greedy, max_new_tokens=args.steps, stop_ids=set())
    plain_ms = 1000 * stats.target_seconds / stats.target_forwards
    weights = weight_bytes_read(model)
    rows = [{"size": size, "dtype": dtype_name, "method": "none (engine)", "width": 1, "replay_ms": None,
             "loop_ms": plain_ms, "vs_plain": 1.0, "weight_bytes": weights, "copy_TBps": bandwidth / 1e12,
             "bandwidth_share": weights / (plain_ms / 1000) / bandwidth}]
    for spec in METHODS:
        drafter = drafter_of(spec)
        run_device(backbone, prompt, drafter, max_new_tokens=8, stop_ids=set())  # makes the session, captures
        session = next(reversed(graphs._SESSIONS[backbone].values()))
        _, _, dstats = run_device(backbone, prompt, drafter, max_new_tokens=args.steps, stop_ids=set())
        loop_ms = 1000 * dstats.target_seconds / dstats.target_forwards
        replay_ms = 1000 * timed_replays(session, args.steps, args.device)
        row = {"size": size, "dtype": dtype_name, "method": spec, "width": forward_rows(drafter),
               "replay_ms": replay_ms, "loop_ms": loop_ms, "vs_plain": loop_ms / plain_ms,
               "captures": session.captures}
        for name, tau in TAU.items():
            row[f"speedup@{name}"] = tau * plain_ms / loop_ms
        rows.append(row)
    for tau in ORACLE_TAUS:  # measured end to end: the oracle pair accepts at τ (random weights accept nothing)
        drafter = DeviceOracle(num_tokens=4, width=13)  # 16 nodes: a chain of 4 and 12 siblings of its first
        oracle = (accept_for_tau(tau, 4), 0)
        run_device(backbone, prompt, drafter, max_new_tokens=8, stop_ids=set(), oracle=oracle)
        _, _, ostats = run_device(backbone, prompt, drafter, max_new_tokens=3 * args.steps, stop_ids=set(),
                                  oracle=oracle)
        loop_ms = 1000 * ostats.target_seconds / ostats.target_forwards
        measured_tau = ostats.new_tokens / ostats.target_forwards
        rows.append({"size": size, "dtype": dtype_name, "method": f"oracle, 16 nodes, τ {tau}",
                     "width": forward_rows(drafter), "replay_ms": None, "loop_ms": loop_ms, "vs_plain": loop_ms / plain_ms,
                     "captures": None, "tau": measured_tau,
                     "measured_speedup": (ostats.new_tokens / ostats.target_seconds) / (1000 / plain_ms)})
    with (out / "sizes.jsonl").open("a") as f:
        for row in rows:
            print(json.dumps(row), flush=True)
            f.write(json.dumps(row) + "\n")
    del backbone, model
    graphs._SESSIONS.clear()
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return rows


def fmt(x: float | None, spec: str = ".2f") -> str:
    return "–" if x is None else format(x, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sizes", default="smollm2-135m,llama3.2-1b,llama3.1-8b")
    parser.add_argument("--dtypes", default="bf16")
    parser.add_argument("--steps", type=int, default=100, help="steps timed per row")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--out", default="runs/device-step-sizes")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    with torch.inference_mode():
        for size in args.sizes.split(","):
            for dtype_name in args.dtypes.split(","):
                rows += measure(size, dtype_name, args, out)
    taus = list(TAU)
    print("\n| shape | dtype | method | width | replay ms | loop ms | vs plain step | "
          + " | ".join(f"speedup @ {t}" for t in taus) + " |")
    print("|---|---|---|---:|---:|---:|---:|" + "---:|" * len(taus))
    for r in rows:
        extra = (f"measured: τ {r['tau']:.2f}, {r['measured_speedup']:.2f}x" + " |" * (len(taus) - 1)
                 if "measured_speedup" in r else
                 " | ".join(fmt(r.get(f"speedup@{t}"), ".2f") + "x" for t in taus) if "captures" in r else
                 f"plain reads weights at {100 * r['bandwidth_share']:.0f} % of {r['copy_TBps']:.2f} TB/s"
                 + " |" * (len(taus) - 1))
        print(f"| {r['size']} | {r['dtype']} | {r['method']} | {r['width']} | {fmt(r['replay_ms'])} | "
              f"{r['loop_ms']:.2f} | {r['vs_plain']:.2f}x | {extra} |")


if __name__ == "__main__":
    main()
