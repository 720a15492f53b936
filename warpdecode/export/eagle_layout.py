"""EAGLE drafters in the EAGLE-1 and EAGLE-3 checkpoint layouts that vLLM, SGLang and SafeAILab/EAGLE
load, and back; why warpdecode's own EAGLE network has no such layout (checked against the peers' code).

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
inputs, `LlamaDecoderLayeremb.forward` concatenates `input_layernorm(embeds)` and `hidden_norm(hidden)`
with the unnormed hidden state as the residual, `Model.forward` applies `fc` (3C → C, no bias) only to
the target's three-layer features, `topK_genrate` scores `lm_head(norm(out))` and feeds `out` back) and
vLLM loads it (`vllm/model_executor/models/llama_eagle3.py`: `midlayer.` renamed `layers.0.`, `qkv_proj`
2C wide, `d2t` the offset of each draft id's target id (`target = d2t[i] + i`), `t2d` skipped, an
`embed_tokens` in the checkpoint used instead of the target's; `vllm/v1/worker/gpu_model_runner.py`
`_get_eagle3_aux_layers_from_config`: the target layers from `eagle_aux_hidden_state_layer_ids`, top level
or in `eagle_config`; `vllm/model_executor/models/llama.py`: aux state `idx` is the input of target layer
`idx`, `hidden_states + residual`, collected in layer order, so `fc`'s column blocks are in ascending
layer order). An EagleNet of `layout="eagle3"` is that network (`models/eagle.py`), so it is written as:
`config.json` (`LlamaForCausalLMEagle3`, one layer of the target's shapes, `draft_vocab_size`, the layer
ids), `model.safetensors` with `midlayer.*`, `fc.weight` (C, 3C), `norm.weight`, `lm_head.weight` (N, C),
`d2t` and `t2d`. SafeAILab/EAGLE's own code reads layers 2, L // 2 and L - 3 whatever the config says:
a drafter of other `feature_layers` runs as trained only on vLLM and SGLang. Published EAGLE-3
checkpoints read back into packages that keep their trained `lm_head` (`stores_head`).

warpdecode's default network cannot be written in either layout without changing the function the
drafter computes (a norm of a sum is not a sum of norms), so `convert-drafter` refuses with the
differences in one line rather than write a checkpoint the peer would load without error and draft
garbage with.
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
from warpdecode.models.eagle import EagleNet, default_feature_layers
from warpdecode.models.importers.hf import config_to_hf, state_dict_from_hf, state_dict_to_hf
from warpdecode.models.transformer import Transformer

EAGLE_WEIGHTS = "model.safetensors"

EAGLE1_DIFFERENCES = ("warpdecode's EAGLE block normalises its input (attn_norm) and its output (a final norm before "
                      "the LM head) and fc has a bias, while EAGLE-1 as SafeAILab/EAGLE cnets1.py and vLLM "
                      "llama_eagle.py run it has no input norm in its first layer, no norm before the LM head, and "
                      "vLLM builds fc without a bias")
EAGLE3_DIFFERENCES = ("warpdecode's EAGLE network mixes the feature and the token embedding in fc before one "
                      "normed C-wide block, while EAGLE-3 as SafeAILab/EAGLE cnets.py and vLLM llama_eagle3.py run it "
                      "normalises the embedding and the feature separately and feeds both (2C wide) to attention, "
                      "with no fc between them")
EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"
"""The architecture SafeAILab/EAGLE's EAGLE-3 configs name and vLLM maps to `Eagle3LlamaForCausalLM`."""


def refuse_eagle_export(layout: str, feature_layers: object) -> None:
    """CapabilityError saying what differs between warpdecode's EAGLE and the peer layout `layout`
    ("eagle" or "eagle3"; `feature_layers`: the package's, None for plain EAGLE)."""
    differences = EAGLE3_DIFFERENCES if layout == "eagle3" or feature_layers else EAGLE1_DIFFERENCES
    shape = "eagle3, EAGLE-3's" if layout == "eagle3" or feature_layers else "eagle, EAGLE-1's"
    hint = f" (train with layout: {shape} shape, to export)"
    raise CapabilityError(f"cannot write this EAGLE drafter in the {'EAGLE-3' if layout == 'eagle3' else 'EAGLE'} "
                          f"layout: {differences}; the peer would load it without error and compute another "
                          f"function{hint}")


