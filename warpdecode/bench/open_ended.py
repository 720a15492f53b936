"""Open-ended generation quality of models under decoding strategies, side by side.

The hyperfitting comparison (greedy on a hyperfitted model against top-p sampling on the original,
over long generations) and any other "is the text still good" question: each run (a model with a
decoding strategy) continues the same held-out document prefixes and is scored on

* diversity and repetition of the continuations, in whitespace words so that tokenizers compare:
  distinct-1/2/3, rep-4 (within-sequence repeated 4-grams), type-token ratio, self-BLEU-4
  (`metrics/open_ended.py`);
* the model's certainty along its own continuation: mean next-token entropy (nats) and mean top-1
  probability (hyperfitted models are "extremely low-entropy");
* held-out perplexity: the model's perplexity on the documents' true continuations (teacher forced).

    python -m warpdecode.bench.open_ended --runs smollm2-135m-instruct:greedy \\
        --runs smollm2-135m-instruct:top_p=0.95 --runs runs/hyperfit/model:greedy --out runs/open-ended

Prompts: windows of the held-out (test) split of the stdlib corpus, or `--documents` a `.jsonl` of
{"text": ...}. Writes results.json and results.md under `--out`.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from warpdecode.bench.machine import machine_info
from warpdecode.bench.prompts import held_out_stdlib_files
from warpdecode.data.corpus import read_jsonl
from warpdecode.decoding.batch import decode_batch
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.errors import ConfigError
from warpdecode.metrics.open_ended import DistinctN, RepetitionRate, SelfBLEU, TypeTokenRatio, WordIds
from warpdecode.models.checkpoint import load_pretrained
from warpdecode.models.tokenizer import Tokenizer
from warpdecode.models.transformer import Transformer

PREFIX_CHARS = 400
REFERENCE_CHARS = 1200


@dataclass(frozen=True)
class RunSpec:
    """`MODEL:DECODING`: a model name or directory, and `greedy`, `top_p=P` or `temperature=T`."""

    model: str
    decoding: str

    @classmethod
    def parse(cls, spec: str) -> RunSpec:
        model, sep, decoding = spec.rpartition(":")
        if not sep or not model:
            raise ConfigError(f"run {spec!r}: expected MODEL:DECODING, e.g. smollm2-135m-instruct:greedy")
        cls.sampling(decoding, seed=0)  # checks the decoding now, before any model loads
        return cls(model, decoding)

    @staticmethod
    def sampling(decoding: str, seed: int) -> SamplingConfig:
        if decoding == "greedy":
            return SamplingConfig()
        name, _, value = decoding.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if name == "top_p" and 0 < number <= 1:
            return SamplingConfig(do_sample=True, top_p=number, seed=seed)
        if name == "temperature" and number > 0:
            return SamplingConfig(do_sample=True, temperature=number, seed=seed)
        raise ConfigError(f"decoding {decoding!r}: expected greedy, top_p=P (0 < P <= 1) or temperature=T (T > 0)")

    @property
    def name(self) -> str:
        return f"{self.model}:{self.decoding}"


@dataclass(frozen=True)
class Document:
    id: str
    prefix: str
    reference: str
    """The text that truly follows `prefix` (for held-out perplexity)."""


def window(doc_id: str, text: str, prefix_chars: int = PREFIX_CHARS,
           reference_chars: int = REFERENCE_CHARS) -> Document | None:
    """A prefix starting at the first line break after a third of `text`, then its true continuation;
    None when the text is too short."""
    start = text.find("\n", len(text) // 3) + 1
    if start <= 0 or len(text) - start < prefix_chars + reference_chars // 2:
        return None
    cut = text.rfind("\n", start, start + prefix_chars) + 1 or start + prefix_chars
    return Document(doc_id, text[start:cut], text[cut : cut + reference_chars])


def documents(path: str | None, limit: int) -> list[Document]:
    """`limit` documents: windows of held-out stdlib files (every k-th file, spread over the split) or
    of the `text` of each line of a JSONL file."""
    if path is None:
        files = held_out_stdlib_files()
        sources = [(key, p.read_text(encoding="utf-8", errors="replace")) for key, p in files]
    else:
        if not Path(path).is_file():
            raise ConfigError(f"documents file {path} not found")
        sources = []
        for line_no, record in read_jsonl(Path(path)):
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ConfigError(f'{path}:{line_no}: expected {{"text": str}}')
            sources.append((f"{Path(path).name}/{line_no}", record["text"]))
    docs = [d for key, text in sources if (d := window(key, text)) is not None]
    if len(docs) < limit:
        raise ConfigError(f"only {len(docs)} documents are long enough for a {PREFIX_CHARS}-char prefix, "
                          f"{limit} asked")
    step = len(docs) / limit
    return [docs[int(i * step)] for i in range(limit)]


@torch.inference_mode()
def certainty(model: Transformer, sequences: list[list[int]], starts: list[int]) -> tuple[list[float], list[float]]:
    """Per sequence, the mean entropy (nats) and mean probability of the argmax of the model's
    next-token distributions at positions starts[i]-1 .. len-2 (those predicting tokens starts[i]..)."""
    entropies, top1 = [], []
    for ids, start in zip(sequences, starts, strict=True):
        logits = model(torch.tensor([ids]), logits_slice=slice(start - 1, len(ids) - 1)).logits[0].float()
        logp = logits.log_softmax(-1)  # (T_new, V)
        entropies.append(float(-(logp.exp() * logp).sum(-1).mean()))
        top1.append(float(logp.max(-1).values.exp().mean()))
    return entropies, top1


@torch.inference_mode()
def perplexity(model: Transformer, tokenizer: Tokenizer, docs: list[Document]) -> float:
    """exp of the mean NLL of the references' tokens given their prefixes, pooled over the documents."""
    nll, count = 0.0, 0
    for doc in docs:
        prefix = tokenizer.encode(doc.prefix)
        ids = (prefix + tokenizer.encode(doc.reference, add_special_tokens=False))[: model.config.max_seq_len]
        logits = model(torch.tensor([ids]), logits_slice=slice(len(prefix) - 1, len(ids) - 1)).logits[0].float()
        targets = torch.tensor(ids[len(prefix) :])
        nll += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
        count += len(targets)
    return math.exp(nll / count)


