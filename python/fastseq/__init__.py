"""fastseq: chain ONNX models into one graph in one pass, and run it with ONNX Runtime.

The public names are loaded on first use: ``import fastseq`` (and the CLI) pays neither for
onnx nor for onnxruntime until a model is composed or run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastseq._core import MAX_IR_VERSION, __version__

# Bound eagerly: the functions share their module's name, and a submodule imported later
# would otherwise shadow a lazily bound function (compose.py imports neither onnx nor numpy).
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
    RunError,
    RunTimeoutError,
)

# name -> the module that defines it, imported when the name is first read
_LAZY = {
    "ONNXSequential": "fastseq.sequential",
    "TensorInfo": "fastseq.session",
    "operators": "fastseq.operators",
    "ops": "fastseq.ops",
    "Pipeline": "fastseq.pipeline",
    "PipelineSpec": "fastseq.spec",
    "add_metadata": "fastseq.metadata",
    "ONNXModule": "fastseq.module",
    "load": "fastseq.module",
    "ONNXLoader": "fastseq.onnxloader",
    "io_name_conversion": "fastseq.rename",
}

if TYPE_CHECKING:
    from fastseq import operators, ops
    from fastseq.metadata import add_metadata
    from fastseq.module import ONNXModule, load
    from fastseq.onnxloader import ONNXLoader
    from fastseq.rename import io_name_conversion
    from fastseq.pipeline import Pipeline
    from fastseq.sequential import ONNXSequential
    from fastseq.session import TensorInfo
    from fastseq.spec import PipelineSpec


def __getattr__(name: str) -> Any:
    import importlib

    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fastseq' has no attribute '{name}'")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        from fastseq.errors import runtime_missing

        raise (runtime_missing(e) or e) from None
    value = mod if module.endswith("." + name) else getattr(mod, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


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
    "Pipeline",
    "PipelineSpec",
    "ProviderError",
    "RunError",
    "RunTimeoutError",
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
    "ops",
]
