"""fastseq: chain ONNX models into one graph in one pass, and run it with ONNX Runtime.

The public names are loaded on first use: ``import fastseq`` (and the CLI) pays neither for
onnx nor for onnxruntime until a model is composed or run."""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from fastseq._core import MAX_IR_VERSION, __version__
from fastseq.errors import (
    CompositionError,
    ConversionError,
    DownloadError,
    ExportError,
    FastseqError,
    InputError,
    LoadError,
    OpsetMismatchError,
    RunError,
    RunTimeoutError,
)

# name -> the module that defines it, imported when the name is first read
_LAZY = {
    "compose": "fastseq.compose",
    "compose_bytes": "fastseq.compose",
    "compose_to_file": "fastseq.compose",
    "merge_models": "fastseq.compose",
    "ONNXSequential": "fastseq.sequential",
    "TensorInfo": "fastseq.session",
    "operators": "fastseq.operators",
}

if TYPE_CHECKING:
    from fastseq import operators
    from fastseq.compose import compose, compose_bytes, compose_to_file, merge_models
    from fastseq.sequential import ONNXSequential
    from fastseq.session import TensorInfo


def __getattr__(name: str) -> Any:
    import importlib

    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fastseq' has no attribute '{name}'")
    mod = importlib.import_module(module)
    value = mod if name == "operators" else getattr(mod, name)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """Importing the submodule fastseq.compose (the package's own modules do) makes Python
    set ``fastseq.compose`` to that module; the public name is the function."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "compose" and isinstance(value, types.ModuleType):
            value = value.compose
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


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
    "ONNXSequential",
    "OpsetMismatchError",
    "RunError",
    "RunTimeoutError",
    "TensorInfo",
    "__version__",
    "compose",
    "compose_bytes",
    "compose_to_file",
    "merge_models",
    "operators",
]