def looks_like_eagle(names: set[str]) -> bool:
    """Whether the tensor `names` of a checkpoint are an EAGLE / EAGLE-3 head's."""
    return "fc.weight" in names or "fusion_fc.weight" in names or any(n.startswith("midlayer.") for n in names)


def is_eagle3(names: set[str]) -> bool:
    """Whether the tensor `names` of an EAGLE checkpoint are EAGLE-3's (SafeAILab's `midlayer.` or
    the reduced vocabulary's `d2t` / `t2d`)."""
    return any(n.startswith("midlayer.") for n in names) or "d2t" in names or "t2d" in names


def check_llama_target(target: Transformer, layout: str) -> None:
    """CapabilityError unless the peers' Llama draft layer (no biases) can be the target's kind of block."""
    c = target.config
    if c.family != "llama" or c.qkv_bias:
        raise CapabilityError(f"the {layout} layout is written for Llama-family targets (vLLM's llama_eagle.py, "
                              f"llama_eagle3.py), not a {c.family} target{' with q/k/v biases' if c.qkv_bias else ''}")


def write_eagle(package: DrafterPackage, target: Transformer, out: Path, *, where: str) -> Path:
    """Write an EAGLE package of `layout="eagle"` in the EAGLE-1 layout (module docstring); others refused."""
    net = package.load_net(target, EagleNet, where)
    if net.layout != "eagle":
        refuse_eagle_export("eagle", package.config.get("feature_layers"))
    check_llama_target(target, "EAGLE")
    c = target.config
    C = c.d_model
    layer_config = dataclasses.replace(net.config, vocab_size=c.vocab_size, eos_token_ids=c.eos_token_ids)
    config = config_to_hf(layer_config) | {"bias": False, "tree_choices": package.tree.get("rank_paths", [])}
    state = {k: v for k, v in net.layer.state_dict().items() if not k.startswith("lm_head.")}
    weights = {k.removeprefix("model."): v for k, v in state_dict_to_hf(state, layer_config).items()}
    assert net.fc is not None  # EAGLE-1's shape has one
    fc = net.fc.weight.detach()
    weights["fc.weight"] = torch.cat([fc[:, C:], fc[:, :C]], dim=1)  # cat((inputs_embeds, hidden_states))
    weights["token_map"] = net.draft_vocab
    with atomic_directory(out) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file({k: v.detach().cpu().contiguous() if not v.is_floating_point() else v.detach().float().cpu().contiguous()
                   for k, v in weights.items()}, str(tmp / EAGLE_WEIGHTS), metadata={"format": "pt"})
    return out


def read_eagle(source: Path, target: Transformer, *, source_name: str) -> DrafterPackage:
    """A warpdecode EAGLE package from an EAGLE-1 (`layout="eagle"`) or EAGLE-3 (`layout="eagle3"`)
    checkpoint directory for `target`: one-line CheckpointError / CapabilityError naming what does not
    fit the layout's shape."""
    weights: dict[str, Tensor] = {}
    for path in sorted(source.glob("*.safetensors")):
        try:
            weights.update(load_file(str(path)))
        except Exception as e:  # SafetensorError, OSError: a truncated or corrupt file
            raise CheckpointError(f"corrupt weights file {path}: {one_line(e)}") from e
    if is_eagle3(set(weights)):
        return read_eagle3(source, weights, target, source_name=source_name)
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
    tree = _read_config(source).get("tree_choices")
    package = DrafterPackage("eagle", DrafterPackage.describe_target(target, source_name),
                             {"draft_vocab_size": len(vocab), "d_ff": d_ff, "layout": "eagle"}, state,
                             {"rank_paths": tree} if tree else {})
    try:
        package.load_net(target, EagleNet, str(source))  # every weight present and of its shape
    except RuntimeError as e:  # a tensor of another shape than this target's one-layer draft
        raise CheckpointError(f"{source}: the EAGLE weights do not fit this target: {one_line(e, 300)}") from e
    return package


