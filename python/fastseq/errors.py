"""fastseq's exception classes. The core raises the first five; the Python layer the rest."""

from fastseq._core import (
    CompositionError,
    ExportError,
    FastseqError,
    LoadError,
    OpsetMismatchError,
)


class ConversionError(FastseqError):
    """An opset or IR version conversion cannot be done."""


class DownloadError(LoadError):
    """A URL or Hub download failed."""


class PipelineFileError(LoadError):
    """A pipeline file (``pipeline.toml``) that cannot be read: not UTF-8 text, not TOML, a
    key of the wrong type or nested deeper than any pipeline file is. The message names the
    file and the key."""


class OperatorError(LoadError, ValueError):
    """A built-in operator was asked for by a name that does not exist, or with bad
    parameters. It is a :class:`fastseq.LoadError` (building a stage is loading it) and a
    ``ValueError`` (the arguments are wrong)."""


class InputError(FastseqError, ValueError):
    """The arrays passed to a pipeline do not match its inputs."""


class RunError(FastseqError):
    """ONNX Runtime refused or failed on a composed model (session creation or a call); the
    message names the stage and its own node and tensor names, the original is the cause."""


class RunTimeoutError(RunError, TimeoutError):
    """A call ran past its ``timeout`` or was terminated through its ``RunOptions``."""


class ProviderError(FastseqError, ValueError):
    """An execution provider name that no onnxruntime build knows (a typo)."""


def human_size(n: float) -> str:
    """1536 -> '1.5 KB', for messages and summaries."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


__all__ = [
    "CompositionError",
    "ConversionError",
    "DownloadError",
    "ExportError",
    "FastseqError",
    "InputError",
    "LoadError",
    "OpsetMismatchError",
    "PipelineFileError",
    "ProviderError",
    "RunError",
    "RunTimeoutError",
]


#: Why a runtime name cannot load without ONNX Runtime, and how to install it. ONNX Runtime
#: is an extra, not a dependency: onnxruntime-gpu and onnxruntime share a module, so pip
#: must never install the CPU package beside the GPU one.
NO_RUNTIME = (
    "running a pipeline needs ONNX Runtime, which is not installed: "
    "pip install 'fastseq[cpu]' (or 'fastseq[gpu]' for onnxruntime-gpu; never both). "
    "Composing and exporting (fastseq.compose*, merge_models, `fastseq merge`) work without it."
)


def runtime_missing(error: ModuleNotFoundError) -> ModuleNotFoundError | None:
    """The error to raise for ``error`` when it is ONNX Runtime that is missing, else None."""
    if error.name != "onnxruntime":
        return None
    return ModuleNotFoundError(NO_RUNTIME, name="onnxruntime")
