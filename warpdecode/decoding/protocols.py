"""The seams of the draft→verify loop: decoding state, drafters, verifiers and controllers.

One verify step: the controller gives a budget, the drafter proposes a `DraftTree` of at most that
many nodes, the target runs one forward over `[pending] + tree`, the verifier returns the accepted
root-to-node path plus one token chosen from the target (the *bonus* token: the correction after a
rejection, or the extra token after a fully accepted path), and the state commits them.

Components subclass their protocol and declare what they need and promise as class attributes
(`lossless`, `needs_sampling`, `needs_training`, `onnx_graphs`, `controls`...), which the protocols
declare with their defaults: the engine, `warpdecode methods`, export and the package reader ask the
class, never a list of names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from torch import Tensor

from warpdecode.decoding.sampler import Sampler
from warpdecode.decoding.tree import DraftTree
from warpdecode.models.backbone import Backbone
from warpdecode.models.cache import KVCache
from warpdecode.models.draft_head import DraftVocabNet

if TYPE_CHECKING:
    from warpdecode.decoding.device_step.state import DeviceDrafter


@dataclass
class DecodeState:
    """What drafters may read about the sequence being decoded (batch of one)."""

    target: Backbone
    cache: KVCache
    """The target's cache: holds every committed token except `pending`."""
    tokens: list[int]
    """Prompt plus every generated token, `pending` last."""
    prompt_len: int
    sampler: Sampler
    hidden_states: dict[int, Tensor] = field(default_factory=dict)
    """Target hidden states (layer → (T, C)) of the last verify forward's accepted positions."""
    forward_tokens: Tensor | None = None
    """(T,) int64 input tokens of the last target forward whose logits are in `forward_logits`:
    `[pending] + tree` after a verify forward, the last prompt token after the prefill."""
    forward_logits: Tensor | None = None
    """(T, V) raw target logits after each of `forward_tokens` (accepted or not)."""
    forward_tree: DraftTree | None = None
    """The tree verified by the last forward (`forward_tokens` = `[pending] + tree.tokens`)."""

    @property
    def pending(self) -> int:
        """The last selected token: emitted, but not yet run through the target."""
        return self.tokens[-1]


@dataclass(frozen=True)
class AcceptResult:
    path: list[int]
    """Accepted tree node indices, root to leaf (empty when the first draft token was rejected)."""
    tokens: list[int]
    """The accepted draft tokens followed by the bonus token (len(path) + 1 tokens)."""
    proposed: int
    """Draft tokens that could have been accepted this step (the tree's depth)."""
    divergent: int = 0
    """Accepted draft tokens the target's argmax disagrees with (lossy verifiers; 0 for lossless ones
    at temperature 0)."""

    @property
    def bonus(self) -> int:
        return self.tokens[-1]

    @classmethod
    def from_path(cls, tree: DraftTree, path: list[int], bonus: int, divergent: int = 0) -> AcceptResult:
        return cls(path, [int(tree.tokens[c]) for c in path] + [bonus], proposed=tree.depth, divergent=divergent)


NO_CONTROLS: Mapping[str, str] = MappingProxyType({})


