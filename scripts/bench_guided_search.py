"""Reward-guided search and superposed decoding measured on Spec-Bench prompts (docs/notes/guided-search.md).

`deal`: greedy vs DeAL (a keyword reward, or a length target) vs best-of-N with the same reward at about DeAL's tokens (n =
DeAL's search tokens / greedy's tokens on the prompt, sampled at `--temperature`): the mean reward (fraction
of the keywords in the answer, or minus the relative distance to the length target), tokens spent, target
forwards, seconds.

`superposed`: superposed decoding (k drafts, one forward per step) vs k samples (one batch of k rows,
nucleus sampling) vs greedy, interleaved per prompt: distinct-1/2 and self-BLEU of the k texts (words), the
mean target log-probability per token of the candidates (read once, cache-free), tokens the target
processed (rows x steps), forwards and wall time.

`transfer_q`: greedy vs Transfer Q* with a second model as Q (same tokenizer): the second model's mean
log-probability per token of each answer (what Q* steers towards), tokens, forwards, seconds; with
`--q-model keywords`, Q is the keyword reward of a prompt word greedy's answer lacks.

    python scripts/bench_guided_search.py deal --prompts 8 --max-new-tokens 48 --keywords example,important
    python scripts/bench_guided_search.py superposed --k 3 --prompts 8 --max-new-tokens 32
    python scripts/bench_guided_search.py transfer_q --model qwen2.5-coder-0.5b-instruct \
        --q-model qwen2.5-coder-1.5b-instruct --prompts 4 --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import torch

from warpdecode.bench.prompts import load_prompts
from warpdecode.decoding import registry
from warpdecode.decoding.generate import encode_prompt, generate
from warpdecode.decoding.outputs import Candidate
from warpdecode.decoding.search.rewards import ModelScorer
from warpdecode.decoding.search.scorers import LengthTargetScorer, Scorer, keyword_scorer
from warpdecode.metrics.open_ended import DistinctN, SelfBLEU, WordIds
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.named import DEFAULT_MODEL


def spec_prompts(count: int) -> list[Any]:
    """`count` Spec-Bench prompts, one per category in turn."""
    by_category = load_prompts("spec_bench", limit=(count + 5) // 6)
    order = sorted(range(len(by_category)), key=lambda i: (i % max(1, (count + 5) // 6), i))
    return [by_category[i] for i in order][:count]


def row(name: str, values: dict[str, list[float]]) -> str:
    return f"{name:>12}: " + "  ".join(f"{k} {statistics.mean(v):8.3f}" for k, v in values.items())


def prompt_keyword(prompt: str, answer: str) -> str | None:
    """The first word of 6+ letters of the prompt that the answer lacks (a "mention X" constraint)."""
    words = [w.strip(".,;:?!()\"'").lower() for w in prompt.split()]
    return next((w for w in words if len(w) >= 6 and w.isalpha() and w not in answer.lower()), None)


def deal(model: Any, tokenizer: Any, args: argparse.Namespace) -> None:
    prompts = spec_prompts(args.prompts)
    runs: dict[str, dict[str, list[float]]] = {}

    def record(name: str, out: Any, reward: Scorer) -> None:
        r = reward.score([], [Candidate(out.token_ids, out.finish_reason, text=out.text)])[0]
        spent = out.stats.search_tokens or out.stats.new_tokens
        for key, value in (("reward", r), ("tokens", spent), ("forwards", out.stats.target_forwards),
                           ("seconds", out.stats.seconds)):
            runs.setdefault(name, {}).setdefault(key, []).append(value)

    for i, p in enumerate(prompts):
        greedy = generate(model, tokenizer, p.text, chat=p.chat, max_new_tokens=args.max_new_tokens)
        keywords = prompt_keyword(p.text, greedy.text) if args.keywords == "from-prompt" else args.keywords
        if keywords is None:
            continue
        reward: Scorer = keyword_scorer(keywords.split(","))
        options: dict[str, Any] = {"keywords": keywords}
        if args.target_length:
            reward = LengthTargetScorer(args.target_length)
            options = {"reward": "length", "target_length": args.target_length}
        record("greedy", greedy, reward)
        search = registry.build("search", "deal", num_beams=args.num_beams, top_k=args.top_k,
                                lookahead=args.lookahead, reward_weight=args.reward_weight, **options)
        record("deal", generate(model, tokenizer, p.text, chat=p.chat, max_new_tokens=args.max_new_tokens,
                                search=search), reward)
        n = max(1, round(runs["deal"]["tokens"][-1] / max(1, runs["greedy"]["tokens"][-1])))
        bon = registry.build("search", "best_of_n", n=n, scorer=reward)
        record("best_of_n", generate(model, tokenizer, p.text, chat=p.chat, max_new_tokens=args.max_new_tokens,
                                     do_sample=True, temperature=args.temperature, seed=i, search=bon), reward)
        print(f"p{i} {keywords} n={n} " + "  ".join(f"{k} r={v['reward'][-1]:.2f} t={v['tokens'][-1]}"
                                                   for k, v in runs.items()), flush=True)
    for name, values in runs.items():
        print(row(name, values))


def superposed(model: Any, tokenizer: Any, args: argparse.Namespace) -> None:
    prompts = spec_prompts(args.prompts)
    scorer = ModelScorer(model, mean=True)
    runs: dict[str, dict[str, list[float]]] = {}
    k = args.k
    methods = {"superposed": {"search": registry.build("search", "superposed", k=k, ngram=args.ngram,
                                                      ngram_weight=args.ngram_weight)},
               "samples": {"search": registry.build("search", "sample", n=k), "do_sample": True,
                           "temperature": 1.0, "top_p": args.top_p},
               "greedy": {}}
    for i, p in enumerate(prompts):
        ids = encode_prompt(tokenizer, p.text, chat=p.chat)
        for name, options in methods.items():
            seeded = {"seed": i} if options.get("do_sample") else {}
            out = generate(model, tokenizer, p.text, chat=p.chat, max_new_tokens=args.max_new_tokens, **options,
                           **seeded)
            texts = [s.text for s in out.sequences] if out.sequences else [out.text]
            cands = out.sequences or [Candidate(out.token_ids, out.finish_reason, text=out.text)]
            words = WordIds()
            values = {"logprob/tok": statistics.mean(scorer.score(ids, [c for c in cands if c.token_ids]))}
            if len(texts) > 1:
                for n in (1, 2):
                    metric = DistinctN(n)
                    metric.update([words(t) for t in texts])
                    values[f"distinct-{n}"] = float(metric.compute())
                bleu = SelfBLEU(2)
                bleu.update([words(t) for t in texts])
                values["self-bleu2"] = float(bleu.compute())
            rows = out.stats.search_tokens or out.stats.new_tokens
            values.update({"tokens": rows, "forwards": out.stats.target_forwards, "seconds": out.stats.seconds})
            for key, value in values.items():
                runs.setdefault(name, {}).setdefault(key, []).append(value)
        print(f"p{i} " + "  ".join(f"{name} {v['seconds'][-1]:.2f}s" for name, v in runs.items()), flush=True)
    for name, values in runs.items():
        print(row(name, values))
    ratio = sum(runs["superposed"]["seconds"]) / sum(runs["samples"]["seconds"])
    print(f"superposed k={k} took {ratio:.2f}x the wall time of {k} samples (one batch)")


def transfer_q(model: Any, tokenizer: Any, args: argparse.Namespace) -> None:
    """With `--q-model keywords`, Q is the keyword reward of a prompt word greedy's answer lacks (reward: is
    it in the answer); else Q is the second model's log-probability (reward: its mean per token)."""
    prompts = spec_prompts(args.prompts)
    runs: dict[str, dict[str, list[float]]] = {}
    second = None if args.q_model == "keywords" else load_pretrained(
        args.q_model, dtype=torch.bfloat16 if args.q_bf16 else torch.float32)[0]
    for i, p in enumerate(prompts):
        ids = encode_prompt(tokenizer, p.text, chat=p.chat)
        greedy = generate(model, tokenizer, p.text, chat=p.chat, max_new_tokens=args.max_new_tokens)
        if second is None:
            word = prompt_keyword(p.text, greedy.text)
            if word is None:
                continue
            judge: Scorer = keyword_scorer([word])
            search = registry.build("search", "transfer_q", top_k=args.top_k, alpha=args.alpha, rollout=args.rollout,
                                    reward="keywords", keywords=word)
        else:
            judge = ModelScorer(second, mean=True)
            search = registry.build("search", "transfer_q", top_k=args.top_k, alpha=args.alpha, rollout=args.rollout,
                                    reward=ModelScorer(second))
        guided = generate(model, tokenizer, p.text, chat=p.chat, max_new_tokens=args.max_new_tokens, search=search)
        for name, out in (("greedy", greedy), ("transfer_q", guided)):
            r = judge.score(ids, [Candidate(out.token_ids, out.finish_reason, text=out.text)])[0]
            spent = out.stats.search_tokens or out.stats.new_tokens
            for key, value in (("reward", r), ("tokens", spent), ("forwards", out.stats.target_forwards),
                               ("seconds", out.stats.seconds)):
                runs.setdefault(name, {}).setdefault(key, []).append(value)
        print(f"p{i} " + "  ".join(f"{n} r={v['reward'][-1]:.3f}" for n, v in runs.items()), flush=True)
    for name, values in runs.items():
        print(row(name, values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("strategy", choices=("deal", "superposed", "transfer_q"))
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--keywords", default="example,important",
                        help="deal: the reward's keywords, or from-prompt: per prompt, a word of it greedy's answer lacks")
    parser.add_argument("--target-length", type=int, default=0, help="deal: a length reward (new tokens) instead")
    parser.add_argument("--num-beams", type=int, default=2)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--lookahead", type=int, default=2)
    parser.add_argument("--reward-weight", type=float, default=2.0)
    parser.add_argument("--temperature", type=float, default=0.8, help="deal: best-of-N's sampling temperature")
    parser.add_argument("--k", type=int, default=3, help="superposed: drafts (and samples)")
    parser.add_argument("--ngram", type=int, default=3)
    parser.add_argument("--ngram-weight", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=0.9, help="superposed: the samples' nucleus")
    parser.add_argument("--q-model", default="qwen2.5-coder-1.5b-instruct", help="transfer_q: the model Q reads, or keywords")
    parser.add_argument("--q-bf16", action="store_true", help="transfer_q: load the Q model in bf16 (half the memory)")
    parser.add_argument("--alpha", type=float, default=1.0)
    parser.add_argument("--rollout", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    model, tokenizer = load_pretrained(args.model)
    {"deal": deal, "superposed": superposed, "transfer_q": transfer_q}[args.strategy](model, tokenizer, args)


if __name__ == "__main__":
    main()
