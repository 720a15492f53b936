"""Reading an exported ONNX graph without running it: its weights (straight from the external data file),
and every external data file it names (what ONNX Runtime would open beside it). The package reader and the
ONNX drafter runners use these; the writers are in `export/`."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from warpdecode.errors import PackageIntegrityError

WEIGHT_PREFIX = "model."
"""Initializer names are `StepGraph`'s parameter names: the backbone's state-dict keys under `model.`."""


def read_weights(path: Path, names: Iterable[str], aliases: dict[str, str] | None = None) -> dict[str, torch.Tensor]:
    """The initializers `names` of the graph at `path` as CPU tensors, read straight from the
    external data file (or the graph itself for small inline tensors); `aliases` maps a merged
    weight's name to the initializer that holds it."""
    aliases = aliases or {}
    requested = list(names)
    found = _read_initializers(path, {aliases.get(n, n) for n in requested})
    return {n: found[aliases.get(n, n)] for n in requested}


def load_graph_proto(path: Path) -> Any:
    """The ONNX model at `path` without its external data (weights stay references); a file that is
    not an ONNX graph is a `PackageIntegrityError`."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        return onnx.load(str(path), load_external_data=False)
    except (DecodeError, OSError, ValueError) as e:
        raise PackageIntegrityError(f"{path} is not a readable ONNX graph ({str(e).splitlines()[0][:200] if str(e) else type(e).__name__})") from e


def external_data_locations(path: Path) -> set[str]:
    """Every external data file the ONNX graph at `path` names (each tensor's `location`, relative to
    the graph's directory: what ONNX Runtime opens beside it), read without loading any weight.

    Covers the initializers, sparse initializers and tensor attributes of every node, subgraphs and
    model-local functions included. A tensor that declares external data without a location yields
    "". `EPContext` nodes (which name a compiled-engine file some execution providers read) are a
    `PackageIntegrityError`: no exporter here writes them, and the file they name is not checkable
    as weights are."""
    import onnx

    model = load_graph_proto(path)
    locations: set[str] = set()

    def tensor(t: Any) -> None:
        if t.external_data or t.data_location == onnx.TensorProto.EXTERNAL:
            locations.add(next((e.value for e in t.external_data if e.key == "location"), ""))

    def nodes(items: Iterable[Any]) -> None:
        for node in items:
            if node.op_type == "EPContext":
                raise PackageIntegrityError(f"{path}: node {node.name!r} is an EPContext node (a reference to a "
                                            f"compiled engine file); refusing a graph that names unchecked files")
            for attribute in node.attribute:
                for t in [attribute.t, *attribute.tensors]:
                    tensor(t)
                for sparse in [attribute.sparse_tensor, *attribute.sparse_tensors]:
                    tensor(sparse.values)
                    tensor(sparse.indices)
                for sub in [attribute.g, *attribute.graphs]:
                    graph(sub)

    def graph(g: Any) -> None:
        for t in g.initializer:
            tensor(t)
        for sparse in g.sparse_initializer:
            tensor(sparse.values)
            tensor(sparse.indices)
        nodes(g.node)

    graph(model.graph)
    for function in model.functions:
        nodes(function.node)
    return locations


def _read_initializers(path: Path, wanted: set[str]) -> dict[str, torch.Tensor]:
    import onnx
    from onnx import numpy_helper

    graph = load_graph_proto(path).graph
    out: dict[str, torch.Tensor] = {}
    for init in graph.initializer:
        if init.name not in wanted:
            continue
        if init.data_location == onnx.TensorProto.EXTERNAL:
            info = {entry.key: entry.value for entry in init.external_data}
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(init.data_type))
            count = int(np.prod(init.dims)) if init.dims else 1
            location = info.get("location", "")
            data_file = path.parent / location
            if not location or not data_file.resolve().is_relative_to(path.parent.resolve()):
                raise PackageIntegrityError(f"{path}: weight {init.name} names external data {location!r} "
                                            f"outside the graph's directory")
            offset, length = int(info.get("offset", 0)), int(info.get("length", count * dtype.itemsize))
            if length != count * dtype.itemsize or not data_file.is_file() or data_file.stat().st_size < offset + length:
                raise PackageIntegrityError(f"{path}: weight {init.name} is missing from {data_file.name} (truncated?)")
            array = np.fromfile(data_file, dtype=dtype, count=count, offset=offset).reshape(tuple(init.dims))
        else:
            array = numpy_helper.to_array(init).copy()
        out[init.name] = torch.from_numpy(array)
    if wanted - out.keys():
        raise PackageIntegrityError(f"{path} lacks the weights {sorted(wanted - out.keys())[:4]}")
    return out
