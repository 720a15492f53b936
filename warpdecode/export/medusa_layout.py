"""Medusa heads in the checkpoint layouts of FasterDecoding/Medusa and of vLLM, written and read back.

FasterDecoding/Medusa (`medusa/model/medusa_model.py`, `MedusaConfig` and `MedusaModelABC.__init__`;
`medusa/train/train_legacy.py` saves `medusa_lm_head.safetensors`): `config.json` has
`medusa_num_heads`, `medusa_num_layers` and `base_model_name_or_path`; the weights are the state dict of
`medusa_head = ModuleList(Sequential(*[ResBlock(C)] * medusa_num_layers, Linear(C, V, bias=False)))`:

    {i}.{j}.linear.weight (C, C), {i}.{j}.linear.bias (C,)     head i, residual block j: x + SiLU(W x + b)
    {i}.{num_layers}.weight (V, C)                              head i's LM head over the whole vocabulary

`[ResBlock(C)] * n` repeats one module, so that code runs one block n times: heads of several distinct
blocks are refused for this layout (vLLM's keeps them apart). The legacy model that
`train_legacy.py` trains (`medusa/model/medusa_model_legacy.py`) has no per-head `Linear`: its heads
score through the base model's `lm_head`, as warpdecode's do; it loads the written file too
(`load_state_dict(strict=False)` skips `{i}.{num_layers}.weight`, which equals that LM head), and a
legacy checkpoint without those tensors is read back as it is.

vLLM (`vllm/model_executor/models/medusa.py`, `Medusa.__init__` / `load_weights`; the config is
`vllm/transformers_utils/configs/medusa.py`, which renames `medusa_num_heads` / `medusa_num_layers`):
`blocks.{i}.layers.{j}.weight` / `.bias` (bias only with `medusa_fc_bias`), and with `original_lm_head`
one LM head `lm_heads.0.weight` (N, C) shared by every head; `token_map` (N,) int64 names the target
token of each of its rows when `truncated_vocab_size` N < `vocab_size` (vLLM scores the other tokens
-inf). That is exactly warpdecode's reduced-vocabulary head, so the vLLM layout reproduces the drafter's
drafts token for token; the Medusa layout scores the whole vocabulary (each head's LM head is the
target's, the rows of the draft vocabulary as warpdecode scores them) and also stores `token_map`, which
that code ignores (`load_state_dict(strict=False)`) and `read_medusa` uses to restore the drafter exactly.

Hydra heads read the drafted tokens' embeddings besides the feature: neither layout has inputs for them,
so they are refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from warpdecode.errors import CapabilityError, CheckpointError
from warpdecode.io import atomic_directory
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.models.medusa import MedusaHeads, ResBlock
from warpdecode.models.transformer import Transformer

MEDUSA_WEIGHTS = "medusa_lm_head.safetensors"
VLLM_WEIGHTS = "model.safetensors"


def _heads(package: DrafterPackage, target: Transformer, where: str) -> MedusaHeads:
    if package.kind != "medusa":
        raise CapabilityError(f"{where} holds {package.kind} heads; only Medusa heads have a Medusa layout "
                              "(Hydra's heads also read the drafted tokens' embeddings, which Medusa's and vLLM's "
                              "heads have no input for)" if package.kind == "hydra" else
                              f"{where} holds a {package.kind!r} drafter, not Medusa heads")
    return package.load_net(target, MedusaHeads, where)


def write_medusa(package: DrafterPackage, target: Transformer, out: Path, *, where: str, layout: str,
                 base_model: str) -> Path:
    """Write a Medusa package in `layout` "medusa" (FasterDecoding's) or "vllm" (see the module docstring);
    `base_model`: the target's Hugging Face directory (`base_model_name_or_path`, where Medusa's code loads it)."""
    heads = _heads(package, target, where)
    K, layers, C = heads.num_heads, heads.num_layers, target.config.d_model
    blocks = [[cast(ResBlock, block).linear for block in cast(nn.Sequential, stack)] for stack in heads.heads]
    if layout == "medusa" and layers > 1 and any(
            not torch.equal(b[0].weight, x.weight) or not torch.equal(b[0].bias, x.bias) for b in blocks for x in b[1:]):
        raise CapabilityError(f"these heads have {layers} distinct residual blocks each, but FasterDecoding's Medusa "
                              "repeats one block module ([ResBlock] * medusa_num_layers) and would keep only the last; "
                              "write --format vllm-medusa, or train with num_layers=1")
    vocab = heads.draft_vocab.cpu()
    config: dict[str, Any] = {"medusa_num_heads": K, "medusa_num_layers": layers, "hidden_size": C,
                              "vocab_size": target.config.vocab_size,
                              "base_model_name_or_path": base_model,
                              "medusa_choices": package.tree.get("rank_paths", [])}
    weights: dict[str, Tensor] = {}
    if layout == "medusa":
        full_head = target.output_embeddings().detach().float().cpu()
        for i, stack in enumerate(blocks):
            for j, linear in enumerate(stack):
                weights[f"{i}.{j}.linear.weight"], weights[f"{i}.{j}.linear.bias"] = linear.weight, linear.bias
            weights[f"{i}.{layers}.weight"] = full_head.clone()  # safetensors stores no shared tensors
        weights["token_map"] = vocab
        name = MEDUSA_WEIGHTS
    else:
        config |= {"model_type": "medusa", "architectures": ["MedusaModel"], "num_heads": K,
                   "num_hidden_layers": layers, "truncated_vocab_size": len(vocab), "medusa_fc_bias": True,
                   "original_lm_head": True}
        del config["medusa_num_heads"], config["medusa_num_layers"]
        for i, stack in enumerate(blocks):
            for j, linear in enumerate(stack):
                weights[f"blocks.{i}.layers.{j}.weight"], weights[f"blocks.{i}.layers.{j}.bias"] = linear.weight, linear.bias
        if len(vocab) < target.config.vocab_size:
            weights["lm_heads.0.weight"], weights["token_map"] = heads.head.weight, vocab
        else:  # vLLM ignores token_map without truncation: the rows go in token-id order instead
            weights["lm_heads.0.weight"] = heads.head.weight[torch.argsort(vocab.to(heads.head.weight.device))]
        name = VLLM_WEIGHTS
    with atomic_directory(out) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file({k: v.detach().float().cpu().contiguous() if v.is_floating_point() else v.contiguous()
                   for k, v in weights.items()}, str(tmp / name), metadata={"format": "pt"})
    return out


def _int(config: dict[str, Any], where: Path, *keys: str) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    raise CheckpointError(f"{where}: config.json needs a positive integer {' or '.join(keys)}")


def read_medusa(source: Path, target: Transformer, *, source_name: str) -> DrafterPackage:
    """A warpdecode Medusa package from a checkpoint in either layout (the one whose weights file
    `source` holds), for `target`, which every head's LM head must equal (warpdecode's heads share the
    target's frozen LM head): a one-line CheckpointError names what does not fit."""
    config_path = source / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{config_path}: cannot read the Medusa config ({e})") from e
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_path}: expected a JSON object")
    K = _int(config, config_path, "medusa_num_heads", "num_heads")
    layers = _int(config, config_path, "medusa_num_layers", "num_hidden_layers")
    vllm = (source / VLLM_WEIGHTS).is_file() and not (source / MEDUSA_WEIGHTS).is_file()
    path = source / (VLLM_WEIGHTS if vllm else MEDUSA_WEIGHTS)
    try:
        weights = load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e}); Medusa checkpoints saved as "
                              ".pt are not read (convert them to safetensors)") from e
    V, C = target.config.vocab_size, target.config.d_model
    vocab = weights.get("token_map", torch.arange(V)).long()
    if vocab.ndim != 1 or len(vocab) == 0 or int(vocab.min()) < 0 or int(vocab.max()) >= V:
        raise CheckpointError(f"{path}: token_map must be target token ids in 0..{V - 1}")
    target_head = target.output_embeddings().detach().float().cpu()
    state: dict[str, Tensor] = {}
    for i in range(K):
        for j in range(layers):
            prefix = f"blocks.{i}.layers.{j}" if vllm else f"{i}.{j}.linear"
            for part in ("weight", "bias"):
                tensor = weights.get(f"{prefix}.{part}")
                if tensor is None:
                    raise CheckpointError(f"{path}: no tensor {prefix}.{part} (config.json says {K} heads of "
                                          f"{layers} blocks; warpdecode's residual blocks have biases)")
                want = (C, C) if part == "weight" else (C,)
                if tuple(tensor.shape) != want:
                    raise CheckpointError(f"{path}: {prefix}.{part} is {list(tensor.shape)}, not {list(want)} "
                                          f"(hidden size {C} of the target)")
                state[f"heads.{i}.{j}.linear.{part}"] = tensor.float()
        shared = config.get("original_lm_head") is True
        head_name = (f"lm_heads.{0 if shared else i}.weight" if vllm else f"{i}.{layers}.weight")
        head = weights.get(head_name)
        if head is None and not vllm:  # the legacy layout: every head reads the base model's LM head
            continue
        rows = target_head[vocab] if vllm and "token_map" in weights else target_head
        if head is None or head.shape != rows.shape or not torch.allclose(head.float(), rows, atol=1e-5, rtol=1e-4):
            raise CheckpointError(f"{path}: head {i}'s LM head {head_name} is not the target's LM head "
                                  f"{'rows of token_map' if vllm else ''} (warpdecode's heads share the target's "
                                  "frozen LM head; heads trained with their own are not supported)")
    state["draft_vocab"] = vocab
    package = DrafterPackage("medusa", DrafterPackage.describe_target(target, source_name),
                             {"draft_vocab_size": len(vocab), "num_heads": K, "num_layers": layers}, state,
                             {"rank_paths": config["medusa_choices"]} if config.get("medusa_choices") else {})
    package.load_net(target, MedusaHeads, str(source))  # the package must load: shapes checked once more
    return package