EAGLE3_NAMES = {  # EAGLE-3 checkpoint name → EagleNet(layout="eagle3") state-dict key
    **{f"midlayer.self_attn.{p}_proj.weight": f"layer.blocks.0.attn.{p}_proj.weight" for p in "qkvo"},
    **{f"midlayer.mlp.{p}_proj.weight": f"layer.blocks.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down")},
    "midlayer.input_layernorm.weight": "layer.blocks.0.attn_norm.input_layernorm.weight",
    "midlayer.hidden_norm.weight": "layer.blocks.0.attn_norm.hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight": "layer.blocks.0.mlp_norm.weight",
    "fc.weight": "fuse.weight",
    "norm.weight": "out_norm.weight",
    "lm_head.weight": "layer.lm_head.weight",
}


def write_eagle3(package: DrafterPackage, target: Transformer, out: Path, *, where: str) -> Path:
    """Write an EAGLE package of `layout="eagle3"` in the EAGLE-3 layout (module docstring); others refused."""
    net = package.load_net(target, EagleNet, where)
    if net.layout != "eagle3":
        refuse_eagle_export("eagle3", package.config.get("feature_layers"))
    check_llama_target(target, "EAGLE-3")
    c, C, N = target.config, target.config.d_model, net.config.vocab_size
    layers = sorted(net.feature_layers)
    if layers[0] < 1 or layers[-1] >= c.n_layer:
        raise CapabilityError(f"the EAGLE-3 layout carries inputs of target layers 1..{c.n_layer - 1} (vLLM collects "
                              f"`hidden_states + residual` before those layers), not the embeddings (0) or the final "
                              f"normed state ({c.n_layer}); feature_layers {layers}")
    state = {key: value.detach() for key, value in net.state_dict().items()}
    weights = {name: state[key] for name, key in EAGLE3_NAMES.items()}
    order = [net.feature_layers.index(j) for j in layers]  # fuse's column blocks in layer order, as the peers'
    weights["fc.weight"] = state["fuse.weight"].view(C, 3, C)[:, order].reshape(C, 3 * C)
    vocab = net.draft_vocab.long().cpu()
    weights["d2t"] = vocab - torch.arange(N)
    weights["t2d"] = torch.zeros(c.vocab_size, dtype=torch.bool).index_fill_(0, vocab, True)
    layer_config = dataclasses.replace(net.config, vocab_size=c.vocab_size, eos_token_ids=c.eos_token_ids)
    config = config_to_hf(layer_config) | {
        "architectures": [EAGLE3_ARCHITECTURE], "bias": False, "draft_vocab_size": N,
        "eagle_aux_hidden_state_layer_ids": layers,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": layers, "use_aux_hidden_state": True},
    }
    with atomic_directory(out) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file({k: v.float().cpu().contiguous() if v.is_floating_point() else v.cpu().contiguous()
                   for k, v in weights.items()}, str(tmp / EAGLE_WEIGHTS), metadata={"format": "pt"})
    return out


