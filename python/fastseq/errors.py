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


class InputError(FastseqError, ValueError):
    """The arrays passed to a pipeline do not match its inputs."""


__all__ = [
    "CompositionError",
    "ConversionError",
    "DownloadError",
    "ExportError",
    "FastseqError",
    "InputError",
    "LoadError",
    "OpsetMismatchError",
]
