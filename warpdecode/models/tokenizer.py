"""Tokenizer: a `tokenizers` tokenizer.json plus the chat template and special tokens around it.

Reads and writes the Hugging Face file pair (`tokenizer.json`, `tokenizer_config.json`), renders
chat templates in a sandboxed Jinja environment (templates come from checkpoints and are never
trusted), and trains small byte-level BPE vocabularies for models trained from scratch.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from jinja2 import Environment, TemplateError, nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError
from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from warpdecode.errors import CheckpointError, ConfigError, one_line

END_OF_TEXT = "<|endoftext|>"
MASK = "<|mask|>"

TEMPLATE_SECONDS = 5.0
"""Wall-clock budget of one chat template rendering."""
TEMPLATE_STEPS = 2_000_000
"""Template blocks (loop iterations, branches, macro calls) one rendering may run."""
TEMPLATE_MIN_CHARS = 1 << 20
"""Longest output (and intermediate string or list) of a rendering: this, or 4x the messages' size."""
MAX_TOKENIZER_CONFIG_BYTES = 64 << 20


def _token_text(value: Any, path: Path, name: str) -> str | None:
    """tokenizer_config.json stores special tokens as strings or as AddedToken dicts."""
    if isinstance(value, dict):
        value = value.get("content")
    if value is not None and not isinstance(value, str):
        raise CheckpointError(f"cannot read tokenizer {path}: {name} must be a string, got {value!r}")
    return value


