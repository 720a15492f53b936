"""`warpdecode convert-drafter`: a trained drafter in the layout another engine loads, and back.

Each format names what it writes and which drafter kind it takes; the writers live beside the layout
they follow (`draft_model_formats.py`, `medusa_layout.py`, `eagle_layout.py`), and docs/export.md says
which peer loads what, with its command line.
"""

from __future__ import annotations

from pathlib import Path

from safetensors import safe_open

from warpdecode.errors import CapabilityError, CheckpointError, ConfigError, one_line
from warpdecode.export.draft_model_formats import (
    distilled_causal_lm,
    write_gguf_draft_model,
    write_hf_draft_model,
)
from warpdecode.export.eagle_layout import (
    looks_like_eagle,
    read_eagle,
    write_eagle,
    write_eagle3,
)
from warpdecode.export.medusa_layout import MEDUSA_WEIGHTS, VLLM_WEIGHTS, read_medusa, write_medusa
from warpdecode.models.drafter_package import DrafterPackage
from warpdecode.models.tokenizer import Tokenizer
from warpdecode.models.transformer import Transformer

FORMATS = {
    "hf": ("distilled", "a Hugging Face model directory (transformers, vLLM / SGLang draft models)"),
    "gguf": ("distilled", "a GGUF file (llama.cpp --model-draft)"),
    "medusa": ("medusa", "FasterDecoding/Medusa's layout (config.json + medusa_lm_head.safetensors)"),
    "vllm-medusa": ("medusa", "vLLM's Medusa layout (config.json + model.safetensors with token_map)"),
    "eagle": ("eagle", "the EAGLE-1 checkpoint layout of SafeAILab/EAGLE and vLLM (drafters of layout=eagle)"),
    "eagle3": ("eagle", "the EAGLE-3 checkpoint layout of SafeAILab/EAGLE, SGLang and vLLM (drafters of layout=eagle3)"),
    "warpdecode": ("medusa", "a warpdecode drafter package from a Medusa, vLLM-Medusa, EAGLE-1 or EAGLE-3 checkpoint"),
}
"""format → (the drafter kind it takes or makes, what it is)."""


def check_format(fmt: str, out: Path) -> None:
    """ConfigError for an unknown format, or a GGUF output not named `*.gguf`."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt == "gguf" and out.suffix != ".gguf":
        raise ConfigError(f"--format gguf writes one file: name it NAME.gguf, got {out}")
    if fmt != "gguf" and out.suffix == ".gguf":
        raise ConfigError(f"--format {fmt} writes a directory, not {out}")


def load_package(source: Path, fmt: str) -> DrafterPackage:
    """The drafter package at `source`, of the kind `fmt` takes (a one-line error otherwise)."""
    package = DrafterPackage.load(source)
    kind = FORMATS[fmt][0]
    if package.kind != kind:
        if fmt in ("medusa", "vllm-medusa"):  # the Medusa writer says why Hydra heads have no such layout
            return package
        raise CapabilityError(f"--format {fmt} writes {kind} drafters; {source} holds a drafter of kind {package.kind!r} "
                              f"(formats for it: {', '.join(f for f, (k, _) in FORMATS.items() if k == package.kind and f != 'warpdecode') or 'none'})")
    return package


def convert_drafter(source: Path, out: Path, fmt: str, target: Transformer, tokenizer: Tokenizer, *,
                    target_name: str, target_directory: Path, tokenizer_gguf: Path | None) -> Path:
    """Convert `source` into `fmt` at `out` (see `FORMATS`) for `target`; returns the written path.

    Args:
        target_name: how the target was named (recorded in an imported package, and GGUF's name).
        target_directory: the target's model directory (a Hugging Face checkpoint).
        tokenizer_gguf: the target's own GGUF file, if it is one (its tokenizer fields are copied).
    """
    if fmt == "warpdecode":
        return import_checkpoint(source, target, target_name).save(out)
    package = load_package(source, fmt)
    where = str(source)
    if fmt in ("hf", "gguf"):
        model = distilled_causal_lm(package, target, where)
        if fmt == "hf":
            return write_hf_draft_model(model, tokenizer, out)
        return write_gguf_draft_model(model, tokenizer, out, name=f"{target_name} distilled draft",
                                      tokenizer_gguf=tokenizer_gguf)
    if fmt == "eagle":
        return write_eagle(package, target, out, where=where)
    if fmt == "eagle3":
        return write_eagle3(package, target, out, where=where)
    return write_medusa(package, target, out, where=where, layout="medusa" if fmt == "medusa" else "vllm",
                        base_model=str(target_directory.resolve()))


def import_checkpoint(source: Path, target: Transformer, target_name: str) -> DrafterPackage:
    """A warpdecode package from a peer's drafter checkpoint directory (Medusa layouts, EAGLE-1, EAGLE-3)."""
    if not source.is_dir():
        raise CheckpointError(f"{source} is not a checkpoint directory")
    names: set[str] = set()
    for path in sorted(source.glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt") as f:
                names |= set(f.keys())
        except Exception as e:  # SafetensorError, OSError, or whatever a corrupt header provokes
            raise CheckpointError(f"corrupt weights file {path}: {one_line(e)}") from e
    if looks_like_eagle(names):
        return read_eagle(source, target, source_name=target_name)
    if not (source / MEDUSA_WEIGHTS).is_file() and not (source / VLLM_WEIGHTS).is_file():
        raise CheckpointError(f"{source} holds neither {MEDUSA_WEIGHTS} (FasterDecoding/Medusa) nor {VLLM_WEIGHTS} "
                              "(vLLM's Medusa): no Medusa checkpoint to read")
    return read_medusa(source, target, source_name=target_name)
