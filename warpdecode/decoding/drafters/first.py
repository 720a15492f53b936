"""FiRST routing as a drafter: the target minus the blocks its trained routers skip for this prompt.

At the start of each request the routers (`models/layer_router.py`, trained by
`modules/layer_router.py`) read the prompt's block inputs from the target's prefill and pick the
blocks to skip; the request then drafts with that fixed layer subset (weights shared with the
target, KV cache copied from the target's as in `layer_skip`, optionally over the int4/int8 copy).

* With a lossless verifier it is a layer-skip self-speculation whose skip set is learned per
  prompt rather than searched while decoding: greedy output stays identical to the target's.
* With `verifier=trust` the skipping model writes its whole chain and the full target runs one
  forward per `num_tokens + 1` tokens (its bonus token): FiRST's lossy trade, with the share of
  tokens that differ from the full model's reported as agreement.

On a PyTorch target the prefill returns every block input for the routers (and each verify forward
then returns them for the accepted positions too: the engine asks for the same layers every
forward); on another backend the drafter runs the prompt once more through the same weights in
PyTorch for them. The routers run once per request.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar

import torch

from warpdecode.decoding.drafters.layer_skip import LayerSkipDrafter
from warpdecode.decoding.protocols import DecodeState
from warpdecode.decoding.registry import register
from warpdecode.errors import ConfigError
from warpdecode.models.backbone import Backbone
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.models.layer_router import LayerRouter, LayerRouterConfig, prompt_means, skipped_layers

KIND = "layer_router"


def load_layer_router(path: str, target: Backbone) -> tuple[LayerRouter, LayerRouterConfig]:
    """The routers of a `layer_router` package, checked to be trained for `target`, and their config."""
    package = DrafterPackage.load(path, KIND)
    package.check_target(target)
    config = LayerRouterConfig.from_dict(package.config, f"{path}/drafter.json")
    router = LayerRouter.from_config(config)
    router.load_state_dict(package.weights)
    return router.to(target.embed.weight.device).eval(), config


@register("drafter", "first")
class FirstDrafter(LayerSkipDrafter):
    needs_training: ClassVar[bool] = True
    controls: ClassVar[Mapping[str, str]] = MappingProxyType({KIND: "router"})

    def __init__(self, router: str | None = None, num_tokens: int = 4, bits: int | None = None,
                 threshold: float | None = None, max_skip: int | None = None) -> None:
        """Args:
        router: a layer-router package (`warpdecode fit --config configs/controls/first.yaml`).
        num_tokens: longest draft chain per step.
        bits: draft over the target's int4 or int8 weight-only copy (default: the fp32 weights).
        threshold: skip a block whose gate is below this (default: the package's).
        max_skip: skip at most this many blocks (default: the package's).
        """
        if router is None:
            raise ConfigError("first needs router= (a layer-router package trained with configs/controls/first.yaml)")
        if threshold is not None and not 0 < threshold <= 1:
            raise ConfigError(f"first threshold must be in (0, 1], got {threshold}")
        if max_skip is not None and max_skip < 0:
            raise ConfigError(f"first max_skip must be >= 0, got {max_skip}")
        super().__init__(num_skip=1, num_tokens=num_tokens, bits=bits, search_steps=0)
        self.router_path, self.threshold_option, self.max_skip_option = router, threshold, max_skip
        self.threshold, self.max_skip = threshold, max_skip
        """In effect: the options given, else the package's."""
        self.router: LayerRouter | None = None
        self.routed_for: Backbone | None = None

    def prepare(self, target: Backbone) -> None:
        super().prepare(target)
        if self.routed_for is not target:
            self.router, config = load_layer_router(self.router_path, target)
            threshold, max_skip = self.threshold_option, self.max_skip_option
            self.threshold = float(config.threshold if threshold is None else threshold)
            self.max_skip = config.max_skip if max_skip is None else max_skip
            self.routed_for = target
        # A PyTorch target returns the block inputs with its prefill; another backend (an ONNX graph
        # exports only the drafters' layers) gets them from a forward of the same weights in PyTorch.
        self.needs_hidden_states = tuple(range(target.config.n_layer)) if target.torch_model() is target else ()

    @torch.inference_mode()
    def first_skip(self, state: DecodeState) -> list[int]:
        """The blocks this request skips, from the prompt's block inputs in `state.hidden_states`."""
        assert self.router is not None and self.threshold is not None
        L = state.target.config.n_layer
        if self.needs_hidden_states:
            inputs = state.hidden_states
        else:
            prompt = torch.tensor([state.tokens[: state.prompt_len]], device=state.target.embed.weight.device)
            inputs = {k: v[0] for k, v in state.target.torch_model()(prompt, hidden_layers=range(L),
                                                                    logits_slice=slice(0, 0)).hidden_states.items()}
        hidden = torch.stack([inputs[layer] for layer in range(L)])  # (L, T, C) over the prompt
        gates = self.router(prompt_means(hidden[None]))[0]  # (L,)
        return skipped_layers(gates, self.threshold, self.max_skip)
