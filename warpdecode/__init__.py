"""warpdecode: train, export and run fast LLM decoding.

The Python front door is re-exported here and imported on first use, so that `import warpdecode`
(which every `warpdecode` command runs first) loads neither torch nor the model code:

    from warpdecode import generate, load

    model, tokenizer = load("smollm2-135m-instruct")
    out = generate(model, tokenizer, "Summarize: ...", method="prompt_lookup", max_new_tokens=64)
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy and ruff read it the same way
if TYPE_CHECKING:  # the names' types for type checkers (import-linter skips these imports)
    from typing import Any

    from warpdecode.decoding.generate import build_method, generate, generate_batch
    from warpdecode.decoding.outputs import DecodeStats, GenerateOutput
    from warpdecode.models.checkpoint import load_pretrained as load

__version__ = "0.1.0"

__all__ = ["DecodeStats", "GenerateOutput", "build_method", "generate", "generate_batch", "load"]

_LAZY: dict[str, tuple[str, str]] = {
    "generate": ("warpdecode.decoding.generate", "generate"),
    "generate_batch": ("warpdecode.decoding.generate", "generate_batch"),
    "build_method": ("warpdecode.decoding.generate", "build_method"),
    "GenerateOutput": ("warpdecode.decoding.outputs", "GenerateOutput"),
    "DecodeStats": ("warpdecode.decoding.outputs", "DecodeStats"),
    "load": ("warpdecode.models.checkpoint", "load_pretrained"),
}
"""Each public name -> (module, attribute): imported when the name is first read (PEP 562)."""


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _LAZY[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # later reads skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
