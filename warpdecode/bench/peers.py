"""Peer implementations measured next to warpdecode on the same weights and threads.

Peers are optional: each one imports its library lazily and raises `CapabilityError` when it is
missing, so a benchmark can skip it with a reason instead of failing.

`TRANSFORMERS_EQUIVALENTS` maps a warpdecode drafter to the `generate()` arguments of Hugging Face's
own version of the method: prompt lookup (`prompt_lookup_num_tokens`) and assisted generation
(`assistant_model`). A drafter without an entry has no transformers row.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from warpdecode.errors import CapabilityError
from warpdecode.models.device import synchronize


@dataclass
class PeerResult:
    token_ids: list[int]
    seconds: float
    time_to_first_token: float | None = None
    """Seconds until the first new token, for peers that stream their tokens (llama.cpp)."""


def load_transformers_model(model_dir: Path, *, num_hidden_layers: int | None = None, device: str = "cpu",
                            dtype: torch.dtype = torch.float32) -> Any:
    """`AutoModelForCausalLM` in `dtype` from a model directory, on `device`; `num_hidden_layers=N` keeps
    its first N blocks (the weights of the others are not loaded), final norm and head."""
    try:
        import transformers
    except ImportError as e:
        raise CapabilityError("the transformers peer needs the [hf] extra") from e
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    overrides = {} if num_hidden_layers is None else {"num_hidden_layers": num_hidden_layers}
    model: Any = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, **overrides)
    return model.to(torch.device(device)).eval()


class TransformersGenerate:
    """Hugging Face `generate()` (KV cache, `dtype`: fp32 by default) on the same checkpoint directory:
    greedy by default; `generate_kwargs` select its other modes (prompt lookup, assisted generation);
    the model and an assistant model run on `device` in `dtype`."""

    name = "transformers.generate"

    def __init__(self, model_dir: Path, *, model: Any | None = None, device: str = "cpu",
                 dtype: torch.dtype = torch.float32, generate_kwargs: dict[str, Any] | None = None) -> None:
        self.device = torch.device(device)
        self.model = load_transformers_model(model_dir, device=device, dtype=dtype) if model is None else model
        self.generate_kwargs = dict(generate_kwargs or {})
        if "assistant_model" in self.generate_kwargs:
            self.generate_kwargs["assistant_model"] = self.generate_kwargs["assistant_model"].to(self.device, dtype)

    @torch.inference_mode()
    def generate(
        self,
        ids: list[int],
        max_new_tokens: int,
        *,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
    ) -> PeerResult:
        sampling: dict[str, Any] = {"do_sample": do_sample}
        if do_sample:  # top_k=0 / top_p=1 switch off transformers' default filters (top_k=50)
            sampling |= {"temperature": temperature, "top_k": top_k or 0, "top_p": top_p or 1.0}
            if seed is not None:
                torch.manual_seed(seed)
        start = time.perf_counter()
        out = self.model.generate(
            torch.tensor([ids], device=self.device), max_new_tokens=max_new_tokens, pad_token_id=0,
            attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=self.device), **sampling, **self.generate_kwargs,
        )
        synchronize(self.device)
        seconds = time.perf_counter() - start
        return PeerResult(token_ids=out[0, len(ids):].tolist(), seconds=seconds)


class LlamaCppGenerate:
    """llama.cpp (through llama-cpp-python, a peer only: never a warpdecode dependency) greedy-decoding the
    GGUF file itself, in its own format, on the same token ids and threads; its KV cache is cleared
    before every call so that no prompt is prefilled from an earlier one."""

    name = "llama.cpp"
    INSTALL = "pip install llama-cpp-python (builds llama.cpp from source with cmake)"

    def __init__(self, gguf: Path, *, threads: int, context: int, stop_ids: set[int],
                 prompt_lookup: tuple[int, int] | None = None) -> None:
        """`prompt_lookup`: (max n-gram, draft tokens) of llama-cpp-python's own prompt-lookup drafting
        (`LlamaPromptLookupDecoding`), the peer of warpdecode's `prompt_lookup`; None: plain decoding."""
        try:
            import llama_cpp
        except ImportError as e:
            raise CapabilityError(f"llama-cpp-python is not installed: {self.INSTALL}") from e
        self.stop_ids = stop_ids
        draft = None
        if prompt_lookup is not None:
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            draft = LlamaPromptLookupDecoding(max_ngram_size=prompt_lookup[0], num_pred_tokens=prompt_lookup[1])
        # with a draft, llama-cpp-python reads every position's logits: its score table must hold them all
        self.llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=context, n_threads=threads, n_threads_batch=threads,
                                   draft_model=draft, logits_all=draft is not None, verbose=False)
        self.generate_kwargs: dict[str, Any] = {"gguf": gguf.name, "n_threads": threads,
                                                "llama_cpp": getattr(llama_cpp, "__version__", "?")}
        if prompt_lookup is not None:
            self.generate_kwargs |= {"max_ngram_size": prompt_lookup[0], "num_pred_tokens": prompt_lookup[1]}

    def generate(self, ids: list[int], max_new_tokens: int, *, do_sample: bool = False, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None) -> PeerResult:
        if do_sample:
            raise CapabilityError("the llama.cpp peer decodes greedily only")
        self.llm.reset()
        start = time.perf_counter()
        out: list[int] = []
        first: float | None = None
        for token in self.llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            if first is None:
                first = time.perf_counter() - start
            out.append(int(token))
            if len(out) == max_new_tokens or token in self.stop_ids:
                break
        return PeerResult(token_ids=out, seconds=time.perf_counter() - start, time_to_first_token=first)


