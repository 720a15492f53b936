"""Draft-model speculative decoding: a smaller backbone with the target's tokenizer drafts a chain or a tree.

The draft is either another model (`model=`) or, as a zero-training draft, the target's own first
`layers` blocks followed by its final norm and LM head (weights shared, not copied). The draft keeps
its own KV cache, rolled back to the accepted prefix after every verification.

With `top_k > 1` each step drafts a "chain of fans" (SpecInfer / Medusa-style top-k tree): `num_tokens`
levels of `top_k` siblings each, where only the first sibling of a level gets children. Example with
`top_k=3`, `num_tokens=3` (node indices as in the `DraftTree`, 9 nodes, depth 3):

    pending ─┬─ 0 ─┬─ 3 ─┬─ 6
             ├─ 1  ├─ 4  ├─ 7
             └─ 2  └─ 5  └─ 8

Greedy: a level holds the `top_k` largest draft logits, most likely first, so the expanded first
sibling is the level's node of highest cumulative draft log-prob; the tree is deterministic
(`draft_probs=None`). Sampling: a level holds `top_k` independent draws with replacement from the
draft distribution q, each node's `draft_probs` row being q, as lossless tree verification requires;
with `replacement=false` the siblings are distinct, drawn without replacement, and row i is q without
the first i siblings, renormalised (recursive speculative decoding: the same recursive rejection
verifier stays lossless, and no draft is wasted on a duplicate).
The draft runs one forward per level, over the expanded node only, so its cache holds one chain;
`top_k=1` is the plain chain.

With `num_nodes` set (greedy decoding only) the shape is not fixed: a DySpec dynamic tree of
`num_nodes` nodes grows where the draft is most confident (`dynamic_tree.py`), with the same
number of draft forwards as a chain of `num_tokens` and `top_k` candidates per expanded node.
"""

from __future__ import annotations

import dataclasses
from typing import cast

import torch
from torch import Tensor, nn

from warpdecode.decoding.drafters.dynamic_tree import grow_dynamic_tree
from warpdecode.decoding.protocols import AcceptResult, DecodeState, Drafter
from warpdecode.decoding.registry import register
from warpdecode.decoding.sampler import Sampler
from warpdecode.decoding.tree import DraftTree
from warpdecode.errors import ConfigError
from warpdecode.kernels.packed_linear import Linear
from warpdecode.kernels.quantized import Int8Weight
from warpdecode.models.backbone import Backbone
from warpdecode.models.cache import KVCache
from warpdecode.models.device import torch_dtype
from warpdecode.models.transformer import Transformer
from warpdecode.runtime.load import load_backbones


def layer_subset(target: Transformer, keep: list[int]) -> Transformer:
    """A backbone made of the target's blocks `keep` (in order), final norm and head (shared weights):
    the target with the other layers skipped."""
    L = target.config.n_layer
    if not keep or sorted(set(keep)) != keep or keep[0] < 0 or keep[-1] >= L or len(keep) == L:
        raise ConfigError(f"draft layers must be a strictly increasing proper subset of 0..{L - 1}, got {keep}")
    with torch.device("meta"):
        view = Transformer(dataclasses.replace(target.config, n_layer=len(keep)))
    view.embed, view.pos_embed, view.norm, view.lm_head = target.embed, target.pos_embed, target.norm, target.lm_head
    view.blocks = nn.ModuleList(target.blocks[i] for i in keep)
    view._head_packed, view.weight_bits = target._head_packed, target.weight_bits
    if target.config.position == "rope":
        view.inv_freq = target.inv_freq
    return view.eval()


def first_layers(target: Transformer, layers: int) -> Transformer:
    """A backbone made of the target's first `layers` blocks, final norm and head (shared weights)."""
    if not 1 <= layers < target.config.n_layer:
        raise ConfigError(f"draft layers must be in [1, {target.config.n_layer - 1}], got {layers}")
    return layer_subset(target, list(range(layers)))


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def without_replacement(q: Tensor, width: int, generator: torch.Generator | None) -> tuple[list[int], Tensor]:
    """`width` distinct tokens drawn one after another from q (1, V) without replacement (Gumbel-top-k),
    and the (width, V) distribution each was drawn from: row i is q with the first i tokens removed,
    renormalised (the proposals recursive speculative decoding verifies, Jeon et al. 2024).

    Example: q = [0.5, 0.3, 0.2], draws 1 then 0 → rows [0.5, 0.3, 0.2] and [0.714, 0, 0.286].
    """
    width = min(width, int((q[0] > 0).sum()))
    gumbel = -torch.log(-torch.log(torch.rand(q.shape[-1], generator=generator, device=q.device).clamp_min(1e-20)))
    tokens = (q[0].log() + gumbel).topk(width).indices.tolist()
    rows = []
    remaining = q[0].clone()
    for token in tokens:
        rows.append(remaining / remaining.sum())
        remaining[token] = 0.0
    return tokens, torch.stack(rows)


