"""Grammar-constrained commits for masked diffusion decoding: a commit becomes final only while the
partially filled answer can still be completed to a string of the row's grammar (the additive-infilling
condition of constrained diffusion decoding, checked with a witness).

A grammar engine (llguidance, `decoding/constraints`) checks prefixes left to right, but a diffusion
decoder commits slots anywhere in the answer. Completability of an answer with holes is shown by a
**witness**: walk the answer from its first masked slot (the frontier) with the grammar state of the
committed prefix, fill every masked slot with one token (the model's most probable token there that
the grammar takes; never end-of-text, since committed tokens follow) and check every committed token
in turn, up to the first committed end-of-text (where the grammar must accept) or the last committed
token. A policy's commit is kept when a witness exists with it: for the whole commit at once, else
slot by slot in the order of the model's confidence (the slots kept before included); a slot whose
commit is not kept stays masked. Each slot is one token, so a witness is a real filling of the holes,
and the grammar engine allows only prefixes it can still complete: **after every step the answer is
completable** (a prefix of a string of the grammar, where it ends, with end-of-text).

The witness is greedy (one filling per hole, no backtracking): a completable commit can wait, never
the reverse. Progress: a row whose policy commits nothing kept still commits its frontier slot, with
its best token that has a witness, else the token the last witness put there (one exists by induction).

With a grammar that takes every string, every witness passes and the decoder commits exactly what it
commits unconstrained (tested). The answer is a complete string of the grammar when it ends with
end-of-text inside the region; otherwise the region ran out first and it is a prefix of one (finish
reason "length"), as an autoregressive decode that runs out of tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from warpdecode.decoding.constraints.protocol import Constraint, mask_words, unpack_mask
from warpdecode.decoding.diffusion.protocols import Commit
from warpdecode.errors import ConfigError

FILL_TRIES = 3
"""Most probable tokens tried at a hole before its full allowed-token mask is computed."""
FRONTIER_TRIES = 8
"""Most probable allowed tokens tried at a stalled frontier before the last witness's token."""


