"""The ONNX Runtime backend: the exported step graph behind the same backbone protocol as `Transformer`.

The cache stays a `KVCache` of torch tensors: each layer's (B, Hkv, S, D) buffer is bound to the
graph in place (no copy), the graph returns the new tokens' keys and values, and they are written at
the slots `KVCache.plan_write` chose, exactly where the PyTorch backend writes them. So commits,
rollbacks and every drafter's cache bookkeeping are shared. Inputs and outputs are bound to torch
memory through ONNX Runtime's I/O binding; only the graph's own work runs in ONNX Runtime.

A fused graph (`export.fused_graph`, recognised by its `attention_bias` input) writes the new keys
and values into the bound cache buffer itself; the runtime then only advances the cache.

Given its embeds variant (`export.embeds_graph`), the backbone also takes `inputs_embeds`: the first
forward that passes them moves it onto that graph for good (the ids session is released, so the
weights are held once), and from then on token rows are embedded here, with the same table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from warpdecode.errors import CapabilityError, PackageIntegrityError
from warpdecode.models.backbone import BackboneOutput
from warpdecode.models.cache import KVCache
from warpdecode.models.config import ModelConfig
from warpdecode.models.transformer import Transformer, default_new_mask, new_token_mask

NUMPY_DTYPES = {torch.float32: np.float32, torch.float16: np.float16, torch.int64: np.int64, torch.int32: np.int32,
                torch.bool: np.bool_}
PROVIDERS = {"cpu": ["CPUExecutionProvider"],
             "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
             "tensorrt": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]}
"""Execution providers per device; the first one must load, or the session is refused."""
PREFILL_CHUNK = 256
"""Causal forwards longer than this run chunk by chunk: attention materialises the (T, S + T) scores,
which for long prompts costs more than the chunks' extra calls (measured on the default model, fused
graph: 3,000 prompt tokens 3.27 s whole, 2.84 s in chunks of 256; 600 tokens 395 ms vs 408 ms)."""
COPY_PREFIX_ROWS = 64
"""From this many new tokens a forward is compute-bound: it attends to a copy of the committed
cache prefix instead of the whole buffer (copying is cheap beside the work, masked slots are not)."""


def open_session(graph: Path, options: Any, providers: list[str]) -> Any:
    """An ONNX Runtime session for `graph`: a missing or unreadable file is a one-line
    `PackageIntegrityError`, not ONNX Runtime's NO_SUCHFILE / INVALID_PROTOBUF traceback (other load
    errors, such as an operator this ONNX Runtime lacks, propagate)."""
    import onnxruntime as ort
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    if not graph.is_file():
        raise PackageIntegrityError(f"{graph} is missing")
    try:
        return ort.InferenceSession(str(graph), options, providers=providers)
    except (state.NoSuchFile, state.InvalidProtobuf) as e:
        raise PackageIntegrityError(f"{graph} is not a readable ONNX graph: {str(e).splitlines()[0][:200]}") from e


def _bind(binding: object, bind: str, name: str, tensor: Tensor) -> None:
    getattr(binding, bind)(name, "cpu", 0, NUMPY_DTYPES[tensor.dtype], tuple(tensor.shape), tensor.data_ptr())


class OnnxRuntimeBackbone:
    """Runs `graph` (see `export.step_graph`) with ONNX Runtime.

    Args:
        graph: the step graph's .onnx file (its weights beside it).
        config: the exported model's configuration.
        fingerprint: the exported model's `models.identity` fingerprint (drafters check it).
        hidden_layers: the hidden states the graph returns.
        embed: (V, C) input embedding, for drafters that embed tokens themselves.
        lm_head: (V, C) output embedding when untied (None: tied to `embed`).
        torch_loader: builds the same weights as a `Transformer`, on first use by a drafter made
            from the target's own weights (see `Backbone.torch_model`).
        device: cpu, cuda or tensorrt (ONNX Runtime's execution providers).
        threads: intra-op threads (default: torch's thread count).
        embeds_graph: the same graph taking input embeddings (`export.embeds_graph`), or None: then
            `inputs_embeds` raises `CapabilityError`.
    """
    supports_continuous_batching: ClassVar[bool] = False  # rows decode one request at a time

    def __init__(self, graph: Path, config: ModelConfig, fingerprint: str, hidden_layers: Sequence[int],
                 embed: Tensor, lm_head: Tensor | None = None, *, torch_loader: Callable[[], Transformer] | None = None,
                 device: str = "cpu", threads: int | None = None, embeds_graph: Path | None = None) -> None:
        if device not in PROVIDERS:
            raise CapabilityError(f"onnxruntime device must be one of {', '.join(PROVIDERS)}, got {device!r}")
        self.device, self.threads = device, threads
        self.graph, self.embeds_graph = graph, embeds_graph
        self.takes_embeds = False
        """True once the session runs `embeds_graph` (every forward then binds block inputs)."""
        self.session = self._open(graph)
        self.config = config
        self._fingerprint = fingerprint
        self.hidden_layers = tuple(hidden_layers)
        self.embed = nn.Embedding.from_pretrained(embed, freeze=True)
        self.lm_head = lm_head
        self.names = [i.name for i in self.session.get_inputs()]
        self.fused = "attention_bias" in self.names
        self._torch_loader = torch_loader
        self._torch_model: Transformer | None = None

    def _open(self, graph: Path) -> Any:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads or torch.get_num_threads()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3  # a provider that fails to load is reported below, not as log noise
        session = open_session(graph, options, PROVIDERS[self.device])
        active = session.get_providers()
        if active[0] != PROVIDERS[self.device][0]:
            raise CapabilityError(f"ONNX Runtime could not load {PROVIDERS[self.device][0]} here (active: {active}); "
                                  f"use --device cpu, or install the onnxruntime build for this accelerator")
        return session

    def accepts_inputs_embeds(self) -> bool:
        return self.embeds_graph is not None

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        return KVCache.for_model(self.config, batch, max_len, dtype=self.embed.weight.dtype)

    def _switch_to_embeds(self) -> None:
        """Run the embeds variant from now on (see the module docstring)."""
        if self.embeds_graph is None:
            raise CapabilityError(f"{self.graph.name} takes token ids, not input embeddings (inputs_embeds), and this "
                                  f"package has no embeds variant of it (re-export it with this warpdecode), or it is a "
                                  f"quantised graph: run this method on the torch backend or an unquantised graph")
        self.session = self._open(self.embeds_graph)
        self.names = [i.name for i in self.session.get_inputs()]
        self.takes_embeds = True

    def fingerprint(self) -> str:
        return self._fingerprint

    def torch_model(self) -> Transformer:
        if self._torch_model is None:
            if self._torch_loader is None:
                raise CapabilityError("this drafter builds its draft from the target's PyTorch weights, which this "
                                      "ONNX Runtime backbone was not given")
            self._torch_model = self._torch_loader()
        return self._torch_model

    def pack_for_cpu_inference(self) -> int:
        return 0  # ONNX Runtime lays out its weights when the session loads

    def output_embeddings(self) -> Tensor:
        return self.embed.weight if self.lm_head is None else self.lm_head

    def head(self, x: Tensor) -> Tensor:
        return F.linear(x, self.output_embeddings())

    def __call__(
        self,
        tokens: Tensor,
        positions: Tensor | None = None,
        cache: KVCache | None = None,
        attention_mask: Tensor | None = None,
        hidden_layers: Sequence[int] = (),
        logits_slice: slice | None = None,
        inputs_embeds: Tensor | None = None,
    ) -> BackboneOutput:
        """Same contract as `Transformer.forward` (tokens (B, T) int64, positions (B, T), a bool tree
        mask over the new tokens, `inputs_embeds` (B, T, C)); hidden states only for the layers the
        graph was exported with; `inputs_embeds` only with the embeds variant (`CapabilityError`
        otherwise)."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (B, T), got shape {tuple(tokens.shape)}")
        B, T = tokens.shape
        if inputs_embeds is not None:
            if inputs_embeds.shape != (B, T, self.config.d_model):
                raise ValueError(f"inputs_embeds {tuple(inputs_embeds.shape)} must be ({B}, {T}, {self.config.d_model})")
            if not self.takes_embeds:
                self._switch_to_embeds()
        if self.takes_embeds:
            leading = (self.embed(tokens) if inputs_embeds is None else inputs_embeds).to(self.embed.weight.dtype)
        else:
            leading = tokens.to(torch.int64)
        missing = set(hidden_layers) - set(self.hidden_layers)
        if missing:
            raise CapabilityError(f"this exported backbone returns hidden states {list(self.hidden_layers)}, not "
                                  f"{sorted(missing)}; export with --hidden-layers including them")
        new_mask = new_token_mask(attention_mask, B, T)
        if cache is None:  # a cache-free forward over whole sequences: a scratch cache of exactly T slots
            cache = self.new_cache(B, T)
        elif cache.batch != B:
            raise ValueError(f"cache holds {cache.batch} rows but tokens have batch {B}")
        if positions is None:
            positions = cache.lengths[:, None] + torch.arange(T)
        elif positions.shape != tokens.shape:
            raise ValueError(f"positions {tuple(positions.shape)} must match tokens {tuple(tokens.shape)}")
        index = torch.arange(T)[logits_slice] if logits_slice is not None else torch.arange(T)
        step = self._fused_step if self.fused else self._step
        if new_mask is not None or not self.config.causal or T <= PREFILL_CHUNK:
            logits, hidden = step(leading, positions, cache, new_mask, index)
        else:  # a long causal prompt: chunk by chunk, each attending to the cache and itself
            parts = []
            for begin in range(0, T, PREFILL_CHUNK):
                chunk = slice(begin, min(T, begin + PREFILL_CHUNK))
                wanted = index[(index >= chunk.start) & (index < chunk.stop)] - begin
                parts.append(step(leading[:, chunk], positions[:, chunk], cache, None, wanted))
            logits = torch.cat([p[0] for p in parts], dim=1)
            hidden = {j: torch.cat([p[1][j] for p in parts], dim=1) for j in self.hidden_layers}
        return BackboneOutput(logits=logits, hidden_states={j: hidden[j] for j in hidden_layers})

    def _step(self, leading: Tensor, positions: Tensor, cache: KVCache, new_mask: Tensor | None,
              index: Tensor) -> tuple[Tensor, dict[int, Tensor]]:
        """One graph run over T new tokens: `leading` is their ids (B, T) int64, or their block inputs
        (B, T, C) on the embeds variant; logits (B, K, V) at `index` (K,), every exported hidden state
        (B, T, C). Writes the new keys and values into `cache` and advances it."""
        logits, hidden = self._output_buffers(leading.shape[:2], len(index), cache.k.dtype)
        run_step_graph(self.session, self.names, [leading.contiguous()], positions, cache, new_mask,
                       self.config.causal, [index.contiguous()],
                       {"logits": logits} | {f"hidden_{j}": h for j, h in hidden.items()})
        return logits, hidden

    def _output_buffers(self, shape: torch.Size, num_logits: int,
                        dtype: torch.dtype) -> tuple[Tensor, dict[int, Tensor]]:
        """Empty logits (B, K, V) and exported hidden states (B, T, C) for tokens of `shape` (B, T)."""
        B, T = shape
        logits = torch.empty(B, num_logits, self.config.vocab_size, dtype=dtype)
        return logits, {j: torch.empty(B, T, self.config.d_model, dtype=dtype) for j in self.hidden_layers}

    def _fused_step(self, leading: Tensor, positions: Tensor, cache: KVCache, new_mask: Tensor | None,
                    index: Tensor) -> tuple[Tensor, dict[int, Tensor]]:
        """`_step` on the fused graph. Its attention takes several new positions against a filled
        cache for one row at a time, so such batches run row by row (each row a (1, T) forward)."""
        B, T = leading.shape[:2]
        plan = cache.plan_write(T)
        logits, hidden = self._output_buffers(leading.shape[:2], len(index), cache.k.dtype)
        mask = default_new_mask(T, causal=True) if new_mask is None else new_mask
        one_call = B == 1 or T == 1 or int(plan.start.max()) == 0
        for rows in [slice(0, B)] if one_call else [slice(b, b + 1) for b in range(B)]:
            bias, seqlens, total = attention_bias(plan.start[rows], T, mask[rows] if mask.shape[0] > 1 else mask)
            inputs = [leading[rows].contiguous(), positions[rows].to(torch.int64).contiguous(), bias,
                      seqlens, total, index.contiguous()]
            caches = [buffer[i, rows] for i in range(cache.k.shape[0]) for buffer in (cache.k, cache.v)]
            binding = self.session.io_binding()
            _bind_inputs(binding, dict(zip(self.names, inputs + caches, strict=True)))
            presents = [f"present_{kind}_{i}" for i in range(cache.k.shape[0]) for kind in ("key", "value")]
            outputs = dict(zip(presents, caches, strict=True)) | {"logits": logits[rows]}
            _bind_outputs(binding, outputs | {f"hidden_{j}": h[rows] for j, h in hidden.items()})
            self.session.run_with_iobinding(binding)
        cache.advance(plan)
        return logits, hidden


def attention_bias(start: Tensor, T: int, new_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The fused graph's attention inputs for rows whose T new tokens go to slots start[b] ..
    start[b] + T - 1 of the cache.

    Args:
        start: (B,) int64 committed slots per row. new_mask: (B or 1, T, T) bool among the new tokens.
    Returns:
        attention_bias (B, 1, T, P) float32 over absolute slots, P = max(start) + T (0 where the token
        may attend: the row's committed slots and the new tokens `new_mask` allows; -inf elsewhere),
        seqlens_k (B,) int32 (each row's last written slot) and total_sequence_length () int32 (P).
    """
    B = start.shape[0]
    total = int(start.max()) + T
    offset = torch.arange(total)[None, :] - start[:, None]  # (B, P): slot minus the row's first new slot
    is_new = (offset >= 0) & (offset < T)
    among_new = new_mask.expand(B, T, T).gather(2, offset.clamp(0, T - 1)[:, None, :].expand(B, T, total))
    allowed = (offset < 0)[:, None, :] | (among_new & is_new[:, None, :])  # (B, T, P)
    bias = torch.zeros(B, 1, T, total).masked_fill_(~allowed[:, None], float("-inf"))
    return bias, (start + T - 1).to(torch.int32), torch.tensor(total, dtype=torch.int32)


def _bind_inputs(binding: object, inputs: dict[str, Tensor]) -> None:
    for name, tensor in inputs.items():
        if tensor.numel():
            _bind(binding, "bind_input", name, tensor)
        else:  # an empty tensor has no address to bind
            binding.bind_cpu_input(name, np.empty(tuple(tensor.shape), NUMPY_DTYPES[tensor.dtype]))  # type: ignore[attr-defined]


def _bind_outputs(binding: object, outputs: dict[str, Tensor]) -> None:
    for name, tensor in outputs.items():
        if tensor.numel():
            _bind(binding, "bind_output", name, tensor)
        else:  # an empty buffer has no address to bind: let ONNX Runtime allocate the empty output
            binding.bind_output(name, "cpu")  # type: ignore[attr-defined]


def run_step_graph(session: object, names: list[str], leading: list[Tensor], positions: Tensor, cache: KVCache,
                   new_mask: Tensor | None, causal: bool, extra: list[Tensor], outputs: dict[str, Tensor]) -> None:
    """Run a step graph (`export.step_graph`: the backbone's, or a drafter's built on it) over T new
    positions against `cache`, then write the new keys/values into it and advance it.

    Args:
        leading: the graph's inputs before `position_ids` (input_ids (B, T), or a drafter's features).
        positions: (B, T) int64. new_mask: (B or 1, T, T) bool among the new positions, or None for
            the default (causal or bidirectional).
        extra: the inputs between `attention_mask` and the cache (the backbone's `logit_index`).
        outputs: preallocated tensors for the graph's outputs other than new_keys / new_values.
    """
    B, T = positions.shape
    plan = cache.plan_write(T)
    if plan.used == T:  # empty cache (a prefill): no cache slots to attend to
        S, past_k, past_v = 0, cache.k[:, :, :, :0], cache.v[:, :, :, :0]
    elif T >= COPY_PREFIX_ROWS:  # compute-bound: copy the committed prefix, attend to it alone
        S = int(plan.start.max())
        past_k, past_v = cache.k[:, :, :, :S].contiguous(), cache.v[:, :, :, :S].contiguous()
    else:  # a decode or verify step: every layer's whole buffer, bound in place, unused slots masked
        S, past_k, past_v = cache.max_len, cache.k, cache.v
    past = torch.arange(S)[None, None, :] < plan.start[:, None, None]  # (B, 1, S): committed slots
    if new_mask is None:
        new_mask = default_new_mask(T, causal)
    mask = torch.cat((past.expand(B, T, S), new_mask.expand(B, T, T)), dim=-1)[:, None].contiguous()

    L, Hkv, D = cache.k.shape[0], cache.k.shape[2], cache.k.shape[4]
    new_k = torch.empty(L, B, Hkv, T, D, dtype=cache.k.dtype)
    new_v = torch.empty(L, B, Hkv, T, D, dtype=cache.k.dtype)
    inputs = [*leading, positions.to(torch.int64).contiguous(), mask, *extra]
    inputs += [buffer[i] for i in range(L) for buffer in (past_k, past_v)]
    binding = session.io_binding()  # type: ignore[attr-defined]
    _bind_inputs(binding, dict(zip(names, inputs, strict=True)))
    _bind_outputs(binding, {"new_keys": new_k, "new_values": new_v} | outputs)
    session.run_with_iobinding(binding)  # type: ignore[attr-defined]
    cache.write_all(new_k, new_v, plan)
    cache.advance(plan)
