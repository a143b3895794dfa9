"""fastseq: chain ONNX models into one graph in one pass, and run it with ONNX Runtime."""

from fastseq import operators
from fastseq._core import MAX_IR_VERSION, __version__
from fastseq.compose import compose, compose_bytes, compose_to_file, merge_models
from fastseq.errors import (
    CompositionError,
    ConversionError,
    DownloadError,
    ExportError,
    FastseqError,
    InputError,
    LoadError,
    OpsetMismatchError,
    ProviderError,
)
from fastseq.metadata import add_metadata
from fastseq.module import ONNXModule, load
from fastseq.onnxloader import ONNXLoader
from fastseq.rename import io_name_conversion
from fastseq.sequential import ONNXSequential, TensorInfo

__all__ = [
    "MAX_IR_VERSION",
    "CompositionError",
    "ConversionError",
    "DownloadError",
    "ExportError",
    "FastseqError",
    "InputError",
    "LoadError",
    "ONNXLoader",
    "ONNXModule",
    "ONNXSequential",
    "OpsetMismatchError",
    "ProviderError",
    "TensorInfo",
    "__version__",
    "add_metadata",
    "compose",
    "compose_bytes",
    "compose_to_file",
    "io_name_conversion",
    "load",
    "merge_models",
    "operators",
]
