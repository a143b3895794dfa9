"""``onnx.compose``, function for function, on fastseq's core.

``import fastseq.onnx_compose as compose`` in a build script that used ``onnx.compose``:
every function takes and returns the same protos, with the same signature and, wherever
onnx.compose's own result is valid, the same result (``inplace=True`` edits the given proto).
The renaming runs in the core's one name walker, the merging in the core's plan under
onnx.compose's rules (see :func:`fastseq.merge_models` for where the results differ: only
where onnx.compose fails or returns a broken model). Errors that onnx.compose raises as
``ValueError`` raise :class:`fastseq.CompositionError`, a subclass of ``ValueError``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastseq import _core
from fastseq.errors import CompositionError
from fastseq.facades import compose as _compose
from fastseq.graph.build import build

if TYPE_CHECKING:
    from collections.abc import MutableMapping

    import onnx

__all__ = [
    "add_prefix",
    "add_prefix_graph",
    "check_overlapping_names",
    "expand_out_dim",
    "expand_out_dim_graph",
    "merge_graphs",
    "merge_models",
]


def _model(m: object, what: str) -> onnx.ModelProto:
    import onnx

    if not isinstance(m, onnx.ModelProto):
        raise TypeError(f"{what} argument is not an ONNX model")
    return m


def _graph(g: object, what: str) -> onnx.GraphProto:
    import onnx

    if not isinstance(g, onnx.GraphProto):
        raise TypeError(f"{what} argument is not an ONNX graph")
    return g


def _held_graph(g: onnx.GraphProto, label: str) -> _core.Composed:
    return _core.decode(g.SerializeToString(), label, graph=True)


def _result(given, data: bytes, inplace: bool | None):
    """``data`` parsed into ``given`` itself (``inplace``) or into a new proto of its type."""
    if inplace:
        given.ParseFromString(data)
        return given
    return type(given).FromString(data)


def check_overlapping_names(
    g1: onnx.GraphProto, g2: onnx.GraphProto, io_map: list[tuple[str, str]] | None = None
) -> list[tuple[str, list[str]]]:
    """The names both graphs use, by kind: ``("edge", [...])`` (node inputs and outputs,
    the inputs ``io_map`` feeds left out), ``"value_info"``, ``"initializer"``,
    ``"sparse_initializer"``; kinds without a shared name are left out. Each list is in
    ``g1``'s order (onnx.compose's is a set's, in no set order)."""
    _graph(g1, "g1")
    _graph(g2, "g2")
    io_map_inputs = [str(i) for _, i in io_map or []]
    found = _core.overlapping_names(_held_graph(g1, "g1"), _held_graph(g2, "g2"), io_map_inputs)
    return [(kind, list(names)) for kind, names in found]


def merge_graphs(
    g1: onnx.GraphProto,
    g2: onnx.GraphProto,
    io_map: list[tuple[str, str]],
    inputs: list[str] | None = None,
    outputs: list[str] | None = None,
    prefix1: str | None = None,
    prefix2: str | None = None,
    name: str | None = None,
    doc_string: str | None = None,
) -> onnx.GraphProto:
    """``onnx.compose.merge_graphs``: the graph :func:`merge_models` would give (same
    arguments, same rules and differences)."""
    import onnx

    stages = [_held_graph(_graph(g1, "g1"), "g1"), _held_graph(_graph(g2, "g2"), "g2")]
    spec = _compose.merge_spec(*stages, io_map, inputs, outputs, prefix1, prefix2, name, doc_string)
    return onnx.GraphProto.FromString(build(spec).composed.graph_bytes())


def merge_models(
    m1: onnx.ModelProto,
    m2: onnx.ModelProto,
    io_map: list[tuple[str, str]],
    inputs: list[str] | None = None,
    outputs: list[str] | None = None,
    prefix1: str | None = None,
    prefix2: str | None = None,
    name: str | None = None,
    doc_string: str | None = None,
    producer_name: str | None = "onnx.compose.merge_models",
    producer_version: str | None = "1.0",
    domain: str | None = "",
    model_version: int | None = 1,
) -> onnx.ModelProto:
    """``onnx.compose.merge_models``: see :func:`fastseq.merge_models` (which also takes
    paths and bytes; this one, like onnx.compose's, only ``onnx.ModelProto``)."""
    return _compose.merge_models(
        _model(m1, "m1"),
        _model(m2, "m2"),
        io_map,
        inputs,
        outputs,
        prefix1,
        prefix2,
        name,
        doc_string,
        producer_name,
        producer_version,
        domain,
        model_version,
    )