class Drafter(Protocol):
    """Drafters subclass this protocol and override the capabilities that differ from its defaults."""

    name: ClassVar[str] = ""
    """Its registry key, set by `@register`: a registered component's one name (used in messages)."""
    needs_hidden_states: tuple[int, ...] = ()
    """Target hidden-state layers this drafter reads from `DecodeState.hidden_states` (known after `prepare`)."""
    lossless: ClassVar[bool] = True
    """A drafter only proposes: what is emitted is the verifier's choice (see `Verifier.lossless`)."""
    drafts: ClassVar[bool] = True
    """It proposes tokens; False for the empty drafter (plain decoding)."""
    supports_batch: ClassVar[bool] = False
    """It drafts for a row of a continuous batch (`decoding/continuous.py`): it reads only the row's
    tokens and the logits of its last forward (`DecodeState.tokens`, `forward_*`), never the
    target's cache, hidden states or a forward of its own."""
    needs_training: ClassVar[bool] = False
    """Runs a trained drafter package (`path=`), made with `warpdecode fit`."""
    net_class: ClassVar[type[DraftVocabNet] | None] = None
    """The trained network its package holds (`DrafterPackage.load_net`); None: no such network."""
    onnx_graphs: ClassVar[bool] = False
    """An inference package holds its network's ONNX graphs too (written by `export.drafter_graphs`, named
    by `net_class.graph_files`), which it runs on an ONNX Runtime target."""
    controls: ClassVar[Mapping[str, str]] = NO_CONTROLS
    """The small learned controls it reads: package kind (`drafter.json`'s `kind`) → the option that
    takes its directory, which `registry.package_options` fills from an inference package."""
    device_drafter: ClassVar[type[DeviceDrafter] | None] = None
    """Its form made of tensor ops for the device-resident step (`decoding/device_step`); None: the
    drafter keeps host state and runs in the engine's loop only."""

    def prepare(self, target: Backbone) -> None:
        """Called before each request's timed decode: load weights or build views of `target` here
        (once; later calls should be cheap)."""

    def start(self, state: DecodeState) -> None:
        """Called once after the prefill (e.g. to set up a draft model's cache)."""

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        """A tree of at most `budget` nodes continuing `state.pending`."""
        ...

    def observe(self, state: DecodeState, result: AcceptResult) -> None:
        """Feedback after verification; `state.tokens` already holds the accepted tokens."""


@runtime_checkable
class ResolvesSettings(Protocol):
    """A drafter that chooses some of its options itself when it is prepared (`num_nodes=auto`)."""

    def resolved_settings(self) -> dict[str, Any]:
        """Option → the value chosen (empty until `prepare` has run); reported beside the benchmark row."""
        ...


NO_HIDDEN_STATES: Mapping[int, Tensor] = MappingProxyType({})


class Verifier(Protocol):
    """Verifiers subclass this protocol: most read only the target's logits and keep its defaults."""

    lossless: ClassVar[bool]
    """Output follows the target exactly: greedy token identity at temperature 0, the target's
    distribution when sampling."""
    needs_sampling: ClassVar[bool] = False
    """Runs only when sampling (temperature > 0); greedy decoding refuses it."""
    needs_training: ClassVar[bool] = False
    """Runs a trained package (`path=`), made with `warpdecode fit`."""
    needs_hidden_states: tuple[int, ...] = ()
    """Target hidden-state layers `accept` reads (known after `prepare`)."""

    def prepare(self, target: Backbone) -> None:
        """Called before each request's timed decode, like `Drafter.prepare` (load weights once)."""

    def accept(self, tree: DraftTree, target_logits: Tensor, sampler: Sampler,
               hidden_states: Mapping[int, Tensor] = NO_HIDDEN_STATES) -> AcceptResult:
        """Args:
        tree: the proposal (N nodes).
        target_logits: (N+1, V) target logits over `[pending] + tree` (row 0: after the pending token).
        sampler: the request's sampling filters and random generator.
        hidden_states: layer → (N+1, C) target hidden states over `[pending] + tree`, for the layers
            of `needs_hidden_states`.
        """
        ...


class Controller(Protocol):
    """Controllers subclass this protocol."""

    lossless: ClassVar[None] = None
    """Not a controller's promise: it only sizes drafts, and the verifier decides what is emitted."""
    needs_training: ClassVar[bool] = False
    """Runs a trained package, made with `warpdecode fit`."""

    def start(self, state: DecodeState) -> None:
        """Called once per request after the prefill (reset per-request state)."""

    def budget(self, state: DecodeState) -> int:
        """Largest number of draft nodes to propose this step."""
        ...

    def trim(self, state: DecodeState, tree: DraftTree) -> DraftTree:
        """The part of this step's proposed `tree` to verify (called every step of a request without a
        grammar, an empty tree too, just before its verify forward; `observe` follows it). Default: all."""
        return tree

    def observe(self, result: AcceptResult) -> None:
        """Feedback after verification."""
