"""Renaming tensors of an ``onnx.ModelProto`` in place: kornia's ``io_name_conversion``,
extended to every place a name appears, so that a rename never breaks the graph. The
renaming is the core's (its one name walker)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from fastseq import _core
from fastseq.errors import CompositionError

if TYPE_CHECKING:
    import onnx

__all__ = ["io_name_conversion"]


def io_name_conversion(onnx_model: onnx.ModelProto, io_name_mapping: Mapping[str, str]) -> onnx.ModelProto:
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
    mapping = [(str(k), str(v)) for k, v in io_name_mapping.items()]
    try:
        renamed = _core.decode(onnx_model.SerializeToString(), "io_name_conversion").with_renamed(mapping)
    except CompositionError as e:
        raise CompositionError(f"io_name_conversion: {e}") from None
    onnx_model.ParseFromString(renamed.to_bytes())
    return onnx_model
