"""fastseq: chain ONNX models into one graph in one pass, and run it with ONNX Runtime.

The public names are loaded on first use: ``import fastseq`` (and the CLI) pays neither for
onnx nor for onnxruntime until a model is composed or run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastseq._core import MAX_IR_VERSION, __version__
from fastseq.errors import (
    CompositionError,
    ConversionError,
    DownloadError,
    DownloadTimeoutError,
    ExportError,
    FastseqError,
    InputError,
    LoadError,
    MissingExtraError,
    OperatorError,
    OpsetMismatchError,
    PipelineFileError,
    ProviderError,
    RequestError,
    RunError,
    RunTimeoutError,
)

# name -> the module that defines it, imported when the name is first read
_LAZY = {
    "compose": "fastseq.facades.compose",
    "compose_bytes": "fastseq.facades.compose",
    "compose_to_file": "fastseq.facades.compose",
    "merge_models": "fastseq.facades.compose",
    "ONNXSequential": "fastseq.facades.sequential",
    "ONNXModule": "fastseq.facades.module",
    "load": "fastseq.facades.module",
    "ONNXLoader": "fastseq.facades.onnx_loader",
    "Pipeline": "fastseq.facades.pipeline",
    "PipelineSpec": "fastseq.graph.spec",
    "add_metadata": "fastseq.graph.metadata",
    "io_name_conversion": "fastseq.graph.rename",
    "TensorInfo": "fastseq.runtime.tensors",
    "SessionCache": "fastseq.runtime.cache",
    "Batcher": "fastseq.runtime.batcher",
    "Profile": "fastseq.runtime.profile",
    "serve": "fastseq.serving",
    # made on first use: its base class, urllib's ContentTooShortError, is slow to import
    "TruncatedDownloadError": "fastseq.errors",
    # made on first use: they derive from onnx's checker errors (fastseq.onnx_compose raises them)
    "InvalidModelError": "fastseq.errors",
    "InvalidShapesError": "fastseq.errors",
}
# public submodules, imported when first read as attributes (``fastseq.ops.shipped`` is the
# shipped models)
_MODULES = {"ops": "fastseq.ops", "serving": "fastseq.serving"}

if TYPE_CHECKING:
    from fastseq import ops, serving

    # public through __getattr__ (made on first use), not in __all__: re-exported for type checkers
    from fastseq.errors import InvalidModelError as InvalidModelError
    from fastseq.errors import InvalidShapesError as InvalidShapesError
    from fastseq.errors import TruncatedDownloadError
    from fastseq.facades.compose import compose, compose_bytes, compose_to_file, merge_models
    from fastseq.facades.module import ONNXModule, load
    from fastseq.facades.onnx_loader import ONNXLoader
    from fastseq.facades.pipeline import Pipeline
    from fastseq.facades.sequential import ONNXSequential
    from fastseq.graph.metadata import add_metadata
    from fastseq.graph.rename import io_name_conversion
    from fastseq.graph.spec import PipelineSpec
    from fastseq.runtime.batcher import Batcher
    from fastseq.runtime.cache import SessionCache
    from fastseq.runtime.profile import Profile
    from fastseq.runtime.tensors import TensorInfo
    from fastseq.serving import serve


def __getattr__(name: str) -> Any:
    import importlib

    module = _LAZY.get(name) or _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'fastseq' has no attribute '{name}'")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        from fastseq.errors import runtime_missing

        raise (runtime_missing(e) or e) from None
    value = mod if name in _MODULES else getattr(mod, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_MODULES))


__all__ = [
    "MAX_IR_VERSION",
    "Batcher",
    "CompositionError",
    "ConversionError",
    "DownloadError",
    "DownloadTimeoutError",
    "ExportError",
    "FastseqError",
    "InputError",
    "LoadError",
    "MissingExtraError",
    "ONNXLoader",
    "ONNXModule",
    "ONNXSequential",
    "OperatorError",
    "OpsetMismatchError",
    "Pipeline",
    "PipelineFileError",
    "PipelineSpec",
    "Profile",
    "ProviderError",
    "RequestError",
    "RunError",
    "RunTimeoutError",
    "SessionCache",
    "TensorInfo",
    "TruncatedDownloadError",
    "__version__",
    "add_metadata",
    "compose",
    "compose_bytes",
    "compose_to_file",
    "io_name_conversion",
    "load",
    "merge_models",
    "ops",
    "serve",
    "serving",
]
