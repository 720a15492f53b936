"""Compare grammar engines on the default model's tokenizer: compile time and mask time per token.

    python scripts/grammar_engines.py [--model smollm2-135m-instruct] [--repeats 5]

For each engine that imports (llguidance, xgrammar, outlines-core) and each constraint (a few JSON
schemas, a regex, a choice list), it times building the token-level matcher from scratch and then,
along the tokens of one valid output (the tokenizer's own encoding of a compact JSON instance),
the time to fill the allowed-token bitmask before each token and to advance by it. The engines'
tokenizer set-up (once per vocabulary) is timed on its own. It also checks that every engine allows
each next token of the path, and prints the allowed-set size at the first step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

SCHEMAS: dict[str, dict[str, Any]] = {
    "person": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"}},
        "required": ["name", "age", "email"],
        "additionalProperties": False,
    },
    "order": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "status": {"enum": ["pending", "shipped", "delivered"]},
            "items": {"type": "array", "items": {
                "type": "object",
                "properties": {"sku": {"type": "string", "maxLength": 12}, "qty": {"type": "integer"}, "price": {"type": "number"}},
                "required": ["sku", "qty", "price"], "additionalProperties": False}, "maxItems": 3},
            "paid": {"type": "boolean"},
        },
        "required": ["id", "status", "items", "paid"],
        "additionalProperties": False,
    },
    "event": {
        "type": "object",
        "properties": {
            "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
            "title": {"type": "string", "maxLength": 40},
            "attendees": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
            "priority": {"type": "integer", "minimum": 1, "maximum": 5},
        },
        "required": ["date", "title", "attendees", "priority"],
        "additionalProperties": False,
    },
}
INSTANCES: dict[str, Any] = {
    "person": {"name": "Ada Lovelace", "age": 36, "email": "ada@example.com"},
    "order": {"id": 1042, "status": "shipped", "items": [{"sku": "A-17", "qty": 2, "price": 9.5},
                                                         {"sku": "B-3", "qty": 1, "price": 120.0}], "paid": True},
    "event": {"date": "2026-11-27", "title": "Grammar review", "attendees": ["ana", "bo"], "priority": 2},
}
REGEX = r"[0-9]{3}-[0-9]{3}-[0-9]{4}"
REGEX_TEXT = "555-867-5309"
CHOICES = ["positive", "negative", "neutral"]
CHOICE_TEXT = "negative"


def constraints() -> list[tuple[str, str, Any, str]]:
    """(name, kind, spec, a valid output text) for each measured constraint."""
    out = [(name, "json", schema, json.dumps(INSTANCES[name], separators=(",", ":"))) for name, schema in SCHEMAS.items()]
    return out + [("phone-regex", "regex", REGEX, REGEX_TEXT), ("choice-3", "choice", CHOICES, CHOICE_TEXT)]


def choice_regex(choices: list[str]) -> str:
    import re

    return "(" + "|".join(re.escape(c) for c in choices) + ")"


class Engine:
    """One grammar library: `setup` once per vocabulary, `compile` per constraint, then a matcher."""

    name = ""

    def setup(self, tokenizer_json: str, vocab_size: int, eos: int) -> None: ...
    def compile(self, kind: str, spec: Any) -> Any: ...
    def matcher(self, compiled: Any) -> Any: ...
    def fill(self, matcher: Any, bitmask: torch.Tensor) -> None: ...
    def advance(self, matcher: Any, token: int) -> None: ...


class LLGuidance(Engine):
    name = "llguidance"

    def setup(self, tokenizer_json: str, vocab_size: int, eos: int) -> None:
        import llguidance

        self.ll = llguidance
        self.tok = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos)

    def compile(self, kind: str, spec: Any) -> Any:
        m = self.ll.LLMatcher
        grammar = {"json": lambda: m.grammar_from_json_schema(spec, defaults={"whitespace_flexible": False}), "regex": lambda: m.grammar_from_regex(spec),
                   "choice": lambda: m.grammar_from_regex(choice_regex(spec))}[kind]()
        matcher = m(self.tok, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return matcher

    def matcher(self, compiled: Any) -> Any:
        return compiled.deep_copy()

    def fill(self, matcher: Any, bitmask: torch.Tensor) -> None:
        matcher.unsafe_compute_mask_ptr(bitmask.data_ptr(), bitmask.numel() * 4)

    def advance(self, matcher: Any, token: int) -> None:
        assert matcher.consume_token(token), matcher.get_error()


class XGrammar(Engine):
    name = "xgrammar"

    def setup(self, tokenizer_json: str, vocab_size: int, eos: int) -> None:
        import xgrammar
        from tokenizers import Tokenizer as HFTokenizer
        from transformers import PreTrainedTokenizerFast

        self.xgr = xgrammar
        hf = PreTrainedTokenizerFast(tokenizer_object=HFTokenizer.from_str(tokenizer_json))
        info = xgrammar.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size, stop_token_ids=[eos])
        self.compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)

    def compile(self, kind: str, spec: Any) -> Any:
        c = self.compiler
        return {"json": lambda: c.compile_json_schema(json.dumps(spec), any_whitespace=False,
                                                           separators=(",", ":")),
                "regex": lambda: c.compile_regex(spec), "choice": lambda: c.compile_regex(choice_regex(spec))}[kind]()

    def matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matcher: Any, bitmask: torch.Tensor) -> None:
        matcher.fill_next_token_bitmask(bitmask[None])

    def advance(self, matcher: Any, token: int) -> None:
        assert matcher.accept_token(token)


class OutlinesCore(Engine):
    name = "outlines-core"

    def setup(self, tokenizer_json: str, vocab_size: int, eos: int) -> None:
        import outlines_core
        from tokenizers import Tokenizer as HFTokenizer

        self.oc = outlines_core
        hf = HFTokenizer.from_str(tokenizer_json)
        special = {t.content for t in hf.get_added_tokens_decoder().values()}
        byte_of = {c: b for b, c in _bytes_to_unicode().items()}
        vocab: dict[bytes, list[int]] = {}
        for text, i in hf.get_vocab().items():
            if text in special or i == eos:
                continue
            vocab.setdefault(bytes(byte_of[c] for c in text), []).append(i)
        self.vocab = outlines_core.Vocabulary(eos, vocab)

    def compile(self, kind: str, spec: Any) -> Any:
        regex = {"json": lambda: self.oc.json_schema.build_regex_from_schema(json.dumps(spec)),
                 "regex": lambda: spec, "choice": lambda: choice_regex(spec)}[kind]()
        return self.oc.Index(regex, self.vocab)

    def matcher(self, compiled: Any) -> Any:
        return self.oc.Guide(compiled)

    def fill(self, matcher: Any, bitmask: torch.Tensor) -> None:
        matcher.write_mask_into(bitmask.data_ptr(), bitmask.numel(), 4)

    def advance(self, matcher: Any, token: int) -> None:
        matcher.advance(token)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable character table of byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def allowed(bitmask: torch.Tensor, token: int) -> bool:
    return bool((int(bitmask[token // 32]) >> (token % 32)) & 1)


def popcount(bitmask: torch.Tensor) -> int:
    return int(np.unpackbits(bitmask.numpy().view(np.uint8)).sum())


def timed(f: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    value = f()
    return time.perf_counter() - t, value


def measure(engine: Engine, kind: str, spec: Any, path: list[int], vocab: int, eos: int, repeats: int) -> dict[str, Any]:
    """Compile time (best of 2), compile plus first mask, and mask / advance times along `path`."""
    compile_s = min(timed(lambda: engine.compile(kind, spec))[0] for _ in range(2))
    bitmask = torch.zeros((vocab + 31) // 32, dtype=torch.int32)
    ready_s = min(timed(lambda: engine.fill(engine.matcher(engine.compile(kind, spec)), bitmask))[0] for _ in range(2))
    compiled = engine.compile(kind, spec)
    masks, advances, first_allowed, ok = [], [], 0, True
    for _ in range(repeats):
        matcher = engine.matcher(compiled)
        for step, token in enumerate(path):
            masks.append(timed(lambda m=matcher: engine.fill(m, bitmask))[0])
            if step == 0:
                first_allowed = popcount(bitmask)
            ok &= allowed(bitmask, token)
            if token == eos:
                break
            advances.append(timed(lambda m=matcher, t=token: engine.advance(m, t))[0])
    masks_us = sorted(1e6 * m for m in masks)
    return {"tokens": len(path), "compile_ms": 1000 * compile_s, "ready_ms": 1000 * ready_s,
            "mask_p50_us": statistics.median(masks_us), "mask_p99_us": masks_us[min(len(masks_us) - 1, int(0.99 * len(masks_us)))],
            "advance_p50_us": 1e6 * statistics.median(advances), "first_allowed": first_allowed, "path_allowed": ok}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from warpdecode.models.checkpoint import resolve
    from warpdecode.models.tokenizer import Tokenizer

    tokenizer = Tokenizer.load(resolve(args.model))
    vocab, eos = tokenizer.vocab_size, tokenizer.eos_token_id
    assert eos is not None
    print(f"vocabulary: {vocab} tokens, eos {eos}")
    rows = []
    for engine in (LLGuidance(), XGrammar(), OutlinesCore()):
        try:
            setup_s, _ = timed(lambda e=engine: e.setup(tokenizer.backend.to_str(), vocab, eos))
        except ImportError as error:
            print(f"{engine.name}: not installed ({error})")
            continue
        print(f"{engine.name}: tokenizer set-up {setup_s * 1000:.0f} ms")
        for name, kind, spec, text in constraints():
            path = tokenizer.encode(text, add_special_tokens=False) + [eos]
            try:
                row = measure(engine, kind, spec, path, vocab, eos, args.repeats)
            except Exception as error:  # noqa: BLE001 - an engine's own compile error: report it as unsupported
                print(f"  {name}: cannot compile ({str(error).splitlines()[0][:100]})")
                continue
            rows.append({"engine": engine.name, "constraint": name} | row)
            print(f"  {name:12s} compile {row['compile_ms']:6.1f} ms (+1st mask {row['ready_ms']:6.1f})  "
                  f"mask p50 {row['mask_p50_us']:7.1f} us  p99 {row['mask_p99_us']:8.1f} us  "
                  f"advance p50 {row['advance_p50_us']:6.1f} us  allowed@0 {row['first_allowed']:6d}  "
                  f"path ok {row['path_allowed']}")
    print(json.dumps(rows))


if __name__ == "__main__":
    torch.set_flush_denormal(True)
    main()