def _check_components(options: dict[str, Any], schedules: tuple[str, ...]) -> None:
    """Refuse methods transformers has no version of: other verifiers, or an unsupported controller."""
    if options.get("verifier") not in (None, "greedy", "speculative_sampling"):
        raise CapabilityError(f"transformers has no {options['verifier']!r} verifier")
    if options.get("controller", "fixed") not in schedules:
        raise CapabilityError(f"transformers has no equivalent of the {options['controller']!r} controller here")


def _prompt_lookup(options: dict[str, Any], target_dir: Path) -> dict[str, Any]:
    _check_components(options, ("fixed",))
    return {"prompt_lookup_num_tokens": options["num_tokens"], "max_matching_ngram_size": options["max_ngram"]}


def _assisted(options: dict[str, Any], target_dir: Path) -> dict[str, Any]:
    """The same draft as `draft_model`: its model directory, or the target's first `layers` blocks,
    drafting `num_tokens` per step (constant schedule; `controller=adaptive` maps to transformers'
    `heuristic` schedule, the same rule). Transformers' confidence stop stays at its
    default (`assistant_confidence_threshold`): it ends a draft early when the assistant is unsure.
    Transformers drafts chains only, so a `top_k > 1` tree has no equivalent."""
    from warpdecode.models.checkpoint import resolve

    _check_components(options, ("fixed", "adaptive"))
    if options["top_k"] != 1:
        raise CapabilityError(f"transformers' assisted generation drafts chains only, not top_k={options['top_k']} trees")
    if options["layers"] is not None:
        assistant = load_transformers_model(target_dir, num_hidden_layers=options["layers"])
    else:
        assistant = load_transformers_model(resolve(options["model"]))
    assistant.generation_config.num_assistant_tokens = options["num_tokens"]
    adaptive = options.get("controller") == "adaptive"
    assistant.generation_config.num_assistant_tokens_schedule = "heuristic" if adaptive else "constant"
    return {"assistant_model": assistant}


TRANSFORMERS_EQUIVALENTS: dict[str, Callable[[dict[str, Any], Path], dict[str, Any]]] = {
    "prompt_lookup": _prompt_lookup,
    "draft_model": _assisted,
}
"""Drafter name → (its options with defaults filled in, target directory) → transformers `generate()` kwargs."""


def describe(generate_kwargs: dict[str, Any]) -> dict[str, Any]:
    """JSON-friendly settings of a peer mode (an assistant model is described by its drafting schedule)."""
    out: dict[str, Any] = {}
    for key, value in generate_kwargs.items():
        if key == "assistant_model":
            config = value.generation_config
            out[key] = {"num_hidden_layers": value.config.num_hidden_layers,
                        "num_assistant_tokens": config.num_assistant_tokens,
                        "num_assistant_tokens_schedule": config.num_assistant_tokens_schedule,
                        "assistant_confidence_threshold": config.assistant_confidence_threshold}
        else:
            out[key] = value
    return out
