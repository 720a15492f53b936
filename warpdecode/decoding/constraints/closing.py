"""Budget-aware closing: end a constrained output inside its token budget with a complete, valid text.

A constrained output that reaches `max_new_tokens` inside a string, a key or an array the grammar
allows to go on is cut (finish reason `length`) and is not valid. With closing (`BudgetClosing`), the
output follows the model as long as the budget left after each of its tokens still covers a way to
complete the grammar (`closing`); at the first token after which it would not, that token is dropped
and the closing from the state before it is emitted instead, ending with a stop token. The output is
then complete under the grammar; its finish reason stays `length` (the budget cut the model's answer)
and `DecodeStats.closing_tokens` counts the tokens the closing wrote.

The closing is a rollout on the matcher (advanced, then rolled back): a stop token as soon as the
grammar accepts; else the tokens it forces; else, among the allowed tokens, one of the first
`lookahead` by closing preference after which the grammar accepts, or the first of them. The
preference reads each token's bytes as JSON text, inside or outside a string (`ClosingTables`): `}`
and `]` first, a string's closing `"` (the fewer characters before it the better); `{`, `[`, `,`,
escapes, whitespace and number characters last (a sign the very last); then the longest token, then
the lowest id. A token with no closing text is picked once per rollout while another candidate is
there (no loops). It is a heuristic, not the shortest completion: where it does not complete within
the budget left, the output is not closed and ends with `length` as without closing.

The decision is taken token by token on the committed output, whatever step produced the tokens
(plain decoding, an accepted draft path, forced tokens), so every lossless method gives the same closed
output, and until the closing point the tokens are those of constrained decoding without closing.
A rollout costs about one mask per closing token (tens of microseconds each); it runs after every
token once the budget left is within `window` tokens of the last closing's length, else every `every`
tokens (a closing that grew past the budget in between is then looked for one token back).

On a leniently compiled JSON schema (`Grammar.schema`) the grammar is looser than the schema, and a
closing fits only where the closed text validates (`schema_closing.py`: a closing built from the
schema, else the rollout if it validates); the check then runs after every token, and closes the
output before its budget at a token after which no valid closing is found.
"""

from __future__ import annotations

import warnings
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from warpdecode.decoding.constraints.llguidance_matcher import Grammar, ll_tokenizer
from warpdecode.decoding.constraints.protocol import Constraint, mask_words, unpack_mask
from warpdecode.models.tokenizer import Tokenizer

if TYPE_CHECKING:
    from warpdecode.decoding.constraints.schema_closing import SchemaCheck

OUTSIDE, STRING, ESCAPE = 0, 1, 2
"""JSON lexical states a token's bytes are read in: outside strings, inside one, after a backslash."""

_OUTSIDE_WEIGHTS = {ord("}"): 4.0, ord("]"): 4.0, ord('"'): -1.0, ord("{"): -4.0, ord("["): -4.0, ord(","): -1.0,
                    ord(" "): -1.0, ord("\n"): -1.0, ord("\t"): -1.0, ord("\r"): -1.0,
                    **{c: -1.5 for c in b"0123456789.eE"}, ord("-"): -2.0, ord("+"): -2.0}
"""Closing preference of a byte outside strings: closing brackets first; not openers (a quote opens a
string), separators, whitespace, and least of all more of a number (a comma ends one sooner)."""

HEAD = 2048
"""Tokens of each preference order read from the packed mask first (the allowed ones are mostly there)."""

_TABLES: weakref.WeakKeyDictionary[Tokenizer, dict[int, ClosingTables]] = weakref.WeakKeyDictionary()
"""Tokenizer → V → its tables (built once: ~0.5 s for 49k tokens)."""


