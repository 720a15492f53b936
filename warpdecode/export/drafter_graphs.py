"""ONNX graphs of the trained Medusa and Hydra heads, and running them in ONNX Runtime.

An inference package stores them beside each drafter package (`drafters/<kind>/`):

    heads.onnx       Medusa: features (M, C) → logits (M, K, N), every head at once
    head_<k>.onnx    Hydra head k = 1..K: features (M, C), embeds (M, k, C) → logits (M, N)

(N: the draft vocabulary; the graphs hold the frozen head rows, so they need nothing from the
target but its features and, for Hydra, its token embeddings.) On an ONNX Runtime target the
drafters run these graphs instead of their PyTorch networks (`OnnxHeads`), so drafting and
verifying share one runtime; the PyTorch network stays the reference they are tested against.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from warpdecode.export.onnx_graph import OPSET, quiet_exporter
from warpdecode.models.medusa import FutureHeads, HydraHeads

MEDUSA_GRAPH = "heads.onnx"


def hydra_graph(k: int) -> str:
    return f"head_{k}.onnx"


class _HydraStep(nn.Module):
    def __init__(self, net: HydraHeads, k: int) -> None:
        super().__init__()
        self.net, self.k = net, k

    def forward(self, features: Tensor, embeds: Tensor) -> Tensor:
        return self.net.step(self.k, features, embeds)


def _export(module: nn.Module, args: tuple[Tensor, ...], names: list[str], path: Path) -> None:
    from torch.export import Dim

    rows = Dim("rows")
    shapes = {name: {0: rows} for name in names}
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), quiet_exporter():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), args, str(path), dynamo=True, dynamic_shapes=shapes, input_names=names,
                          output_names=["logits"], opset_version=OPSET, external_data=False, verbose=False)


def export_heads_graphs(net: FutureHeads, directory: Path) -> list[str]:
    """Write the graphs of `net` (Medusa or Hydra heads, fp32, as `PackagedDrafter.load_net` gives
    them) into `directory`; the file names written."""
    C = net.head.in_features
    if isinstance(net, HydraHeads):
        for k in range(1, net.num_heads + 1):
            _export(_HydraStep(net, k), (torch.zeros(2, C), torch.zeros(2, k, C)), ["features", "embeds"],
                    directory / hydra_graph(k))
        return [hydra_graph(k) for k in range(1, net.num_heads + 1)]
    _export(net, (torch.zeros(2, C),), ["features"], directory / MEDUSA_GRAPH)
    return [MEDUSA_GRAPH]


class OnnxHeads:
    """The heads' graphs in ONNX Runtime, called like the PyTorch heads: `heads(features)` (Medusa),
    `heads.step(k, features, embeds)` (Hydra)."""

    def __init__(self, sessions: dict[int, object]) -> None:
        self.sessions = sessions  # 0: the Medusa graph; k: Hydra head k

    @classmethod
    def find(cls, directory: Path, net: FutureHeads, threads: int | None = None) -> OnnxHeads | None:
        """The graphs in `directory` for `net`'s kind and head count, or None if any is missing."""
        import onnxruntime as ort

        files = ({k: directory / hydra_graph(k) for k in range(1, net.num_heads + 1)} if isinstance(net, HydraHeads)
                 else {0: directory / MEDUSA_GRAPH})
        if not all(path.is_file() for path in files.values()):
            return None
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return cls({k: ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
                    for k, path in files.items()})

    def _run(self, key: int, **inputs: Tensor) -> Tensor:
        feeds = {name: np.ascontiguousarray(t.detach().float().cpu().numpy()) for name, t in inputs.items()}
        return torch.from_numpy(self.sessions[key].run(None, feeds)[0])  # type: ignore[attr-defined]

    def __call__(self, features: Tensor) -> Tensor:
        """(M, C) → (M, K, N), as `MedusaHeads.forward`."""
        return self._run(0, features=features)

    def step(self, k: int, features: Tensor, embeds: Tensor) -> Tensor:
        """(M, C), (M, k, C) → (M, N), as `HydraHeads.step`."""
        return self._run(k, features=features, embeds=embeds)
