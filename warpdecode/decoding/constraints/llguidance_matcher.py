"""`Constraint` on llguidance (https://github.com/guidance-ai/llguidance): the grammar engine picked by
measurement (docs/notes/structured-output.md). A `Grammar` is compiled once per request; each
sequence or branch gets a `GrammarState`.

Stop tokens are kept out of llguidance's matcher: it does not count a consumed EOS as a token to
roll back, so `GrammarState` records the stop itself (`terminated`) and rolls it back itself.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from warpdecode.errors import ConfigError, one_line
from warpdecode.models.tokenizer import Tokenizer

if TYPE_CHECKING:
    import llguidance

_TOKENIZERS: weakref.WeakKeyDictionary[Tokenizer, dict[tuple[int, tuple[int, ...]], Any]] = weakref.WeakKeyDictionary()
"""Tokenizer → (V, stop ids) → its llguidance tokenizer (building one takes ~0.2 s on 49k tokens)."""


def ll_tokenizer(tokenizer: Tokenizer, vocab_size: int, stop_ids: frozenset[int]) -> llguidance.LLTokenizer:
    """llguidance's view of `tokenizer` with `stop_ids` as its EOS tokens, cached per tokenizer.

    Byte-level BPE and the other decoders llguidance reads go through the tokenizer's JSON; any other
    (a character vocabulary, say) through each token's decoded bytes.
    """
    import llguidance

    key = (vocab_size, tuple(sorted(stop_ids)))
    cached = _TOKENIZERS.setdefault(tokenizer, {})
    if key not in cached:
        eos = list(key[1])
        try:
            cached[key] = llguidance.LLTokenizer(tokenizer.backend.to_str(), n_vocab=vocab_size, eos_token=eos)
        except ValueError:  # a decoder llguidance cannot read: describe each token by its bytes
            cached[key] = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteTokens(tokenizer, vocab_size, eos)))
    return cached[key]


class _ByteTokens:
    """The generic tokenizer llguidance's `TokenizerWrapper` reads: each id's bytes and an encoder."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos: list[int]) -> None:
        special = {i for i in range(vocab_size) if tokenizer.backend.id_to_token(i) in _added(tokenizer)}
        self.tokenizer = tokenizer
        self.eos_token_id = eos[0] if eos else 0
        self.bos_token_id = None
        self.special_token_ids = sorted(special | set(eos))
        self.tokens = [b"" if i in special or tokenizer.backend.id_to_token(i) is None
                       else tokenizer.decode([i], skip_special_tokens=False).encode() for i in range(vocab_size)]

    def __call__(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)


def _added(tokenizer: Tokenizer) -> set[str]:
    return {t.content for t in tokenizer.backend.get_added_tokens_decoder().values()}


@dataclass(frozen=True)
class Grammar:
    """A compiled grammar for one tokenizer: `state()` starts a sequence at its beginning."""

    matcher: Any  # llguidance.LLMatcher at the start state, copied for each sequence
    vocab_size: int
    stop_ids: frozenset[int]
    schema: Mapping[str, Any] | None = None
    """The JSON schema budget-aware closings are checked against: set where the grammar is looser than
    it (a schema compiled leniently), None where the grammar is the whole constraint."""

    @classmethod
    def compile(cls, grammar: str, tokenizer: Tokenizer, *, vocab_size: int, stop_ids: frozenset[int],
                schema: Mapping[str, Any] | None = None) -> Grammar:
        """Compile llguidance's grammar text (`LLMatcher.grammar_from_*`); a bad grammar is a ConfigError."""
        import llguidance

        if not stop_ids:
            raise ConfigError("constrained decoding needs a stop token (the model's or tokenizer's EOS)")
        matcher = llguidance.LLMatcher(ll_tokenizer(tokenizer, vocab_size, stop_ids), grammar, log_level=0)
        if matcher.is_error():
            raise ConfigError(f"cannot compile the response format: {one_line(matcher.get_error(), 300)}")
        return cls(matcher, vocab_size, stop_ids, schema)

    def state(self) -> GrammarState:
        return GrammarState(self.matcher.deep_copy(), self.vocab_size, self.stop_ids)


class GrammarState:
    """A `Constraint` on one llguidance matcher."""

    def __init__(self, matcher: Any, vocab_size: int, stop_ids: frozenset[int], terminated: bool = False) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.stop_ids = stop_ids
        self.terminated = terminated
        self._forced_mask: Tensor | None = None  # `allows`'s mask where bytes are forced, until the state moves
        self._forced_known = False  # whether `_forced_mask` is up to date for this state

    def fill_mask(self, bits: Tensor) -> None:
        if self.terminated:
            bits.zero_()
            return
        self.matcher.unsafe_compute_mask_ptr(bits.data_ptr(), bits.numel() * bits.element_size())
        if self.matcher.is_error():
            raise RuntimeError(f"grammar matcher failed: {self.matcher.get_error()}")

    def advance(self, tokens: list[int]) -> int:
        self._forced_mask, self._forced_known = None, False
        done = 0
        for token in tokens:
            if self.terminated:
                break
            if token in self.stop_ids:
                if not self.matcher.is_accepting():
                    break
                self.terminated = True
            elif not self.matcher.try_consume_tokens([token]):
                break
            done += 1
        return done

    def rollback(self, num_tokens: int) -> None:
        self._forced_mask, self._forced_known = None, False
        if num_tokens and self.terminated:
            self.terminated, num_tokens = False, num_tokens - 1
        if num_tokens and not self.matcher.rollback(num_tokens):
            raise RuntimeError(f"grammar matcher cannot roll back {num_tokens} tokens: {self.matcher.get_error()}")

    def fork(self) -> GrammarState:
        return GrammarState(self.matcher.deep_copy(), self.vocab_size, self.stop_ids, self.terminated)

    def allows(self, token: int) -> bool:
        """`validate_tokens` where no bytes are forced. Where some are, llguidance's mask keeps only the
        tokens of their canonical tokenization (after a forced `{"name":"` it allows the token `{"`,
        not `{`, which `validate_tokens` accepts), so the mask is computed once for the state and read."""
        if self.terminated:
            return False
        if token in self.stop_ids:
            return bool(self.matcher.is_accepting())
        if not self._forced_known:
            self._forced_known = True
            if self.matcher.compute_ff_bytes():
                self._forced_mask = torch.zeros((self.vocab_size + 31) // 32, dtype=torch.int32)
                self.fill_mask(self._forced_mask)
        if self._forced_mask is not None:
            return bool((int(self._forced_mask[token // 32]) >> (token % 32)) & 1)
        return bool(self.matcher.validate_tokens([token]) == 1)

    def is_accepting(self) -> bool:
        return self.terminated or bool(self.matcher.is_accepting())

    def is_terminated(self) -> bool:
        return self.terminated

    def forced_tokens(self) -> list[int]:
        if self.terminated:
            return []
        if self.matcher.is_stopped():  # only a stop token is allowed
            return [min(self.stop_ids)]
        return list(self.matcher.compute_ff_tokens())
