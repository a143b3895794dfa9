"""``onnx.compose``, function for function, on fastseq's core: ``import
fastseq.onnx_compose as compose`` makes a build script written for onnx.compose faster
without other changes. The public name of :mod:`fastseq.facades.onnx_compose`, where the
code lives."""

from fastseq.facades.onnx_compose import (
    add_prefix,
    add_prefix_graph,
    check_overlapping_names,
    expand_out_dim,
    expand_out_dim_graph,
    merge_graphs,
    merge_models,
)

__all__ = [
    "add_prefix",
    "add_prefix_graph",
    "check_overlapping_names",
    "expand_out_dim",
    "expand_out_dim_graph",
    "merge_graphs",
    "merge_models",
]
