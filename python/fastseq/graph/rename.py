"""Renaming tensors of an ``onnx.ModelProto`` in place: kornia's ``io_name_conversion``,
extended to every place a name appears, so that a rename never breaks the graph."""

from __future__ import annotations

from collections.abc import Mapping

from fastseq.errors import CompositionError

__all__ = ["io_name_conversion"]


def io_name_conversion(onnx_model, io_name_mapping: Mapping[str, str]):
    """Renames tensors of ``onnx_model`` in place as ``io_name_mapping`` says (old -> new)
    and returns the model: kornia's ``kornia.onnx.io_name_conversion``, e.g.
    ``{"pixel_values": "input", "predicted_depth": "output"}`` for the default names that
    ONNXSequential's kornia convention connects.

    Unlike kornia's, which renames only graph inputs, outputs and main-graph node
    arguments, every reference is renamed: initializers, value_info, quantization
    annotations, and the If/Loop/Scan bodies that read the tensor from the outer scope
    (not where a body defines a name of its own). Names absent from the model are ignored.
    A rename onto a name the graph already defines is a CompositionError (it would join
    two tensors); swaps (``{"a": "b", "b": "a"}``) are fine.
    """
    mapping = {str(k): str(v) for k, v in io_name_mapping.items() if k != v}
    graph = onnx_model.graph
    defined = _defined(graph)
    renamed = [mapping.get(n, n) for n in defined]
    if len(set(renamed)) < len(set(defined)):
        seen: dict[str, str] = {}
        for old, new in zip(defined, renamed):
            if new in seen and seen[new] != old:
                raise CompositionError(
                    f"io_name_conversion: renaming '{old}' to '{new}' clashes with '{seen[new]}', "
                    f"which {'is also renamed to' if seen[new] in mapping else 'already has'} that name"
                )
            seen[new] = old
    _rename(graph, mapping)
    return onnx_model


def _defined(graph) -> list[str]:
    """The names a graph itself defines: inputs, initializers, node outputs."""
    names = [v.name for v in graph.input]
    names += [t.name for t in graph.initializer]
    names += [s.values.name for s in graph.sparse_initializer]
    names += [o for n in graph.node for o in n.output if o]
    return list(dict.fromkeys(names))


def _rename(graph, mapping: dict[str, str]) -> None:
    if not mapping:
        return

    def r(name: str) -> str:
        return mapping.get(name, name) if name else name

    for v in (*graph.input, *graph.output, *graph.value_info):
        v.name = r(v.name)
    for t in graph.initializer:
        t.name = r(t.name)
    for s in graph.sparse_initializer:
        s.values.name = r(s.values.name)
    for q in graph.quantization_annotation:
        q.tensor_name = r(q.tensor_name)
    for node in graph.node:
        node.input[:] = [r(n) for n in node.input]
        node.output[:] = [r(n) for n in node.output]
        for attr in node.attribute:
            subgraphs = ([attr.g] if attr.HasField("g") else []) + list(attr.graphs)
            for sub in subgraphs:
                # A body's own names shadow the outer ones: those stay as they are.
                local = set(_defined(sub))
                inner = {k: v for k, v in mapping.items() if k not in local}
                hidden = sorted(k for k, v in inner.items() if v in local)
                if hidden:
                    k = hidden[0]
                    raise CompositionError(
                        f"io_name_conversion: '{k}' cannot become '{inner[k]}': the subgraph "
                        f"'{sub.name}' of node '{node.name or node.op_type}' defines '{inner[k]}' itself"
                    )
                _rename(sub, inner)
