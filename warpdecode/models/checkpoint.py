"""Load and save model directories (Hugging Face layout: config.json, *.safetensors, tokenizer files).

`load_pretrained` accepts a model directory, a `.gguf` file or a registered model name; GGUF files
and names are converted once into the cache directory (`$WARPDECODE_CACHE`, default
`~/.cache/warpdecode`) and loaded from there afterwards.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor

from warpdecode.errors import CapabilityError, CheckpointError, ConfigError, one_line
from warpdecode.io import atomic_directory
from warpdecode.models.config import ModelConfig
from warpdecode.models.importers.gguf import read_gguf
from warpdecode.models.importers.gguf_quantized import read_gguf_quantized
from warpdecode.models.importers.gguf_stream import streams, write_streamed
from warpdecode.models.importers.hf import (
    config_from_hf,
    config_to_hf,
    shape_mismatch,
    state_dict_from_hf,
    state_dict_to_hf,
)
from warpdecode.models.named import NAMED_MODELS, cache_dir, named_model_gguf
from warpdecode.models.random_shapes import is_random, random_config
from warpdecode.models.tokenizer import Tokenizer
from warpdecode.models.transformer import Transformer, rope_inv_freq

WEIGHTS_FILE = "model.safetensors"
MAX_CONFIG_BYTES = 16 << 20
"""A config.json is a few kilobytes; a larger one is not read whole into memory."""


def write_checkpoint(
    directory: Path, config: ModelConfig, hf_weights: dict[str, Tensor], tokenizer: Tokenizer | None,
    *, replace: bool = True,
) -> None:
    """Write a Hugging Face-layout checkpoint atomically (a half-written directory never appears);
    `replace=False` for a cache entry (`atomic_directory`)."""
    with atomic_directory(directory, replace=replace) as tmp:
        (tmp / "config.json").write_text(json.dumps(config_to_hf(config), indent=2) + "\n")
        save_file({k: v.contiguous() for k, v in hf_weights.items()}, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        if tokenizer is not None:
            tokenizer.save(tmp)


def save_pretrained(model: Transformer, tokenizer: Tokenizer | None, directory: str | Path) -> None:
    state = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    write_checkpoint(Path(directory), model.config, state_dict_to_hf(state, model.config), tokenizer)


def convert(source: str | Path, out: str | Path, *, replace: bool = True) -> Path:
    """Convert a HF directory, a GGUF file or a registered name into a warpdecode model directory.
    `replace=False`: `out` is a cache entry that a concurrent conversion may have completed first (theirs
    is kept: replacing it would delete files a reader of theirs has open)."""
    out = Path(out)
    if str(source) in NAMED_MODELS:
        source = named_model_gguf(str(source))
    source = Path(source)
    tokenizer: Tokenizer | None
    if source.suffix == ".gguf" and source.is_file() and streams(source):
        with atomic_directory(out, replace=replace) as tmp:  # one tensor in memory at a time
            write_streamed(source, tmp)
        return out
    if source.suffix == ".gguf":
        config, weights, tokenizer = read_gguf(source)
    elif source.is_dir():
        config, weights = _read_hf_dir(source)
        tokenizer = Tokenizer.load(source) if (source / "tokenizer.json").is_file() else None
    else:
        raise CheckpointError(
            f"{source} is not a model directory, a .gguf file or a known model name "
            f"(known: {', '.join(sorted(NAMED_MODELS))})"
        )
    if config.tie_embeddings:
        weights.pop("lm_head.weight", None)
    write_checkpoint(out, config, weights, tokenizer, replace=replace)
    return out


def resolve(source: str | Path) -> Path:
    """A loadable model directory for `source`, converting names and GGUF files into the cache once."""
    name = str(source)
    if name in NAMED_MODELS:
        target = cache_dir() / "models" / name
    elif name.endswith(".gguf"):
        path = Path(name).resolve()
        if not path.is_file():
            raise CheckpointError(f"GGUF file not found: {path}")
        stat = path.stat()
        key = hashlib.sha256(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
        target = cache_dir() / "models" / f"{path.stem}-{key}"
    else:
        path = Path(name)
        if not path.exists():
            raise CheckpointError(
                f"model {name!r} not found: not a directory, a .gguf file or a known model name "
                f"(known: {', '.join(sorted(NAMED_MODELS))})"
            )
        return path
    if not (target / "config.json").is_file():
        convert(name, target, replace=False)
    return target


def load_gguf_quantized(source: str | Path, head_rows: int | None = None,
                        max_bits: int = 8) -> tuple[Transformer, Tokenizer]:
    """A GGUF file's (or a named model's) weights in their own quantised format, and its tokenizer
    (`--dtype native`, `importers/gguf_quantized.py`; `head_rows`: the LM head's first rows only;
    `max_bits=4`: wider block types re-quantised to int4); the
    architecture and tokenizer come from its converted directory (made once, as `resolve` does)."""
    name = str(source)
    if name in NAMED_MODELS:
        path = named_model_gguf(name)
    elif name.endswith(".gguf"):
        path = Path(name)
    else:
        raise CapabilityError(f"--dtype native reads a GGUF file or a named model; {name} is neither "
                              "(use --dtype q8 or q4)")
    directory = resolve(source)
    return read_gguf_quantized(path, read_config(directory), head_rows, max_bits), Tokenizer.load(directory)


def read_config(source: str | Path) -> ModelConfig:
    """The architecture of a model directory, `.gguf` file or name (`random:NAME`: a public checkpoint's
    shape, `models/random_shapes.py`), without loading its weights."""
    if is_random(str(source)):
        return random_config(str(source))
    directory = resolve(source)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"no config.json in {directory}")
    try:
        if config_path.stat().st_size > MAX_CONFIG_BYTES:
            raise CheckpointError(f"corrupt {config_path}: {config_path.stat().st_size} bytes is no model config")
        data = json.loads(config_path.read_bytes())
    except (OSError, ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CheckpointError(f"corrupt {config_path}: {one_line(e)}") from e
    try:
        return config_from_hf(data)
    except ConfigError as e:
        raise CheckpointError(f"invalid {config_path}: {e}") from e


def _read_hf_dir(directory: Path, dtype: torch.dtype = torch.float32) -> tuple[ModelConfig, dict[str, Tensor]]:
    """The config and weights of a Hugging Face directory. The weights' shapes (read from the
    safetensors headers, no data) are checked against the config before any tensor is loaded."""
    config = read_config(directory)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no .safetensors weights in {directory}")
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                shapes.update({name: tuple(f.get_slice(name).get_shape()) for name in f.keys()})  # noqa: SIM118
        except Exception as e:  # SafetensorError, OSError, or whatever else a corrupt header provokes
            raise CheckpointError(f"corrupt weights file {file}: {one_line(e)}") from e
    problem = shape_mismatch(config, shapes)
    if problem is not None:
        raise CheckpointError(f"weights in {directory} do not match its config.json: {problem}")
    try:
        config.check_fits_in_memory(dtype.itemsize)
    except ConfigError as e:
        raise CheckpointError(f"cannot load {directory}: {e}") from e
    weights: dict[str, Tensor] = {}
    for file in files:
        try:
            weights.update(load_file(str(file)))
        except Exception as e:
            raise CheckpointError(f"corrupt weights file {file}: {one_line(e)}") from e
    return config, weights


def load_pretrained(
    source: str | Path, *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> tuple[Transformer, Tokenizer]:
    """Load a model and its tokenizer from a directory, a `.gguf` file or a registered name."""
    directory = resolve(source)
    config, hf_weights = _read_hf_dir(directory, dtype)
    state = state_dict_from_hf(hf_weights, config)
    with torch.device("meta"):
        model = Transformer(config)
    try:
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as e:  # shape mismatch between config.json and the weights
        raise CheckpointError(f"weights in {directory} do not match its config.json: {one_line(e)}") from e
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {directory} is incomplete: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if config.position == "rope":  # non-persistent buffer, rebuilt off the meta device
        model.inv_freq = rope_inv_freq(config)
    tokenizer = Tokenizer.load(directory)
    if tokenizer.vocab_size > config.vocab_size:
        raise CheckpointError(f"the tokenizer of {directory} has {tokenizer.vocab_size} tokens, more than the "
                              f"model's vocab_size={config.vocab_size}")
    model = model.to_precision(dtype).to(device=device).eval()
    return model, tokenizer