def _chat_template(value: Any, path: Path) -> str | None:
    if isinstance(value, list):  # named templates: use the default one
        named = [t for t in value if isinstance(t, dict)]
        value = next((t.get("template") for t in named if t.get("name") == "default"), None)
    if value is not None and not isinstance(value, str):
        raise CheckpointError(f"cannot read tokenizer {path}: chat_template must be a string or a list of "
                              f"{{name, template}} objects, got {type(value).__name__}")
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
        except BaseException as e:  # the Rust library raises a bare Exception (or a pyo3 panic) on a bad file
            if not isinstance(e, Exception) and type(e).__name__ != "PanicException":
                raise
            raise CheckpointError(f"cannot read tokenizer {path}: {one_line(e)}") from e
        config: Any = {}
        config_path = directory / "tokenizer_config.json"
        if config_path.is_file():
            try:
                if config_path.stat().st_size > MAX_TOKENIZER_CONFIG_BYTES:
                    raise ValueError(f"{config_path.stat().st_size} bytes is no tokenizer config")
                config = json.loads(config_path.read_bytes())
            except (OSError, ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError
                raise CheckpointError(f"cannot read tokenizer {config_path}: {one_line(e)}") from e
            if not isinstance(config, dict):
                raise CheckpointError(f"cannot read tokenizer {config_path}: expected a JSON object, "
                                      f"got {type(config).__name__}")
        return cls(
            backend,
            eos_token=_token_text(config.get("eos_token"), config_path, "eos_token"),
            bos_token=_token_text(config.get("bos_token"), config_path, "bos_token"),
            chat_template=_chat_template(config.get("chat_template"), config_path),
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
        """Render `messages` ([{"role": ..., "content": ...}]) with the checkpoint's chat template.

        The template is untrusted code: it runs sandboxed, within `TEMPLATE_SECONDS`,
        `TEMPLATE_STEPS` and a size limit on its output and every string it builds; anything it
        raises or exceeds is a one-line `ConfigError("chat template failed: ...")`.
        """
        if self.chat_template is None:
            raise ConfigError("this tokenizer has no chat template; pass a plain prompt instead")
        if len(self.chat_template) > TEMPLATE_MIN_CHARS:  # compiling is not interruptible: refuse absurd sources
            raise ConfigError(f"chat template failed: its source is {len(self.chat_template)} characters long")
        max_chars = max(TEMPLATE_MIN_CHARS, 4 * len(json.dumps(messages, default=str)))
        env = _LimitedSandbox(max_chars, TEMPLATE_SECONDS, TEMPLATE_STEPS)

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        env.globals["raise_exception"] = raise_exception
        try:
            stream = env.from_string(self.chat_template).generate(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
            )
            parts, length = [], 0
            for part in stream:
                length += len(part)
                if length > max_chars:
                    raise SecurityError(f"output longer than {max_chars} characters")
                env.tick()
                parts.append(part)
            return "".join(parts)
        except Exception as e:  # the template is code from the checkpoint: whatever it raises is its failure
            raise ConfigError(f"chat template failed: {one_line(e)}") from e


class _BoundedCodeGenerator(CodeGenerator):
    """Compiles templates that call `environment.tick()` at the start of every block (so each loop
    iteration, branch and macro call counts against the budget, even an empty loop body) and pass
    every `~` concatenation through `environment.bounded`."""

    def blockvisit(self, nodes: Iterable[nodes.Node], frame: Frame) -> None:
        self.writeline("environment.tick()")
        super().blockvisit(nodes, frame)

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.bounded(")
        super().visit_Concat(node, frame)
        self.write(")")


_SIZED = (str, bytes, list, tuple, dict)
_FORMAT_NUMBER = re.compile(r"\d+")


class _LimitedSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox with limits on time, steps and the size of what a template builds.

    Sizes are checked before an operation where its result's size is predictable (`*`, `+`, `**`,
    widths, `replace`, `join`, `indent`, `expandtabs`, format specs) and on every result, so no
    string or list grows past `max_chars`; `tick` bounds loops by steps and wall-clock time.
    """

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"+", "*", "%", "**"})

    def __init__(self, max_chars: int, seconds: float, steps: int) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True)
        self.max_chars, self.steps_left = max_chars, steps
        self.deadline = time.monotonic() + seconds
        self.seconds = seconds
        self.filters = {name: self._bounded_filter(name, f) for name, f in self.filters.items()}

    def tick(self) -> None:
        self.steps_left -= 1
        if self.steps_left < 0:
            raise SecurityError("too many steps (an endless or very long loop?)")
        if self.steps_left % 256 == 0 and time.monotonic() > self.deadline:
            raise SecurityError(f"still rendering after {self.seconds:g} s (an endless loop?)")

    def bounded(self, value: Any) -> Any:
        if isinstance(value, _SIZED) and len(value) > self.max_chars:
            raise SecurityError(f"builds a value longer than {self.max_chars}")
        if isinstance(value, int) and value.bit_length() > 1 << 16:
            raise SecurityError("builds an integer of more than 65536 bits")
        return value

    def _check(self, size: int) -> None:
        if size > self.max_chars:
            raise SecurityError(f"would build a value of {size} characters or items (at most {self.max_chars})")

    def _check_arguments(self, name: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Refuse arguments that make a string or list larger than allowed before it is built."""
        values = (*args, *kwargs.values())
        for value in values:
            if isinstance(value, int) and not isinstance(value, bool):
                self._check(abs(value))  # a width, a count or a repetition
        if not isinstance(target, str):
            return
        if name in ("format", "format_map") or (name == "%" and values):
            for number in _FORMAT_NUMBER.findall(target):
                self._check(int(number))
        elif name == "replace" and len(values) >= 2 and isinstance(values[1], str):
            old = values[0] if isinstance(values[0], str) else str(values[0])
            count = target.count(old) if old else len(target) + 1
            self._check(len(target) + count * len(values[1]))
        elif name == "join" and values and isinstance(values[0], (list, tuple)):
            items = values[0]
            self._check(len(target) * len(items) + sum(len(i) for i in items if isinstance(i, str)))
        elif name == "expandtabs":
            width = values[0] if values and isinstance(values[0], int) else 8
            self._check(len(target) + target.count("\t") * width)
        elif name == "indent":
            width = values[0] if values else 4
            step = len(width) if isinstance(width, str) else width if isinstance(width, int) else 4
            self._check(len(target) + (target.count("\n") + 1) * step)

    def _bounded_filter(self, name: str, f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)
        def bounded_filter(*args: Any, **kwargs: Any) -> Any:
            values = [a for a in args if not isinstance(a, (Context, nodes.EvalContext, Environment))]
            if values:
                target, rest = values[0], tuple(values[1:])
                if name == "join":  # join(value, d): the separator is the target
                    target, rest = (rest[0] if rest else ""), (target if isinstance(target, (list, tuple)) else (),)
                self._check_arguments(name, target, rest, kwargs)
            return self.bounded(f(*args, **kwargs))

        return bounded_filter

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        if operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
            if right * abs(left).bit_length() > 1 << 16:
                raise SecurityError(f"{left} ** {right} is too large")
        elif operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, _SIZED) and isinstance(n, int):
                    self._check(len(seq) * n)
            if isinstance(left, int) and isinstance(right, int):
                self._check_bits(left.bit_length() + right.bit_length())
        elif operator == "+" and isinstance(left, _SIZED) and isinstance(right, _SIZED):
            self._check(len(left) + len(right))
        elif operator == "%" and isinstance(left, str):
            self._check_arguments("%", left, (right,), {})
        return self.bounded(super().call_binop(context, operator, left, right))

    def _check_bits(self, bits: int) -> None:
        if bits > 1 << 16:
            raise SecurityError("builds an integer of more than 65536 bits")

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.tick()
        method = getattr(obj, "__wrapped__", obj)  # the sandbox wraps str.format
        self._check_arguments(getattr(method, "__name__", ""), getattr(method, "__self__", None), args, kwargs)
        return self.bounded(super().call(context, obj, *args, **kwargs))


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