def add_prefix_graph(
    graph: onnx.GraphProto,
    prefix: str,
    rename_nodes: bool | None = True,
    rename_edges: bool | None = True,
    rename_inputs: bool | None = True,
    rename_outputs: bool | None = True,
    rename_initializers: bool | None = True,
    rename_value_infos: bool | None = True,
    inplace: bool | None = False,
    name_map: dict[str, str] | None = None,
) -> onnx.GraphProto:
    """``onnx.compose.add_prefix_graph``: ``prefix`` before the names the flags select
    (edges: node outputs that are not graph outputs; initializers: sparse ones too; nodes:
    node names and every name inside subgraphs), each renamed wherever it is read, in every
    scope. Empty names stay empty. ``name_map``, when given, receives the value renames."""
    _graph(graph, "graph")
    prefixed, renamed = _held_graph(graph, "graph").with_prefix(
        prefix,
        nodes=bool(rename_nodes),
        edges=bool(rename_edges),
        inputs=bool(rename_inputs),
        outputs=bool(rename_outputs),
        initializers=bool(rename_initializers),
        value_infos=bool(rename_value_infos),
        functions=False,
    )
    if name_map is not None:
        name_map.update(renamed)
    return _result(graph, prefixed.graph_bytes(), inplace)


def add_prefix(
    model: onnx.ModelProto,
    prefix: str,
    rename_nodes: bool | None = True,
    rename_edges: bool | None = True,
    rename_inputs: bool | None = True,
    rename_outputs: bool | None = True,
    rename_initializers: bool | None = True,
    rename_value_infos: bool | None = True,
    rename_functions: bool | None = True,
    inplace: bool | None = False,
) -> onnx.ModelProto:
    """``onnx.compose.add_prefix``: :func:`add_prefix_graph` on the model's graph, and
    ``prefix`` before the local functions' names and their calls (calls of the function's
    own domain only, in subgraphs too). Unlike onnx.compose's, a body reading an outer
    initializer, quantization annotations and training graphs follow the renames."""
    _model(model, "model")
    prefixed, _ = _core.decode(model.SerializeToString(), "model").with_prefix(
        prefix,
        nodes=bool(rename_nodes),
        edges=bool(rename_edges),
        inputs=bool(rename_inputs),
        outputs=bool(rename_outputs),
        initializers=bool(rename_initializers),
        value_infos=bool(rename_value_infos),
        functions=bool(rename_functions),
    )
    return _result(model, prefixed.to_bytes(), inplace)


def expand_out_dim_graph(graph: onnx.GraphProto, dim_idx: int, inplace: bool | None = False) -> onnx.GraphProto:
    """``onnx.compose.expand_out_dim_graph``: an axis of extent 1 at ``dim_idx`` on every
    output (an ``Unsqueeze`` per output, its axes from one ``Constant`` node), the outputs
    keeping their names. Unlike onnx.compose's, subgraphs reading an output follow its
    rename, an output that is a graph input is unsqueezed as it is, the new shape keeps
    symbolic dims, and a negative ``dim_idx`` counts from the back of the new shape as the
    ``Unsqueeze`` does. Opset 13's form: :func:`expand_out_dim` picks the older one for a
    model importing an older opset."""
    return _expand(_graph(graph, "graph"), dim_idx, inplace, axes_as_input=True)


def expand_out_dim(model: onnx.ModelProto, dim_idx: int, inplace: bool | None = False) -> onnx.ModelProto:
    """``onnx.compose.expand_out_dim``: :func:`expand_out_dim_graph` on the model's graph;
    for a model importing ai.onnx older than 13 the ``Unsqueeze`` takes its axes as an
    attribute (onnx.compose's needs opset 13)."""
    import onnx

    _model(model, "model")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    out = model if inplace else onnx.ModelProto.FromString(model.SerializeToString())
    _expand(out.graph, dim_idx, True, axes_as_input=opset >= 13)
    return out


def _expand(graph: onnx.GraphProto, dim_idx: int, inplace: bool | None, axes_as_input: bool) -> onnx.GraphProto:
    from onnx import TensorProto, helper

    suffix = f"_collapsed_dim_{dim_idx}"
    produced = {o for n in graph.node for o in n.output}
    outputs = [(o.name, o.name + suffix if o.name in produced else o.name, o.type.tensor_type) for o in graph.output]
    renames = [(old, new) for old, new, _ in outputs if old != new]
    try:
        held = _held_graph(graph, "graph").with_renamed(renames)
    except CompositionError as e:
        raise CompositionError(f"expand_out_dim: {e}") from None
    g = _result(graph, held.graph_bytes(), inplace)
    axes = g.name + "_expand_out_dim_idx"
    if axes_as_input:
        value = helper.make_tensor(name=f"{axes}-value", data_type=TensorProto.INT64, dims=[1], vals=[dim_idx])
        g.node.append(helper.make_node("Constant", inputs=[], outputs=[axes], name=f"{axes}-constant", value=value))
    del g.output[:]
    for name, source, tensor in outputs:
        if axes_as_input:
            g.node.append(helper.make_node("Unsqueeze", inputs=[source, axes], outputs=[name], name=f"unsqueeze-{name}"))
        else:
            g.node.append(
                helper.make_node("Unsqueeze", inputs=[source], outputs=[name], name=f"unsqueeze-{name}", axes=[dim_idx])
            )
        shape = None
        if tensor.HasField("shape"):
            shape = [d.dim_value if d.HasField("dim_value") else d.dim_param or None for d in tensor.shape.dim]
            shape.insert(dim_idx if dim_idx >= 0 else len(shape) + 1 + dim_idx, 1)
        g.output.append(helper.make_tensor_value_info(name, tensor.elem_type, shape))
    return g
