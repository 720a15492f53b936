"""Tokenizer: a `tokenizers` tokenizer.json plus the chat template and special tokens around it.

Reads and writes the Hugging Face file pair (`tokenizer.json`, `tokenizer_config.json`), renders
chat templates in a sandboxed Jinja environment (templates come from checkpoints and are never
trusted), and trains small byte-level BPE vocabularies for models trained from scratch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from warpdecode.errors import CheckpointError, ConfigError

END_OF_TEXT = "<|endoftext|>"
MASK = "<|mask|>"


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json stores special tokens as strings or as AddedToken dicts."""
    if isinstance(value, dict):
        return value.get("content")
    return value


class Tokenizer:
    def __init__(
        self,
        backend: HFTokenizer,
        *,
        eos_token: str | None = None,
        bos_token: str | None = None,
        chat_template: str | None = None,
    ) -> None:
        self.backend = backend
        self.eos_token = eos_token
        self.bos_token = bos_token
        self.chat_template = chat_template

    @classmethod
    def load(cls, directory: str | Path) -> Tokenizer:
        directory = Path(directory)
        path = directory / "tokenizer.json"
        if not path.is_file():
            raise CheckpointError(f"no tokenizer.json in {directory}")
        try:
            backend = HFTokenizer.from_file(str(path))
        except Exception as e:  # the Rust library raises a bare Exception on a corrupt file
            raise CheckpointError(f"corrupt tokenizer file {path}: {e}") from e
        config: dict[str, Any] = {}
        config_path = directory / "tokenizer_config.json"
        if config_path.is_file():
            try:
                config = json.loads(config_path.read_text())
            except json.JSONDecodeError as e:
                raise CheckpointError(f"corrupt {config_path}: {e}") from e
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: use the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        return cls(
            backend,
            eos_token=_token_text(config.get("eos_token")),
            bos_token=_token_text(config.get("bos_token")),
            chat_template=template,
        )

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(directory / "tokenizer.json"))
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": self.eos_token,
            "bos_token": self.bos_token,
            "chat_template": self.chat_template,
        }
        (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def eos_token_id(self) -> int | None:
        return None if self.eos_token is None else self.backend.token_to_id(self.eos_token)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: list[str], *, add_special_tokens: bool = True) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=add_special_tokens)]

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, str]], *, add_generation_prompt: bool = True) -> str:
        """Render `messages` ([{"role": ..., "content": ...}]) with the checkpoint's chat template."""
        if self.chat_template is None:
            raise ConfigError("this tokenizer has no chat template; pass a plain prompt instead")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        env.globals["raise_exception"] = raise_exception
        try:
            return env.from_string(self.chat_template).render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
            )
        except TemplateError as e:
            raise ConfigError(f"chat template failed: {e}") from e


class StreamDecoder:
    """Turns a growing list of token ids into text increments, never splitting a UTF-8 character."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.emitted = ""

    def push(self, ids: Iterable[int]) -> str:
        self.ids.extend(ids)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):  # an incomplete multi-byte character: wait for the next token
            return ""
        delta = text[len(self.emitted) :]
        self.emitted = text
        return delta


def train_bpe(texts: Iterator[str] | list[str], vocab_size: int, *, min_frequency: int = 2) -> Tokenizer:
    """Train a byte-level BPE tokenizer (GPT-2 style pre-tokenisation) with one `<|endoftext|>` token."""
    if vocab_size < 300:
        raise ConfigError(f"a byte-level BPE needs vocab_size >= 300 (256 bytes + merges), got {vocab_size}")
    backend = HFTokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    return Tokenizer(backend, eos_token=END_OF_TEXT, bos_token=None)


def char_tokenizer(alphabet: str, special_tokens: tuple[str, ...] = (END_OF_TEXT, MASK)) -> Tokenizer:
    """One token per character of `alphabet` (ids after the special tokens), `<|endoftext|>` as EOS.

    For models trained from scratch on small synthetic tasks, where a character vocabulary keeps the
    embedding and LM head tiny. A character outside the alphabet encodes as `<|endoftext|>` (the
    unknown token): callers that build text from a known alphabet never produce one.
    """
    chars = list(dict.fromkeys(alphabet))
    if not chars:
        raise ConfigError("a character tokenizer needs a non-empty alphabet")
    vocab = {token: i for i, token in enumerate([*special_tokens, *chars])}
    backend = HFTokenizer(models.WordLevel(vocab, unk_token=special_tokens[0]))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(list(special_tokens))
    return Tokenizer(backend, eos_token=END_OF_TEXT if END_OF_TEXT in special_tokens else None)