def propose_children(logits: Tensor, width: int, sampler: Sampler, replacement: bool = True) -> tuple[list[int], Tensor | None]:
    """The siblings proposed after `logits` (1, V) and the (n, V) distribution each was drawn from.

    Greedy: the `width` largest logits, largest first, and None. Sampling: `width` independent draws
    with replacement from q = `sampler.probs(logits)` (every row q), or, with `replacement=False`,
    up to `width` distinct draws (see `without_replacement`).
    """
    if not sampler.config.do_sample:
        return logits[0].topk(width).indices.tolist(), None
    q = sampler.probs(logits)  # (1, V)
    if not replacement:
        return without_replacement(q, width, sampler.generator)
    return torch.multinomial(q[0], width, replacement=True, generator=sampler.generator).tolist(), q.expand(width, -1)


def truncate_head(draft: Transformer, rows: int) -> None:
    """Give `draft` (a model the drafter loaded for itself) an LM head of its first `rows` rows: its
    logits are those of the first `rows` tokens, the same values as before for them."""
    C = draft.config.d_model
    held = None if draft.lm_head is None else draft.lm_head.quantized
    with torch.device("meta"):
        head = Linear(C, rows, bias=False)
    if isinstance(held, Int8Weight):
        head.quantized = held.first_rows(rows)
        head.weight = nn.Parameter(torch.empty(0, C), requires_grad=False)
    else:
        head.weight = nn.Parameter(draft.output_embeddings()[:rows].detach().clone(), requires_grad=False)
    draft.lm_head = head
    draft.config = dataclasses.replace(draft.config, tie_embeddings=False)


