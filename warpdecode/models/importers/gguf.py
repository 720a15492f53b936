"""GGUF → Hugging Face layout, through `transformers`' GGUF reader (dequantises to fp32).

Needs the `[hf]` extra (transformers, gguf, accelerate). The GGUF file's own tokenizer (vocabulary,
merges, chat template) becomes tokenizer.json / tokenizer_config.json.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from warpdecode.errors import CheckpointError, ConfigError
from warpdecode.models.config import ModelConfig
from warpdecode.models.importers.hf import config_from_hf
from warpdecode.models.tokenizer import Tokenizer


def read_gguf(path: Path) -> tuple[ModelConfig, dict[str, Tensor], Tokenizer]:
    """Dequantise a GGUF checkpoint into (config, Hugging Face-named fp32 weights, tokenizer)."""
    try:
        import transformers
    except ImportError as e:
        raise ConfigError("reading GGUF files needs the [hf] extra: pip install 'warpdecode[hf]'") from e
    if not path.is_file():
        raise CheckpointError(f"GGUF file not found: {path}")
    with path.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise CheckpointError(f"{path} is not a GGUF file (bad magic bytes)")
    transformers.logging.set_verbosity_error()
    try:
        hf_tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        hf_model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        )
    except (OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"cannot read GGUF checkpoint {path}: {e}") from e
    config = config_from_hf(hf_model.config.to_dict())
    weights = {k: v.detach().clone().contiguous() for k, v in hf_model.state_dict().items()}
    backend = hf_tok.backend_tokenizer
    tokenizer = Tokenizer(
        backend,
        eos_token=hf_tok.eos_token,
        bos_token=hf_tok.bos_token,
        chat_template=hf_tok.chat_template,
    )
    return config, weights, tokenizer
