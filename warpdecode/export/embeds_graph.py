"""A backbone graph that takes input embeddings instead of token ids, reading the same weights.

Methods whose verify forward carries rows that are not vocabulary tokens (PPD's prompt rows,
`DraftTree.auxiliary_embeds`) feed the target block inputs, not ids. The exported graphs begin with
one `Gather(embed.weight, input_ids)`; the embeds variant replaces it by an `Identity` of a new first
input, `inputs_embeds` (B, T, C), and keeps every other node and initializer, the latter still
pointing into the original graph's external data file: no weight is written twice.

    backbone.onnx        input_ids (B, T) int64, position_ids, ...  →  logits, ...
    backbone.embeds.onnx inputs_embeds (B, T, C), position_ids, ... →  the same outputs
"""

from __future__ import annotations

from pathlib import Path

from warpdecode.errors import ConfigError

IDS_INPUT = "input_ids"
EMBEDS_INPUT = "inputs_embeds"


def embeds_graph_name(graph_name: str) -> str:
    """`backbone.fused.onnx` → `backbone.fused.embeds.onnx`."""
    return graph_name.removesuffix(".onnx") + ".embeds.onnx"


def write_embeds_graph(graph: Path, d_model: int) -> Path:
    """Write the embeds variant of `graph` beside it (see the module docstring) and check it with
    `onnx.checker`; returns its path. ConfigError when `input_ids` feeds anything but one embedding
    lookup (a Gather from an initializer): then this surgery cannot make the variant.

    Args:
        graph: an exported backbone graph (`export.step_graph` or `export.fused_graph`).
        d_model: C, the width of the embeddings.
    """
    import onnx

    model = onnx.load(str(graph), load_external_data=False)  # initializers keep their external-data references
    initializers = {t.name: t for t in model.graph.initializer}
    readers = [node for node in model.graph.node if IDS_INPUT in node.input]
    if (len(readers) != 1 or readers[0].op_type != "Gather" or list(readers[0].input)[1:] != [IDS_INPUT]
            or readers[0].input[0] not in initializers):
        raise ConfigError(f"{graph.name}: {IDS_INPUT} feeds {[n.op_type for n in readers]}, not one embedding "
                          f"Gather; no input-embeddings variant")
    lookup = readers[0]
    embed_weight = lookup.input[0]
    position = list(model.graph.node).index(lookup)
    model.graph.node.remove(lookup)
    model.graph.node.insert(position, onnx.helper.make_node("Identity", [EMBEDS_INPUT], list(lookup.output),
                                                            name="inputs_embeds_identity"))
    index = [i.name for i in model.graph.input].index(IDS_INPUT)
    ids = model.graph.input[index]
    dims = [d.dim_param or d.dim_value for d in ids.type.tensor_type.shape.dim] + [d_model]
    dtype = initializers[embed_weight].data_type
    model.graph.input.remove(ids)
    model.graph.input.insert(index, onnx.helper.make_tensor_value_info(EMBEDS_INPUT, dtype, dims))
    if not any(embed_weight in node.input for node in model.graph.node):  # untied: the lookup was its only reader
        model.graph.initializer.remove(initializers[embed_weight])
    out = graph.with_name(embeds_graph_name(graph.name))
    onnx.save(model, str(out))
    onnx.checker.check_model(str(out))
    return out