@register("drafter", "draft_model")
class DraftModelDrafter(Drafter):

    def __init__(self, model: str | None = None, layers: int | None = None, num_tokens: int = 4,
                 top_k: int = 1, replacement: bool = True, num_nodes: int | None = None, dtype: str = "fp32",
                 vocab: int | None = None, bits: int | None = None, confidence: float | None = None) -> None:
        """Args:
        model: a draft model directory or name sharing the target's tokenizer.
        vocab: score only the first `vocab` token ids: the draft's LM head keeps those rows alone
            (FR-Spec's frequency-ranked draft vocabulary; a byte-level BPE vocabulary numbers its
            tokens in merge order, so its first ids are its frequent ones). A token past them is never
            drafted, and the target still decides every token (lossless). Large vocabularies make the
            head a large share of a small draft: Qwen2.5's 152k rows are 136M of the 0.5B draft's weights.
        dtype: the precision `model` drafts in, as `--dtype` takes it: fp32, bf16, fp16, q8, q4 or
            native (a GGUF's own quantised weights; the draft's bytes read per step, not the output,
            depend on it: verification keeps the method lossless).
        bits: with `dtype=native`, 4 re-quantises the GGUF's block matrices of wider types (Q5_0,
            Q6_K, Q8_0) to int4 as well: a lossier draft that reads about half their bytes per step.
        layers: instead of `model`, draft with the target's first `layers` blocks (no training).
        num_tokens: draft depth per step (the chain length when `top_k=1`).
        confidence: stop drafting after a level whose first token has a draft probability below this
            (Hugging Face's `assistant_confidence_threshold`): a step drafts fewer tokens where the
            draft is unsure, saving its forwards where they would likely be rejected. None: always
            `num_tokens` levels.
        top_k: siblings per level; above 1 the draft is a tree of `top_k * num_tokens` nodes.
        replacement: when sampling, draw siblings independently (SpecInfer); false: distinct siblings
            drawn without replacement (recursive speculative decoding). Greedy trees are top-k either way.
        num_nodes: grow a dynamic tree of this many nodes instead (DySpec; greedy decoding only).
        """
        if (model is None) == (layers is None):
            raise ConfigError("draft_model needs exactly one of model= (a draft model) or layers= (target layers)")
        try:
            torch_dtype(dtype)
        except ConfigError as error:
            raise ConfigError(f"draft_model dtype: {str(error).removeprefix('--dtype ')}") from None
        if layers is not None and dtype != "fp32":
            raise ConfigError("draft_model dtype= is the precision of model=; layers= drafts with the target's own weights")
        if vocab is not None and (layers is not None or vocab < 1):
            raise ConfigError("draft_model vocab= must be >= 1 and needs model= (layers= shares the target's own head)")
        if bits is not None and (dtype != "native" or bits not in (4, 8)):
            raise ConfigError("draft_model bits= is 4 or 8 and needs dtype=native (the GGUF's own blocks, re-quantised)")
        if confidence is not None and not 0 < confidence < 1:
            raise ConfigError(f"draft_model confidence must be in (0, 1), got {confidence}")
        if confidence is not None and num_nodes is not None:
            raise ConfigError("draft_model confidence= stops a chain or a top_k tree; num_nodes grows a dynamic tree")
        self.model_source, self.layers, self.dtype, self.vocab, self.max_bits = model, layers, dtype, vocab, bits or 8
        self.init_drafting(num_tokens, top_k, replacement, num_nodes)
        self.confidence = confidence

    def init_drafting(self, num_tokens: int, top_k: int, replacement: bool = True, num_nodes: int | None = None) -> None:
        """Validate and set the draft shape; the draft itself is set by `prepare`."""
        if num_tokens < 1:
            raise ConfigError(f"{self.name} num_tokens must be >= 1, got {num_tokens}")
        if top_k < 1:
            raise ConfigError(f"{self.name} top_k must be >= 1, got {top_k}")
        if num_nodes is not None and num_nodes < 1:
            raise ConfigError(f"{self.name} num_nodes must be >= 1, got {num_nodes}")
        self.num_tokens, self.top_k, self.replacement, self.num_nodes = num_tokens, top_k, replacement, num_nodes
        self.needs_hidden_states: tuple[int, ...] = ()
        self.draft: Transformer | None = None
        self.source: Backbone | None = None
        """The target the draft was made for (layers=) or checked against."""
        self.cache: KVCache | None = None
        self.fed: list[int] = []
        """Drafted tokens in the draft cache after the committed ones (the expanded nodes, root first)."""

    def prepare(self, target: Backbone) -> None:
        """Load the draft model (once) or take the target's first layers, outside the timed decode."""
        if self.layers is not None:
            if self.draft is None or self.source is not target:
                self.draft, self.source = first_layers(target.torch_model(), self.layers), target
        elif self.draft is None:
            assert self.model_source is not None
            device = str(target.embed.weight.device)
            backbones, _ = load_backbones(self.model_source, None, ["torch"], device=device, dtype=self.dtype,
                                          head_rows=self.vocab, max_bits=self.max_bits)
            self.draft = cast(Transformer, backbones["torch"])
        if self.draft.config.vocab_size != target.config.vocab_size:
            raise ConfigError(f"draft vocabulary {self.draft.config.vocab_size} differs from the target's "
                              f"{target.config.vocab_size}: draft and target must share a tokenizer")
        if self.top_k > min(target.config.vocab_size, self.vocab or target.config.vocab_size):
            raise ConfigError(f"draft_model top_k {self.top_k} exceeds the draft vocabulary of "
                              f"{min(target.config.vocab_size, self.vocab or target.config.vocab_size)}")
        if self.vocab is not None and self.vocab < self.draft.config.vocab_size and self.draft_rows() > self.vocab:
            truncate_head(self.draft, self.vocab)
        self.draft.pack_for_cpu_inference()

    def start(self, state: DecodeState) -> None:
        if self.num_nodes is not None and state.sampler.config.do_sample:
            raise ConfigError(f"{self.name} num_nodes (a dynamic tree) verifies greedily only; when sampling, "
                              "use the fixed top_k trees")
        self.cache = self.new_draft_cache(state.cache.max_len)
        self.fed = []

    def new_draft_cache(self, max_len: int) -> KVCache:
        """An empty KV cache of `max_len` positions for the draft."""
        assert self.draft is not None, "prepare() must run first"
        weight = self.draft.embed.weight
        return KVCache.for_model(self.draft.config, 1, max_len, dtype=weight.dtype, device=weight.device)

    def level_widths(self, budget: int) -> list[int]:
        """Siblings per level: `top_k` on each of `num_tokens` levels, cut to `budget` nodes by dropping
        levels first (the last kept level may be narrower)."""
        full, rest = divmod(min(budget, self.top_k * self.num_tokens), self.top_k)
        return [self.top_k] * full + ([rest] if rest else [])

    vocab: int | None = None
    """Draft token ids below this only (`vocab=`); None: the whole vocabulary."""
    confidence: float | None = None
    """Stop after a level whose first token's draft probability is below this (None: never)."""

    def draft_rows(self) -> int:
        """The rows of the draft's LM head."""
        assert self.draft is not None
        head = self.draft.lm_head
        held = None if head is None else head.quantized
        return held.out_features if isinstance(held, Int8Weight) else self.draft.output_embeddings().shape[0]

    def run_draft(self, tokens: list[int]) -> Tensor:
        """Feed `tokens` to the draft after its cached positions; (1, V) logits after the last one
        (-inf past a `vocab=` head's rows)."""
        assert self.draft is not None and self.cache is not None
        inputs = torch.tensor([tokens], device=self.draft.embed.weight.device)
        logits = self.draft(inputs, cache=self.cache, logits_slice=slice(-1, None)).logits[0]  # (1, V or vocab)
        V = self.draft.config.vocab_size
        if logits.shape[-1] == V:
            return logits
        full = logits.new_full((*logits.shape[:-1], V), float("-inf"))
        full[..., : logits.shape[-1]] = logits
        return full

    def expand(self, path: list[int]) -> Tensor:
        """(V,) draft logits after `path` (draft tokens below the pending token): the cache keeps
        the drafted prefix it shares with `path` and runs the rest."""
        assert self.cache is not None
        committed = int(self.cache.lengths[0]) - len(self.fed)
        shared = min(common_prefix(self.fed, path), len(path) - 1)
        self.cache.truncate(committed + shared)
        self.fed = list(path)
        return self.run_draft(path[shared:])[0]

    @torch.inference_mode()
    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        assert self.cache is not None, "start() must run first"
        unseen = state.tokens[int(self.cache.lengths[0]) :]  # committed tokens the draft has not run, pending last
        if self.num_nodes is not None:
            if budget < 1:
                return DraftTree.empty()
            return grow_dynamic_tree(self.run_draft(unseen)[0], self.expand, min(self.num_nodes, budget),
                                     self.num_tokens - 1, self.top_k)
        widths = self.level_widths(budget)
        if not widths:
            return DraftTree.empty()
        logits = self.run_draft(unseen)
        tokens: list[int] = []
        parents: list[int] = []
        probs: list[Tensor] = []
        parent = -1  # the pending token, then each level's first sibling
        for level, width in enumerate(widths):
            children, q = propose_children(logits, width, state.sampler, self.replacement)
            parents += [parent] * len(children)
            parent = len(tokens)
            tokens += children
            if q is not None:
                probs.append(q)
            if level < len(widths) - 1:
                if self.confidence is not None and self.unsure(logits, q, children[0]):
                    break
                self.fed.append(children[0])
                logits = self.run_draft([children[0]])
        return DraftTree(torch.tensor(tokens), torch.tensor(parents), torch.cat(probs) if probs else None)

    def unsure(self, logits: Tensor, q: Tensor | None, token: int) -> bool:
        """Whether `token`, drafted after `logits` (1, V) (from `q` (n, V) when sampling), has a draft
        probability below `confidence`."""
        assert self.confidence is not None
        p = q[0, token] if q is not None else torch.softmax(logits[0].float(), -1)[token]
        return float(p) < self.confidence

    def observe(self, state: DecodeState, result: AcceptResult) -> None:
        assert self.cache is not None
        # Keep the draft's cache entries that match committed tokens (all but the new pending token). The
        # drafted entries match while the accepted path follows the expanded nodes; it may leave them
        # through a leaf sibling, whose token differs from the cached expanded one.
        committed = int(self.cache.lengths[0]) - len(self.fed)
        new = state.tokens[committed : len(state.tokens) - 1]
        self.cache.truncate(committed + common_prefix(self.fed, new))
        self.fed = []
