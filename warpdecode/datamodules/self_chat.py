"""User turns written by the target itself (Magpie-style prompt synthesis).

An instruction-tuned model continues its chat template's *pre-query* text (everything its template
renders before the content of a user turn: the system turn and the user header) with a plausible
user request, because that is what followed it in its tuning data (Xu et al., 2024, "Magpie:
Alignment Data Synthesis from Scratch by Prompting Aligned LLMs with Nothing"). Sampled that way, the
target writes the kind of conversations it was tuned to answer, with no dataset and no licence but
its own: the prompt mix a drafter for chat traffic should learn from.

`synthesize_user_turns` samples them in batches; `append_self_chat` grows a JSONL prompt file
(`{"messages": [{"role": "user", "content": ...}]}` lines, read by the self-distillation sources)
batch by batch, so an interrupted run keeps what it wrote and a rerun continues. `SelfChatSource`
is the `self_chat` prompt source of the self-distillation data: such a file per target and
sampling configuration in a cache folder, grown to what a prompt set takes from it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from warpdecode.data.corpus import read_jsonl
from warpdecode.datamodules.prompt import DistillPrompt
from warpdecode.decoding.batch import decode_batch
from warpdecode.decoding.generate import stop_token_ids
from warpdecode.decoding.sampler import Sampler, SamplingConfig
from warpdecode.errors import ConfigError
from warpdecode.io import content_key
from warpdecode.models.tokenizer import Tokenizer
from warpdecode.models.transformer import Transformer
from warpdecode.progress import ProgressLines

SOURCE = "self_chat"
"""The self-distillation prompt source name of the target's own user turns."""
VERSION = 1
"""Part of the cache file's name: bump when the sampling or filtering changes what a file holds."""
MIN_WORDS = 4
"""Shorter samples ("Hi!", "Thanks") ask for nothing worth answering."""
MAX_BARREN_BATCHES = 8
"""Give up after this many batches in a row add no new prompt (the target repeats itself or is not chat-tuned)."""
_SENTINEL = "\x00user-content\x00"


def pre_query_ids(tokenizer: Tokenizer) -> list[int]:
    """Token ids of what the chat template renders before a user turn's content (with the template's
    default system turn, as inference renders a one-turn prompt)."""
    if tokenizer.chat_template is None:
        raise ConfigError("self-chat prompts need a chat-tuned target: its tokenizer has no chat template")
    text = tokenizer.apply_chat_template([{"role": "user", "content": _SENTINEL}], add_generation_prompt=False)
    if _SENTINEL not in text:
        raise ConfigError("the target's chat template does not render the user turn's content verbatim")
    ids = tokenizer.encode(text[: text.index(_SENTINEL)], add_special_tokens=False)
    if not ids:
        raise ConfigError("the target's chat template renders nothing before a user turn's content")
    return ids


def normalized(text: str) -> str:
    """What two samples share when they are the same request (case and spacing aside)."""
    return " ".join(text.lower().split())


def usable(text: str, markers: tuple[str, ...]) -> bool:
    """A sample is a prompt when it has MIN_WORDS words and does not open another turn of the template."""
    return len(text.split()) >= MIN_WORDS and not any(marker in text for marker in markers)


def turn_markers(tokenizer: Tokenizer, stop_ids: set[int]) -> tuple[str, ...]:
    """Texts that open or close a turn (the special tokens' spellings): a sample holding one wrote
    more than a user turn."""
    texts = {tokenizer.bos_token, tokenizer.eos_token, *(tokenizer.decode([i]) for i in sorted(stop_ids))}
    return tuple(sorted(t for t in texts if t))


def synthesize_user_turns(model: Transformer, tokenizer: Tokenizer, *, batch_size: int, seed: int,
                          temperature: float = 1.0, top_p: float = 0.95,
                          max_new_tokens: int = 128) -> Iterator[list[str]]:
    """Endless batches of sampled user turns: of each batch of `batch_size` samples, the ones that
    ended on a stop token (a finished turn) and are `usable`, stripped. Batch i samples with seed
    `seed + i`, so the stream is reproducible on one machine."""
    prefix = pre_query_ids(tokenizer)
    if len(prefix) + max_new_tokens > model.config.max_seq_len:
        raise ConfigError(f"max_new_tokens {max_new_tokens} does not fit the context after the "
                          f"{len(prefix)}-token pre-query")
    stops = stop_token_ids(model, tokenizer)
    markers = turn_markers(tokenizer, stops)
    index = 0
    while True:
        sampler = Sampler(SamplingConfig(do_sample=True, temperature=temperature, top_p=top_p, seed=seed + index))
        results = decode_batch(model, [prefix] * batch_size, sampler, budgets=[max_new_tokens] * batch_size,
                               stop_ids=stops)
        texts = [tokenizer.decode([t for t in new if t not in stops]).strip()
                 for new, finish, _ in results if finish == "eos"]
        yield [t for t in texts if usable(t, markers)]
        index += 1