def read_eagle3(source: Path, weights: dict[str, Tensor], target: Transformer, *, source_name: str) -> DrafterPackage:
    """A warpdecode EAGLE package (`layout="eagle3"`, its own trained head) from an EAGLE-3 checkpoint
    directory's `weights` (SafeAILab's `midlayer.` names or vLLM's `layers.0.`) for `target`: one-line
    CheckpointError / CapabilityError naming what does not fit."""
    c = target.config
    C, V, L = c.d_model, c.vocab_size, c.n_layer
    config = _read_config(source)
    weights = {k.replace("layers.0.", "midlayer.", 1) if k.startswith("layers.0.") else k: v for k, v in weights.items()}
    unknown = sorted(k for k in weights if k not in EAGLE3_NAMES and k not in ("d2t", "t2d", "embed_tokens.weight"))
    if unknown:
        raise CapabilityError(f"{source}: {unknown[0]} is not part of EAGLE-3's one-layer shape, which is what warpdecode "
                              "reads")
    missing = sorted(set(EAGLE3_NAMES) - set(weights))
    if missing:
        raise CheckpointError(f"{source}: the EAGLE-3 checkpoint has no {missing[0]}")
    if config.get("norm_before_residual"):
        raise CapabilityError(f"{source}: norm_before_residual (the residual stream starting from the normed feature) is "
                              "not the EAGLE-3 shape warpdecode runs")
    if config.get("target_hidden_size", C) != C or tuple(weights["fc.weight"].shape) != (C, 3 * C):
        raise CheckpointError(f"{source}: fc.weight must be ({C}, {3 * C}) for this target (three of its {C}-wide "
                              f"hidden states), got {list(weights['fc.weight'].shape)}")
    theta = config.get("rope_theta")
    if theta is not None and (not isinstance(theta, int | float) or float(theta) != float(c.rope_theta)):
        raise CapabilityError(f"{source}: rope_theta {theta!r} differs from the target's {c.rope_theta}, "
                              "which warpdecode's draft layer uses")
    embed = weights.pop("embed_tokens.weight", None)
    if embed is not None and (embed.shape != target.embed.weight.shape or not torch.allclose(
            embed.float(), target.embed.weight.detach().float().cpu(), rtol=1e-2, atol=1e-3)):
        raise CapabilityError(f"{source}: the checkpoint's embed_tokens differs from the target's; warpdecode's EAGLE "
                              "reads the target's embedding")
    N = int(weights["lm_head.weight"].shape[0])
    d2t = weights.pop("d2t", torch.zeros(N, dtype=torch.int64)).long()  # none: the full vocabulary in order
    weights.pop("t2d", None)
    vocab = d2t + torch.arange(N) if d2t.shape == (N,) else torch.empty(0, dtype=torch.int64)
    if len(vocab) != N or N == 0 or int(vocab.min()) < 0 or int(vocab.max()) >= V or len(set(vocab.tolist())) != N:
        raise CheckpointError(f"{source}: d2t must map the {N} draft ids to distinct target ids in 0..{V - 1}")
    ids = config.get("eagle_aux_hidden_state_layer_ids") or (config.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids") or list(default_feature_layers(L, "eagle3"))
    if not (isinstance(ids, list) and len(ids) == 3 and all(isinstance(j, int) and 1 <= j < L for j in ids)
            and len(set(ids)) == 3):
        raise CheckpointError(f"{source}: eagle_aux_hidden_state_layer_ids must be three distinct target layers in "
                              f"1..{L - 1}, got {ids}")
    d_ff = int(weights["midlayer.mlp.up_proj.weight"].shape[0])
    state = {EAGLE3_NAMES[k]: v.float() for k, v in weights.items()}
    state["draft_vocab"] = vocab
    package = DrafterPackage("eagle", DrafterPackage.describe_target(target, source_name),
                             {"draft_vocab_size": N, "d_ff": d_ff, "feature_layers": sorted(ids), "layout": "eagle3",
                              "stores_head": True}, state, {})
    try:
        package.load_net(target, EagleNet, str(source))  # every weight present and of its shape
    except RuntimeError as e:  # a tensor of another shape than this target's one-layer draft
        raise CheckpointError(f"{source}: the EAGLE-3 weights do not fit this target: {one_line(e, 300)}") from e
    return package


def _read_config(source: Path) -> dict:
    """The checkpoint's config.json as a dict ({} when absent); CheckpointError when unreadable."""
    config_path = source / "config.json"
    try:
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{config_path}: cannot read the EAGLE config ({one_line(e)})") from e
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_path}: not a JSON object")
    return config