@dataclass(frozen=True)
class ClosingTables:
    """A vocabulary's closing preference and JSON lexical transitions, per lexical state."""

    orders: Tensor  # (3, V) int64 token ids, the preferred closing token first, per lexical state
    ends: Tensor  # (3, V) int64 lexical state after the token, per lexical state before it
    scores: Tensor  # (3, V) float32 closing preference of the token, per lexical state
    pieces: tuple[bytes, ...] = ()  # each token's bytes (`text_tokens`, the output's text)
    ranks: Tensor = field(init=False)  # (3, V) int64 each token's place in `orders`
    ids: dict[bytes, int] = field(init=False)  # bytes → the lowest id of a token that writes them
    longest: int = field(init=False)  # the most bytes a token writes

    @classmethod
    def build(cls, token_bytes: list[bytes]) -> ClosingTables:
        """Tables of a vocabulary; `token_bytes[i]`: the bytes of token i (a special token's are never
        allowed by a grammar, whatever they read)."""
        orders, ends, table = [], [], []
        for start in (OUTSIDE, STRING, ESCAPE):
            scores, after = [], []
            for text in token_bytes:
                score, lex = _read(text, start)
                scores.append(score)
                after.append(lex)
            keys = sorted(range(len(token_bytes)), key=lambda i: (-scores[i], -len(token_bytes[i]), i))
            orders.append(keys)
            ends.append(after)
            table.append(scores)
        return cls(torch.tensor(orders, dtype=torch.int64), torch.tensor(ends, dtype=torch.int64),
                   torch.tensor(table, dtype=torch.float32), tuple(token_bytes))

    @classmethod
    def of(cls, tokenizer: Tokenizer, vocab_size: int, stop_ids: frozenset[int]) -> ClosingTables:
        """The tables of `tokenizer`'s first `vocab_size` tokens (their bytes as llguidance reads them),
        cached per tokenizer (~0.5 s for 49k tokens)."""
        cached = _TABLES.setdefault(tokenizer, {})
        if vocab_size not in cached:
            decode = ll_tokenizer(tokenizer, vocab_size, stop_ids).decode_bytes
            cached[vocab_size] = cls.build([decode([i]) for i in range(vocab_size)])
        return cached[vocab_size]

    def __post_init__(self) -> None:
        ranks = torch.empty_like(self.orders)
        ranks.scatter_(1, self.orders, torch.arange(self.orders.shape[1]).expand_as(self.orders).contiguous())
        object.__setattr__(self, "ranks", ranks)
        ids: dict[bytes, int] = {}
        for token, text in enumerate(self.pieces):
            if text:
                ids.setdefault(text, token)
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "longest", max(map(len, ids), default=0))

    def preferred(self, words: Tensor, lex: int, stop_ids: frozenset[int], count: int) -> list[int]:
        """The first `count` tokens in lexical state `lex`'s order that the packed mask `words` ((W,)
        int32) allows, stop tokens left out: from the order's head where it holds enough of them, else
        by rank among every allowed token."""
        head = self.orders[lex, :HEAD]
        found = [t for t in head[((words[head >> 5] >> (head & 31)) & 1).bool()].tolist() if t not in stop_ids]
        if len(found) >= count or head.numel() == self.orders.shape[1]:
            return found[:count]
        allowed = unpack_mask(words[None], self.orders.shape[1])[0].nonzero().flatten()
        return [t for t in allowed[self.ranks[lex, allowed].argsort()].tolist() if t not in stop_ids][:count]

    def after(self, lex: int, tokens: list[int]) -> int:
        """The lexical state after `tokens`, from `lex`."""
        for token in tokens:
            lex = int(self.ends[lex, token])
        return lex


def _read(text: bytes, lex: int) -> tuple[float, int]:
    """(closing preference, lexical state after) of `text` read from lexical state `lex`."""
    score, content = 0.0, 0
    for byte in text:
        if lex == ESCAPE:
            lex, content = STRING, content + 1
        elif lex == STRING:
            if byte == ord('"'):  # closes the string: the fewer characters written before, the better
                score, lex, content = score + 2.0 - 0.01 * content, OUTSIDE, 0
            elif byte == ord("\\"):
                score, lex = score - 2.0, ESCAPE
            else:
                content += 1
        else:
            score += _OUTSIDE_WEIGHTS.get(byte, 0.0)
            if byte == ord('"'):
                lex = STRING
    return score, lex


