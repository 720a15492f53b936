"""A distilled draft model as an ordinary causal LM: a Hugging Face model directory or a GGUF file.

The distilled network (`models/distilled_draft.py`) is `n_layer` blocks and a norm over the target's
token embedding, scored by the target's LM-head rows of its draft vocabulary. Written out, it becomes
the target's architecture with `n_layer` blocks: the target's embedding and LM head (all V rows, tied
as the target ties them), its own blocks and norm. So the written model's logits on the draft
vocabulary are exactly the drafter's (tested); tokens outside it, which warpdecode never drafts, are
scored by the target's head rows too, so a peer's greedy draft may pick one where warpdecode's would
not (it happens where the drafter's best draft-vocabulary token is outscored by a rare one).

Peers: `transformers` (`AutoModelForCausalLM.from_pretrained(out)`, `assistant_model=` in `generate`),
vLLM / SGLang as a draft model (`"method": "draft_model"` / `--speculative-draft-model-path`), and
llama.cpp (`--model-draft out.gguf`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from warpdecode.export.gguf_writer import write_gguf
from warpdecode.models.checkpoint import save_pretrained
from warpdecode.models.distilled_draft import DistilledDraftNet
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.models.tokenizer import Tokenizer
from warpdecode.models.transformer import Transformer, rope_inv_freq


def distilled_causal_lm(package: DrafterPackage, target: Transformer, where: str) -> Transformer:
    """The package's distilled draft as a full-vocabulary causal LM of the target's architecture.

    Args:
        package: a `distilled` drafter package trained for `target` (checked: `CheckpointError`).
        where: the package's path, for messages.
    """
    net = package.load_net(target, DistilledDraftNet, where)
    config = dataclasses.replace(target.config, n_layer=net.config.n_layer)
    with torch.device("meta"):
        model = Transformer(config)
    state = {f"blocks.{k}": v for k, v in net.model.blocks.state_dict().items()}
    state |= {f"norm.{k}": v for k, v in net.model.norm.state_dict().items()}
    state["embed.weight"] = target.embed.weight
    if target.lm_head is not None:
        state["lm_head.weight"] = target.lm_head.weight
    model.load_state_dict({k: v.detach().float().cpu().clone() for k, v in state.items()}, strict=True, assign=True)
    if config.position == "rope":  # a non-persistent buffer, rebuilt off the meta device
        model.inv_freq = rope_inv_freq(config)
    return model.eval()


def write_hf_draft_model(model: Transformer, tokenizer: Tokenizer, out: Path) -> Path:
    """config.json + model.safetensors + tokenizer files (`transformers` loads the directory)."""
    save_pretrained(model, tokenizer, out)
    return out


def write_gguf_draft_model(model: Transformer, tokenizer: Tokenizer, out: Path, *, name: str,
                           tokenizer_gguf: Path | None) -> Path:
    """A float32 GGUF for llama.cpp's `--model-draft` (`export/gguf_writer.py`)."""
    return write_gguf(model, tokenizer, out, name=name, tokenizer_gguf=tokenizer_gguf)
