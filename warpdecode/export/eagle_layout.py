"""EAGLE drafters in the EAGLE-1 checkpoint layout that vLLM and SafeAILab/EAGLE load, and back; why
warpdecode's own EAGLE network and EAGLE-3 have no such layout (checked against the peers' code).

warpdecode's EAGLE (`models/eagle.py`): `x = fc([f ; embed(t)]) + b` (feature first, with a bias), one
Llama block *with* its input RMSNorm, then a final RMSNorm before the reduced-vocabulary head; EAGLE-3
fuses the target layers with a bias-free `fuse` (3C → C) in front of that same `fc`.

EAGLE-1/2 as SafeAILab/EAGLE runs it (`eagle/model/cnets1.py`: `LlamaDecoderLayer.__init__` keeps
`input_layernorm` only for `index != 0`, `Model.forward` computes `fc(cat((inputs_embeds, hidden_states)))`
and returns the last layer's output unnormed; `ea_model.py` loads the state dict with `strict=False` and
the embedding from the base model) and vLLM loads it (`vllm/model_executor/models/llama_eagle.py`:
`disable_input_layernorm` for layer 0, `fc` built with `bias=False` so a checkpoint's `fc.bias` is
skipped, `hidden_states + residual` straight into the target's LM head, weight names not among its
parameters skipped; the "speculators" names `fusion_fc.*` map onto `fc`): the first block has no input
norm and nothing normalises its output. An EagleNet of `layout="eagle"` is that network, so it is
written as: `config.json` a one-layer `LlamaForCausalLM` config of the target's shapes (`bias: false`,
SafeAILab's key for fc's bias; `tree_choices` the package's tree), `model.safetensors` with `fc.weight`
(C, 2C) (embedding half first), `layers.0.self_attn.{q,k,v,o}_proj.weight`,
`layers.0.post_attention_layernorm.weight`, `layers.0.mlp.{gate,up,down}_proj.weight`, and `token_map`
(the draft vocabulary, skipped by both peers, which score every token with the target's LM head: equal
to warpdecode's scores on the draft vocabulary).

EAGLE-3 as SafeAILab/EAGLE runs it (`eagle/model/cnets.py`: `LlamaAttention` projects `hidden_size * 2`
inputs, `LlamaDecoderLayeremb.forward` concatenates `input_layernorm(embeds)` and `hidden_norm(hidden)`,
`fc` maps the three fused target layers `3C → C`, `norm` + `lm_head` over `draft_vocab_size` with `d2t`)
and vLLM (`vllm/model_executor/models/llama_eagle3.py`, the same 2C-wide `qkv_proj`): the embedding and
the feature are normalised separately and meet inside attention, with no `fc` between them. Neither
that nor warpdecode's default network can be written without changing the function the drafter
computes (a norm of a sum is not a sum of norms), so `convert-drafter` refuses with the differences in
one line rather than write a checkpoint the peer would load without error and draft garbage with, and
published checkpoints of those shapes are refused on import for the same reason.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from warpdecode.errors import CapabilityError, CheckpointError, one_line
from warpdecode.io import atomic_directory
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.models.eagle import EagleNet
from warpdecode.models.importers.hf import config_to_hf, state_dict_from_hf, state_dict_to_hf
from warpdecode.models.transformer import Transformer

EAGLE_WEIGHTS = "model.safetensors"

EAGLE1_DIFFERENCES = ("warpdecode's EAGLE block normalises its input (attn_norm) and its output (a final norm before "
                      "the LM head) and fc has a bias, while EAGLE-1 as SafeAILab/EAGLE cnets1.py and vLLM "
                      "llama_eagle.py run it has no input norm in its first layer, no norm before the LM head, and "
                      "vLLM builds fc without a bias")
EAGLE3_DIFFERENCES = ("warpdecode's EAGLE-3 drafter mixes the fused feature and the token embedding in fc before one "
                      "normed C-wide block, while EAGLE-3 as SafeAILab/EAGLE cnets.py and vLLM llama_eagle3.py run it "
                      "normalises the embedding and the feature separately and feeds both (2C wide) to attention, "
                      "with no fc between them")


def refuse_eagle_export(layout: str, feature_layers: object) -> None:
    """CapabilityError saying what differs between warpdecode's EAGLE and the peer layout `layout`
    ("eagle" or "eagle3"; `feature_layers`: the package's, None for plain EAGLE)."""
    differences = EAGLE3_DIFFERENCES if layout == "eagle3" or feature_layers else EAGLE1_DIFFERENCES
    hint = "" if layout == "eagle3" or feature_layers else " (train with layout: eagle, EAGLE-1's shape, to export)"
    raise CapabilityError(f"cannot write this EAGLE drafter in the {'EAGLE-3' if layout == 'eagle3' else 'EAGLE'} "
                          f"layout: {differences}; the peer would load it without error and compute another "
                          f"function{hint}")


def looks_like_eagle(names: set[str]) -> bool:
    """Whether the tensor `names` of a checkpoint are an EAGLE / EAGLE-3 head's."""
    return "fc.weight" in names or "fusion_fc.weight" in names or any(n.startswith("midlayer.") for n in names)


def refuse_eagle3_import(source: Path, names: set[str]) -> None:
    """CapabilityError for a published EAGLE-3 checkpoint (see the module docstring)."""
    if any(n.startswith("midlayer.") for n in names) or "d2t" in names:
        raise CapabilityError(f"{source} is an EAGLE-3 checkpoint, which warpdecode's EAGLE network cannot run: "
                              f"{EAGLE3_DIFFERENCES}")


def write_eagle(package: DrafterPackage, target: Transformer, out: Path, *, where: str) -> Path:
    """Write an EAGLE package of `layout="eagle"` in the EAGLE-1 layout (module docstring); others refused."""
    net = package.load_net(target, EagleNet, where)
    if net.layout != "eagle":
        refuse_eagle_export("eagle", package.config.get("feature_layers"))
    c = target.config
    if c.family != "llama" or c.qkv_bias:
        raise CapabilityError(f"the EAGLE layout is written for Llama-family targets (vLLM's llama_eagle.py), "
                              f"not a {c.family} target{' with q/k/v biases' if c.qkv_bias else ''}")
    C = c.d_model
    layer_config = dataclasses.replace(net.config, vocab_size=c.vocab_size, eos_token_ids=c.eos_token_ids)
    config = config_to_hf(layer_config) | {"bias": False, "tree_choices": package.tree.get("rank_paths", [])}
    state = {k: v for k, v in net.layer.state_dict().items() if not k.startswith("lm_head.")}
    weights = {k.removeprefix("model."): v for k, v in state_dict_to_hf(state, layer_config).items()}
    fc = net.fc.weight.detach()
    weights["fc.weight"] = torch.cat([fc[:, C:], fc[:, :C]], dim=1)  # cat((inputs_embeds, hidden_states))
    weights["token_map"] = net.draft_vocab
    with atomic_directory(out) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file({k: v.detach().cpu().contiguous() if not v.is_floating_point() else v.detach().float().cpu().contiguous()
                   for k, v in weights.items()}, str(tmp / EAGLE_WEIGHTS), metadata={"format": "pt"})
    return out


def read_eagle(source: Path, target: Transformer, *, source_name: str) -> DrafterPackage:
    """A warpdecode EAGLE package (`layout="eagle"`) from an EAGLE-1 checkpoint directory for `target`:
    one-line CheckpointError / CapabilityError naming what does not fit EAGLE-1's shape."""
    weights: dict[str, Tensor] = {}
    for path in sorted(source.glob("*.safetensors")):
        try:
            weights.update(load_file(str(path)))
        except Exception as e:  # SafetensorError, OSError: a truncated or corrupt file
            raise CheckpointError(f"corrupt weights file {path}: {one_line(e)}") from e
    weights = {{"fusion_fc.weight": "fc.weight", "fusion_fc.bias": "fc.bias"}.get(k, k): v for k, v in weights.items()}
    C, V = target.config.d_model, target.config.vocab_size
    fc = weights.pop("fc.weight", None)
    if fc is None or tuple(fc.shape) != (C, 2 * C):
        raise CheckpointError(f"{source}: fc.weight must be ({C}, {2 * C}) for this target, got "
                              f"{None if fc is None else list(fc.shape)}")
    bias = weights.pop("fc.bias", None)
    if bias is not None and bool(bias.abs().max() > 0):
        raise CapabilityError(f"{source}: fc has a bias, which vLLM's EAGLE drops and warpdecode's EAGLE-1 shape does "
                              "not have")
    unlike = sorted(k for k in weights if k.startswith(("layers.0.input_layernorm", "layers.1.", "norm.",
                                                        "embedding_layernorm", "hidden_states_layernorm",
                                                        "pre_lm_head_layernorm")))
    if unlike:
        raise CapabilityError(f"{source}: {unlike[0]} is not part of EAGLE-1's shape (one layer, no input norm in it, "
                              "no norm after it), which is what warpdecode reads")
    vocab = weights.pop("token_map", torch.arange(V)).long()
    if vocab.ndim != 1 or len(vocab) == 0 or int(vocab.min()) < 0 or int(vocab.max()) >= V:
        raise CheckpointError(f"{source}: token_map must be target token ids in 0..{V - 1}")
    for name in ("embed_tokens.weight", "lm_head.weight"):  # the target's, read from it by both peers
        weights.pop(name, None)
    up = weights.get("layers.0.mlp.up_proj.weight")
    d_ff = target.config.d_ff if up is None else int(up.shape[0])
    net = EagleNet(target.config, len(vocab), d_ff, layout="eagle")
    layer = state_dict_from_hf({f"model.{k}": v.float() for k, v in weights.items()}, net.config)
    state = {f"layer.{k}": v for k, v in layer.items()}
    state["fc.weight"] = torch.cat([fc[:, C:], fc[:, :C]], dim=1).float()
    state["draft_vocab"] = vocab
    config_path = source / "config.json"
    try:
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{config_path}: cannot read the EAGLE config ({one_line(e)})") from e
    tree = config.get("tree_choices") if isinstance(config, dict) else None
    package = DrafterPackage("eagle", DrafterPackage.describe_target(target, source_name),
                             {"draft_vocab_size": len(vocab), "d_ff": d_ff, "layout": "eagle"}, state,
                             {"rank_paths": tree} if tree else {})
    try:
        package.load_net(target, EagleNet, str(source))  # every weight present and of its shape
    except RuntimeError as e:  # a tensor of another shape than this target's one-layer draft
        raise CheckpointError(f"{source}: the EAGLE weights do not fit this target: {one_line(e, 300)}") from e
    return package