def read_user_turns(path: Path) -> list[str]:
    """The single user turns of a JSONL prompt file (as `append_self_chat` writes it), in order."""
    turns = []
    for line_no, record in read_jsonl(path):
        messages = record.get("messages") if isinstance(record, dict) else None
        if not (isinstance(messages, list) and len(messages) == 1 and isinstance(messages[0], dict)
                and messages[0].get("role") == "user" and isinstance(messages[0].get("content"), str)):
            raise ConfigError(f"{path}:{line_no}: not a one-user-turn prompt; "
                              "self-chat extends only files it wrote")
        turns.append(messages[0]["content"])
    return turns


def _drop_torn_tail(path: Path) -> None:
    """Cut an unfinished last line (a run killed mid-write) so the file reads as whole records."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)


def append_self_chat(path: Path, model: Transformer, tokenizer: Tokenizer, count: int, *, batch_size: int = 128,
                     seed: int = 0, temperature: float = 1.0, top_p: float = 0.95,
                     max_new_tokens: int = 128) -> int:
    """Grow the JSONL prompt file `path` to `count` distinct self-chat user turns, appending (and
    flushing) after every batch. Returns how many lines were added. The batch seeds start after the
    number of lines already there, so a resumed run samples new batches."""
    if count < 1:
        raise ConfigError(f"the self-chat prompt count must be >= 1, got {count}")
    if path.is_file():
        _drop_torn_tail(path)
    existing = read_user_turns(path) if path.is_file() else []
    seen = {normalized(t) for t in existing}
    have, barren = len(existing), 0
    if have >= count:
        return 0
    lines = ProgressLines("self-chat", count, "prompts", done=have)
    stream = synthesize_user_turns(model, tokenizer, batch_size=batch_size, seed=seed + have * 7919,
                                   temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        while have < count:
            fresh: list[str] = []
            for text in next(stream):
                if (key := normalized(text)) not in seen and have + len(fresh) < count:
                    seen.add(key)
                    fresh.append(text)
            f.write("".join(json.dumps({"messages": [{"role": "user", "content": t}]}, ensure_ascii=False) + "\n"
                            for t in fresh))
            f.flush()
            have += len(fresh)
            lines.update(have)
            barren = 0 if fresh else barren + 1
            if barren == MAX_BARREN_BATCHES:
                raise ConfigError(f"the target wrote no usable new user turn in {barren} batches in a row "
                                  f"({have} of {count} written); is it chat-tuned? (try another temperature)")
    return have - len(existing)


@dataclass(frozen=True)
class SelfChatSource:
    """The `self_chat` prompt source: user turns the target wrote, cached in `directory` under a name
    that hashes the target's weights (`fingerprint`, its `model_fingerprint`) and the sampling
    settings, grown on demand."""

    model: Transformer
    tokenizer: Tokenizer
    fingerprint: str
    directory: Path
    seed: int = 0
    batch_size: int = 128
    temperature: float = 1.0
    top_p: float = 0.95
    max_new_tokens: int = 128

    @property
    def path(self) -> Path:
        settings = [VERSION, self.fingerprint, self.seed, self.batch_size, self.temperature, self.top_p,
                    self.max_new_tokens]
        return self.directory / f"{content_key(settings)}.jsonl"  # a list: the key it had before sort_keys

    def prompts(self, count: int) -> list[DistillPrompt]:
        """The first `count` user turns, sampling the ones the cache file lacks."""
        path = self.path
        append_self_chat(path, self.model, self.tokenizer, count, batch_size=self.batch_size, seed=self.seed,
                         temperature=self.temperature, top_p=self.top_p, max_new_tokens=self.max_new_tokens)
        return [DistillPrompt(f"{SOURCE}/{i}", (("user", text),))
                for i, text in enumerate(read_user_turns(path)[:count])]