class GrammarCommits:
    """Per-row grammar states of a diffusion batch (`None`: a free row); `keep` filters each step's commit."""

    def __init__(self, states: Sequence[Constraint | None], *, eos_token_id: int, mask_token_id: int,
                 temperature: float = 0.0, generator: torch.Generator | None = None) -> None:
        self.states = list(states)
        self.eos, self.mask_id = eos_token_id, mask_token_id
        self.temperature, self.generator = temperature, generator
        self.consumed = [0] * len(self.states)  # answer slots each state has advanced over
        self.witness: list[dict[int, int]] = [{} for _ in self.states]  # masked slot → its last witness token

    def keep(self, commit: Commit, tokens: Tensor, masked: Tensor, answer: Tensor, logits: Tensor) -> Commit:
        """The commits of `commit` that keep every row completable, plus a frontier commit for a row that
        would otherwise stall.

        Args:
            commit: the policy's choice, positions (B, L) bool and tokens (B, L) int64.
            tokens: (B, L) int64 current sequences (committed tokens; masked slots hold the mask token).
            masked: (B, L) bool still-masked answer slots.
            answer: (B, L) bool answer region.
            logits: (B, L, V) fp32 this step's logits (the fillings of holes and stalled frontiers).
        """
        positions, chosen = commit.positions & masked, commit.tokens.clone()
        for row, state in enumerate(self.states):
            if state is None or not masked[row].any():
                continue
            slots = answer[row].nonzero()[:, 0].tolist()  # answer positions, in order
            seq = {p: int(tokens[row, p]) for p in slots if not masked[row, p]}  # committed slot → token
            self._sync(row, state, slots, seq)
            if state.is_terminated():  # the output ended: what follows its end-of-text is not output
                continue
            ahead = slots[self.consumed[row]:]  # from the frontier on
            wanted = positions[row].nonzero()[:, 0].tolist()
            positions[row] = False
            kept = False
            together = self._witness(state, ahead, seq | {p: int(chosen[row, p]) for p in wanted}, logits[row])
            if together is not None:  # the usual case: the whole commit keeps the row completable
                positions[row, wanted], self.witness[row] = True, together
                continue
            for p in sorted(wanted, key=lambda q: -float(logits[row, q].softmax(-1).max())):
                trial = seq | {p: int(chosen[row, p])}
                witness = self._witness(state, ahead, trial, logits[row])
                if witness is not None:
                    seq, self.witness[row], kept = trial, witness, True
                    positions[row, p] = True
            if not kept:
                frontier = ahead[0]
                token = self._frontier_token(row, state, ahead, seq, logits[row])
                chosen[row, frontier], positions[row, frontier] = token, True
        return Commit(positions, chosen)

    def _sync(self, row: int, state: Constraint, slots: list[int], seq: dict[int, int]) -> None:
        """Advance the row's state over the committed slots right after its prefix (to the new frontier)."""
        while self.consumed[row] < len(slots) and slots[self.consumed[row]] in seq and not state.is_terminated():
            token = seq[slots[self.consumed[row]]]
            if state.advance([token]) != 1:
                raise RuntimeError(f"committed token {token} left the grammar")  # a witness said it would not
            self.consumed[row] += 1

    def _witness(self, state: Constraint, ahead: list[int], seq: dict[int, int], logits: Tensor) -> dict[int, int] | None:
        """A filling of the holes of `ahead` (answer slots from the frontier) under which the committed
        tokens `seq` are a prefix of the grammar (checked up to the first end-of-text); None if the greedy
        filling fails. `logits`: (L, V) fp32, this step's logits of the row."""
        last = max((p for p in ahead if p in seq), default=None)
        filled: dict[int, int] = {}
        advanced = 0
        try:
            for p in ahead:
                if last is None or p > last:
                    return filled
                if p in seq:
                    if state.advance([seq[p]]) != 1:
                        return None
                    advanced += 1
                    if seq[p] == self.eos:  # the output ends here
                        return filled
                    continue
                token = self._fill(state, logits[p])
                if token is None:
                    return None
                advanced += 1
                filled[p] = token
            return filled
        finally:
            state.rollback(advanced)

    def _fill(self, state: Constraint, logits: Tensor) -> int | None:
        """Advance `state` by the most probable token at a hole that the grammar takes next, end-of-text
        excluded, and return it (None: there is none, the state unchanged); `logits` (V,). The few most
        probable tokens are tried first: a full mask is computed only when none of them is taken."""
        for token in logits.topk(min(FILL_TRIES, logits.shape[-1])).indices.tolist():
            if token == self.eos or token == self.mask_id:
                continue
            if state.advance([token]) == 1:
                return int(token)
        allowed = self._allowed(state, logits)
        allowed[self.eos] = False
        if not allowed.any():
            return None
        token = int(logits.masked_fill(~allowed, float("-inf")).argmax())
        state.advance([token])
        return token

    def _frontier_token(self, row: int, state: Constraint, ahead: list[int], seq: dict[int, int],
                        logits: Tensor) -> int:
        """The token a stalled row commits at its frontier: the best allowed one (sampled when sampling)
        with a witness for the rest, else the last witness's."""
        frontier = ahead[0]
        allowed = self._allowed(state, logits)
        if not allowed.any():  # the grammar goes on with text no token of this vocabulary writes
            raise ConfigError("the response format needs characters this model's vocabulary cannot write")
        scores = logits[frontier].float().masked_fill(~allowed, float("-inf"))
        if self.temperature > 0:  # Gumbel-max: the ranking's first is a draw from the allowed tokens
            uniform = torch.rand(scores.shape, generator=self.generator, device=scores.device).clamp_min(1e-20)
            scores = scores / self.temperature - torch.log(-torch.log(uniform))
        ranked = scores.argsort(descending=True)[: int(allowed.sum())].tolist()
        for token in ranked[:FRONTIER_TRIES]:
            witness = self._witness(state, ahead, seq | {frontier: token}, logits)
            if witness is not None:
                self.witness[row] = witness  # the proof for the next stalled step
                return int(token)
        if frontier in self.witness[row]:  # the rest of the last witness stays one
            return self.witness[row].pop(frontier)
        raise RuntimeError("no token keeps the answer completable")  # the invariant says one exists

    def _allowed(self, state: Constraint, logits: Tensor) -> Tensor:
        """(V,) bool on `logits`' device: the tokens the grammar takes next (never the mask token)."""
        vocab_size = logits.shape[-1]
        bits = torch.zeros(1, mask_words(state.vocab_size), dtype=torch.int32)
        state.fill_mask(bits[0])
        allowed = torch.zeros(vocab_size, dtype=torch.bool)
        width = min(vocab_size, state.vocab_size)
        allowed[:width] = unpack_mask(bits, state.vocab_size)[0, :width]
        # a stop token only where the grammar accepts (llguidance's mask also sets it at a dead end)
        allowed[sorted(i for i in state.stop_ids if i < vocab_size)] = state.is_accepting()
        allowed[self.mask_id] = False
        return allowed.to(logits.device)