def closing(state: Constraint, tables: ClosingTables, lex: int, limit: int, *, lookahead: int = 8) -> list[int] | None:
    """The tokens that complete `state`'s grammar (the last one a stop token), at most `limit` of them;
    None when the rollout does not complete within `limit`. `state` is left as it was.

    Args:
        state: the grammar state after the output so far.
        tables: the vocabulary's `ClosingTables`.
        lex: the JSON lexical state after the output so far (`ClosingTables.after`).
        limit: most tokens the closing may take.
        lookahead: candidates, in preference order, checked for completing the grammar at once.
    """
    out: list[int] = []
    words = torch.zeros(mask_words(state.vocab_size), dtype=torch.int32)
    stop = min(state.stop_ids)
    try:
        while len(out) < limit and not state.is_terminated():
            if state.is_accepting():
                state.advance([stop])
                out.append(stop)
                break
            forced = [t for t in state.forced_tokens() if t not in state.stop_ids][: limit - len(out)]
            done = state.advance(forced)
            out += forced[:done]
            lex = tables.after(lex, forced[:done])
            if forced and done == len(forced):
                continue
            state.fill_mask(words)
            candidates = tables.preferred(words, lex, state.stop_ids, lookahead)
            if not candidates:
                return None
            pick = candidates[0]
            if tables.scores[lex, pick] <= 0:  # no closing text: try another token than last time (a loop)
                pick = next((t for t in candidates if t not in out), pick)
            for token in candidates:
                if state.advance([token]) == 1:
                    accepting = state.is_accepting()
                    state.rollback(1)
                    if accepting:
                        pick = token
                        break
            if state.advance([pick]) != 1:
                return None
            out.append(pick)
            lex = int(tables.ends[lex, pick])
        return out if state.is_terminated() else None
    finally:
        state.rollback(len(out))


def text_tokens(state: Constraint, tables: ClosingTables, text: bytes, limit: int) -> list[int] | None:
    """Tokens that write `text` in `state`'s grammar and then stop (the last one a stop token), at most
    `limit` of them: at each step the longest token of the text's next bytes the grammar allows; None
    where the grammar refuses the text, does not accept after it, or it takes more. `state` is left
    as it was."""
    out: list[int] = []
    try:
        while text:
            if len(out) + 1 >= limit:
                return None
            for size in range(min(len(text), tables.longest), 0, -1):
                token = tables.ids.get(text[:size])
                if token is not None and token not in state.stop_ids and state.advance([token]) == 1:
                    out.append(token)
                    text = text[size:]
                    break
            else:
                return None
        if len(out) + 1 > limit or not state.is_accepting():
            return None
        stop = min(state.stop_ids)
        state.advance([stop])
        out.append(stop)
        return out
    finally:
        state.rollback(len(out))