def evaluate(spec: RunSpec, docs: list[Document], *, max_new_tokens: int, seed: int, batch_size: int,
             words: WordIds, loaded: tuple[Transformer, Tokenizer] | None = None) -> dict[str, Any]:
    """Continue every document's prefix under `spec` and score the continuations."""
    model, tokenizer = loaded or load_pretrained(spec.model)
    sampler = Sampler(spec.sampling(spec.decoding, seed))
    prompts = [tokenizer.encode(d.prefix) for d in docs]
    budgets = [min(max_new_tokens, model.config.max_seq_len - len(p)) for p in prompts]
    start = time.perf_counter()
    new: list[list[int]] = []
    for b in range(0, len(prompts), batch_size):
        results = decode_batch(model, prompts[b : b + batch_size], sampler, budgets=budgets[b : b + batch_size],
                               stop_ids=set())  # open-ended: run to the budget
        new += [tokens for tokens, *_ in results]
    seconds = time.perf_counter() - start
    texts = [tokenizer.decode(t) for t in new]
    units = [words(t) for t in texts]
    metrics: dict[str, Any] = {}
    for name, metric in (("distinct_1", DistinctN(1)), ("distinct_2", DistinctN(2)), ("distinct_3", DistinctN(3)),
                         ("rep_4", RepetitionRate(4)), ("ttr", TypeTokenRatio()), ("self_bleu_4", SelfBLEU(4))):
        metric.update(units)
        value = float(metric.compute())
        metrics[name] = None if math.isnan(value) else round(value, 4)  # nan: too few or too short texts
    entropies, top1 = certainty(model, [p + t for p, t in zip(prompts, new, strict=True)], [len(p) for p in prompts])
    return {
        "run": spec.name, "model": spec.model, "decoding": spec.decoding, **metrics,
        "entropy": round(sum(entropies) / len(entropies), 4), "top1_prob": round(sum(top1) / len(top1), 4),
        "held_out_ppl": round(perplexity(model, tokenizer, docs), 3),
        "new_tokens": sum(len(t) for t in new), "seconds": round(seconds, 1),
        "samples": [{"id": d.id, "prefix": d.prefix, "continuation": t} for d, t in zip(docs, texts, strict=True)],
    }


COLUMNS = (("distinct_1", "distinct-1"), ("distinct_2", "distinct-2"), ("distinct_3", "distinct-3"),
           ("rep_4", "rep-4"), ("ttr", "TTR"), ("self_bleu_4", "self-BLEU-4"), ("entropy", "entropy (nats)"),
           ("top1_prob", "top-1 prob"), ("held_out_ppl", "held-out ppl"))


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| run | " + " | ".join(title for _, title in COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    lines += ["| " + row["run"] + " | " + " | ".join("n/a" if row[key] is None else f"{row[key]:.3f}" for key, _ in COLUMNS) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def run(specs: list[RunSpec], *, documents_path: str | None, limit: int, max_new_tokens: int, seed: int,
        batch_size: int, out: Path | None) -> list[dict[str, Any]]:
    docs = documents(documents_path, limit)
    words = WordIds()
    rows, cache = [], {}
    for spec in tqdm(specs, desc="open-ended", unit="run", disable=None):
        if spec.model not in cache:
            cache = {spec.model: load_pretrained(spec.model)}  # one model in memory at a time
        rows.append(evaluate(spec, docs, max_new_tokens=max_new_tokens, seed=seed, batch_size=batch_size,
                             words=words, loaded=cache[spec.model]))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        settings = {"documents": documents_path or "stdlib held-out split", "limit": limit,
                    "max_new_tokens": max_new_tokens, "seed": seed}
        machine = machine_info()
        (out / "results.json").write_text(json.dumps({"settings": settings, "machine": machine,
                                                      "runs": rows}, indent=1) + "\n")
        header = (f"Open-ended continuations: {limit} documents ({settings['documents']}), {max_new_tokens} new tokens, "
                  f"seed {seed}; {machine['cpu']} ({machine['cpu_count']} CPUs), torch {machine['torch']}, {machine['date']}.\n\n")
        (out / "results.md").write_text(header + markdown(rows))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", action="append", required=True, help="MODEL:DECODING (repeat for each run)")
    parser.add_argument("--documents", help="a .jsonl of {\"text\": ...} (default: held-out stdlib files)")
    parser.add_argument("--limit", type=int, default=16, help="documents")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    torch.set_flush_denormal(True)
    if args.threads:
        torch.set_num_threads(args.threads)
    for name in ("limit", "max_new_tokens", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    try:
        rows = run([RunSpec.parse(s) for s in args.runs], documents_path=args.documents, limit=args.limit,
                   max_new_tokens=args.max_new_tokens, seed=args.seed, batch_size=args.batch_size, out=args.out)
    except ConfigError as e:
        parser.exit(2, f"error: {e}\n")
    print(markdown(rows), end="")


if __name__ == "__main__":
    main()
