"""Why warpdecode's EAGLE network has no EAGLE / EAGLE-3 checkpoint layout (checked against the peers' code).

warpdecode's EAGLE (`models/eagle.py`): `x = fc([f ; embed(t)]) + b` (feature first, with a bias), one
Llama block *with* its input RMSNorm, then a final RMSNorm before the reduced-vocabulary head; EAGLE-3
fuses the target layers with a bias-free `fuse` (3C → C) in front of that same `fc`.

EAGLE-1/2 as SafeAILab/EAGLE runs it (`eagle/model/cnets1.py`: `LlamaDecoderLayer.__init__` keeps
`input_layernorm` only for `index != 0`, `Model.forward` computes `fc(cat((inputs_embeds, hidden_states)))`
and returns the last layer's output unnormed) and vLLM loads it (`vllm/model_executor/models/llama_eagle.py`:
`disable_input_layernorm` for layer 0, `fc` built with `bias=False` so a checkpoint's `fc.bias` is skipped,
`hidden_states + residual` straight into the LM head; the "speculators" names `fusion_fc.*` map onto the
same modules): the first block has no input norm and nothing normalises its output.

EAGLE-3 as SafeAILab/EAGLE runs it (`eagle/model/cnets.py`: `LlamaAttention` projects `hidden_size * 2`
inputs, `LlamaDecoderLayeremb.forward` concatenates `input_layernorm(embeds)` and `hidden_norm(hidden)`,
`fc` maps the three fused target layers `3C → C`, `norm` + `lm_head` over `draft_vocab_size` with `d2t`)
and vLLM (`vllm/model_executor/models/llama_eagle3.py`, the same 2C-wide `qkv_proj`): the embedding and
the feature are normalised separately and meet inside attention, with no `fc` between them.

Neither can be written from warpdecode's weights without changing the function the drafter computes (a
norm of a sum is not a sum of norms), so `convert-drafter` refuses with the differences in one line
rather than write a checkpoint the peer would load without error and draft garbage with; and published
checkpoints of these layouts cannot be read into warpdecode's network for the same reason.
"""

from __future__ import annotations

from pathlib import Path

from warpdecode.errors import CapabilityError

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
    raise CapabilityError(f"cannot write this EAGLE drafter in the {'EAGLE-3' if layout == 'eagle3' else 'EAGLE'} "
                          f"layout: {differences}; the peer would load it without error and compute another function")


def looks_like_eagle(source: Path, names: set[str]) -> bool:
    """Whether the tensor `names` of a checkpoint in `source` are an EAGLE / EAGLE-3 head's."""
    return "fc.weight" in names or "fusion_fc.weight" in names or any(n.startswith("midlayer.") for n in names)


def refuse_eagle_import(source: Path, names: set[str]) -> None:
    """CapabilityError for a published EAGLE / EAGLE-3 checkpoint (see the module docstring)."""
    eagle3 = any(n.startswith("midlayer.") for n in names) or "d2t" in names
    raise CapabilityError(f"{source} is an {'EAGLE-3' if eagle3 else 'EAGLE'} checkpoint, which warpdecode's EAGLE "
                          f"network cannot run: {EAGLE3_DIFFERENCES if eagle3 else EAGLE1_DIFFERENCES}")