class BudgetClosing:
    """One output's closing decision: `take` commits its tokens one by one, replacing the first one after
    which the closing would no longer fit `budget` with the closing from before it.

    `closing_tokens` counts the closing's tokens once it is emitted (0 before, or without a closing).
    Where no closing fits, none is looked for again: the shortest completion after a token is at most
    one token shorter than before it, while the budget left is one token shorter, so it never fits
    again (the rollout is not the shortest completion, so this is a rule, not a proof).

    With `check` (a lenient JSON schema's `SchemaCheck`), a closing fits only where the closed text
    validates against the schema: the grammar's rollout where it does, else a closing built from the
    schema (`SchemaCheck.completion`) written in the grammar's tokens. The check then runs after every
    token, and an output whose next token leaves no valid closing (a duplicate item where the schema
    wants unique ones, a string where it wants an object: text the lenient grammar allows and the
    schema does not) is closed there, before its budget, with the closing from before that token.
    """

    def __init__(self, tables: ClosingTables, budget: int, *, window: int = 16, every: int = 8,
                 lookahead: int = 8, check: SchemaCheck | None = None) -> None:
        self.tables = tables
        self.budget = budget
        self.window = window
        self.every = every
        self.lookahead = lookahead
        self.check = check
        self.position = 0  # tokens committed so far
        self.lex = OUTSIDE
        self.text = b""  # the committed tokens' bytes (read where `check` is set)
        self.next_check = 0  # the next position checked
        self.fits: list[int] | None = None  # the closing at `position`, when checked and it fits
        self.closing_tokens = 0

    @classmethod
    def of(cls, tokenizer: Tokenizer, grammar: Grammar, budget: int) -> BudgetClosing:
        """The closing of one output of `grammar` within `budget` tokens, checked against the grammar's
        `schema` where it has one (a note on stderr where `jsonschema` is missing: grammar-valid only)."""
        tables = ClosingTables.of(tokenizer, grammar.vocab_size, grammar.stop_ids)
        check = None
        if grammar.schema is not None:
            from warpdecode.decoding.constraints.schema_closing import SchemaCheck

            check = SchemaCheck.of(grammar.schema)
            if check is None:
                warnings.warn("close_at_budget: a leniently compiled schema's closings are checked against the "
                              "schema with jsonschema (pip install 'warpdecode[structured]'); without it they "
                              "follow the grammar only", stacklevel=2)
        return cls(tables, budget, check=check)

    def find(self, state: Constraint, lex: int, limit: int, text: bytes) -> list[int] | None:
        """A closing of `state` (the output so far: `text`, in lexical state `lex`) within `limit`
        tokens: the grammar's rollout, or with `check`, a closing built from the schema and else the
        rollout where the closed text validates."""
        if self.check is None or self.check.broken:
            return closing(state, self.tables, lex, limit, lookahead=self.lookahead)
        prefix = _text(text)
        built = None if prefix is None else self.check.completion(prefix)
        tokens = None if built is None else text_tokens(state, self.tables, built.encode(), limit)
        if tokens is not None:
            return tokens
        found = closing(state, self.tables, lex, limit, lookahead=self.lookahead)
        closed = None if found is None else _text(text + b"".join(self.tables.pieces[t] for t in found[:-1]))
        return found if closed is not None and (self.check.valid(closed) or self.check.broken) else None

    def take(self, state: Constraint, tokens: list[int]) -> list[int]:
        """Advance `state` by `tokens`, the grammar allowing each (a stop token ends them); returns the
        tokens to emit: `tokens` up to the stop token, or a prefix of them and then the closing."""
        out: list[int] = []
        for token in tokens:
            fits_before, lex_before, text_before = self.fits, self.lex, self.text
            if state.advance([token]) != 1:
                break
            out.append(token)
            if state.is_terminated():
                break
            self.position += 1
            self.lex = int(self.tables.ends[self.lex, token])
            if self.check is not None:
                self.text += self.tables.pieces[token]
            self.fits = None
            if self.position < self.next_check:
                continue
            left = self.budget - self.position
            found = self.find(state, self.lex, left, self.text)
            if found is not None:
                self.fits = found
                slack = left - len(found)
                close = slack <= self.window or self.check is not None
                self.next_check = self.position + (1 if close else min(self.every, slack - self.window))
                continue
            state.rollback(1)  # the closing from before this token, if it fits there
            back = fits_before if fits_before is not None else self.find(state, lex_before, left + 1, text_before)
            if back is None:  # none fits now, and none will: a token shortens a completion by one at most
                state.advance([token])
                self.next_check = self.budget + 1
                continue
            out.pop()
            state.advance(back)
            self.closing_tokens = len(back)
            return out + back
        return out


def _text(data: bytes) -> str | None:
    """`data` as UTF-8 text; None where it is not (a token that ends inside a character)."""
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None
