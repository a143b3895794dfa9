"""fastseq's exception classes, all defined here; the Rust core raises the first five
(it looks them up in this module the first time it needs one).

Every class says ``__module__ = "fastseq"``: tracebacks print ``fastseq.LoadError`` and
pickle finds the class at ``fastseq.LoadError``, so an error raised in a worker process (a
``ProcessPoolExecutor``, a Ray task) arrives as itself, with its message, its attributes
and, where the cause pickles too, its cause.

Where kornia or onnx.compose raise a standard class for the same failure, fastseq's class
derives from it too, so that code written for them keeps catching it: a ``LoadError`` is a
``ValueError`` (kornia raises ``ValueError`` for a model that is missing or cannot be
downloaded), a ``DownloadTimeoutError`` a ``TimeoutError``, a ``TruncatedDownloadError`` a
``urllib.error.ContentTooShortError``. That last one is made on first use: importing
urllib.error costs ``import fastseq`` about 25 ms."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _portable(cause: BaseException | None) -> BaseException | None:
    """``cause`` if it survives pickling, else an ``Exception`` with its class and text (an
    ``HTTPError`` holds an open response and cannot be rebuilt from its ``args``)."""
    import pickle

    if cause is None:
        return None
    try:
        pickle.loads(pickle.dumps(cause))
        return cause
    except Exception:  # noqa: BLE001  (whatever pickling a foreign exception raises)
        kind = type(cause)
        return Exception(f"{kind.__module__}.{kind.__qualname__}: {cause}")


def _rebuild(
    cls: type, args: tuple[Any, ...], state: dict[str, Any], cause: BaseException | None, suppress: bool
) -> BaseException:
    """Unpickles a fastseq error without calling its ``__init__`` (some take other
    arguments than their ``args``)."""
    # The built-in class whose layout the instance has (OSError's for a TimeoutError
    # subclass): only its __new__ may make one.
    solid: Any = cls
    while solid.__flags__ & (1 << 9):  # Py_TPFLAGS_HEAPTYPE: a class defined in Python
        solid = solid.__base__
    error: BaseException = solid.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    error.__cause__ = cause
    error.__suppress_context__ = suppress
    return error


class FastseqError(Exception):
    """Base class of every fastseq error."""

    __module__ = "fastseq"

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (
            type(self),
            self.args,
            dict(self.__dict__),
            _portable(self.__cause__),
            self.__suppress_context__,
        )


class LoadError(FastseqError, ValueError):
    """A source is not a usable ONNX model: missing, unreadable, not a model, or it cannot be
    downloaded. A ``ValueError`` too, as kornia's ``ONNXLoader`` raises for a missing model."""

    __module__ = "fastseq"


class CompositionError(FastseqError, ValueError):
    """The models cannot be joined as asked (a ``ValueError``, as onnx.compose raises)."""

    __module__ = "fastseq"


class OpsetMismatchError(CompositionError):
    """Opset versions of one domain differ."""

    __module__ = "fastseq"


class ExportError(FastseqError):
    """Writing a model failed."""

    __module__ = "fastseq"


class ConversionError(FastseqError):
    """An opset or IR version conversion cannot be done."""

    __module__ = "fastseq"


class DownloadError(LoadError):
    """A URL or Hub download failed; the error that ended it (an ``HTTPError``, a socket
    error) is the ``__cause__``. A ``ValueError``, as kornia raises for an HTTP error or a
    download that ``download=False`` forbids."""

    __module__ = "fastseq"


class DownloadTimeoutError(DownloadError, TimeoutError):
    """A download whose server went quiet past the per-read timeout
    (``KORNIA_DOWNLOAD_TIMEOUT``) or that ran past its deadline
    (``FASTSEQ_DOWNLOAD_DEADLINE``). A ``TimeoutError``, as kornia raises."""

    __module__ = "fastseq"


class PipelineFileError(LoadError):
    """A pipeline file (``pipeline.toml``) that cannot be read: not UTF-8 text, not TOML, a
    key of the wrong type or nested deeper than any pipeline file is. The message names the
    file and the key."""

    __module__ = "fastseq"


class OperatorError(LoadError):
    """A built-in operator was asked for by a name that does not exist, or with bad
    parameters. It is a :class:`fastseq.LoadError` (building a stage is loading it) and a
    ``ValueError`` (the arguments are wrong)."""

    __module__ = "fastseq"


class InputError(FastseqError, ValueError):
    """The arrays passed to a pipeline do not match its inputs."""

    __module__ = "fastseq"


class RunError(FastseqError):
    """ONNX Runtime refused or failed on a composed model (session creation or a call); the
    message names the stage and its own node and tensor names, the original is the cause."""

    __module__ = "fastseq"


class RunTimeoutError(RunError, TimeoutError):
    """A call ran past its ``timeout`` or was terminated through its ``RunOptions``."""

    __module__ = "fastseq"


class RequestError(InputError):
    """An inference request to ``fastseq serve`` that the server refuses: not the KServe v2
    protocol, not the model's inputs, or past a limit. ``status`` is the HTTP status it is
    answered with (400, 404, 413, 503, ...); the message names the model and the tensors in
    the pipeline's own names."""

    __module__ = "fastseq"

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class ProviderError(FastseqError, ValueError):
    """An execution provider name that no onnxruntime build knows (a typo)."""

    __module__ = "fastseq"


class MissingExtraError(FastseqError, ModuleNotFoundError):
    """A feature needs an extra that is not installed (``fastseq.serve`` the ``serve`` extra,
    ``fastseq run --ray`` the ``ray`` one, ...): the message names the feature, the extra, the
    modules missing and the command that installs them; ``extra`` is the extra's name. A
    ``ModuleNotFoundError`` too, as importing the missing module raises."""

    __module__ = "fastseq"

    def __init__(self, message: str, *, extra: str = "", name: str | None = None) -> None:
        super().__init__(message, name=name)
        self.extra = extra


def _truncated_download_error() -> type:
    import urllib.error

    class TruncatedDownloadError(DownloadError, urllib.error.ContentTooShortError):
        """A download whose body ended before the length its ``Content-Length`` announced.
        A ``urllib.error.ContentTooShortError`` (and so a ``URLError`` and an ``OSError``),
        as kornia raises; ``received`` and ``announced`` count the bytes."""

        __module__ = "fastseq"
        __qualname__ = "TruncatedDownloadError"

        def __init__(self, message: str, content: bytes = b"", *, received: int = 0, announced: int = 0) -> None:
            # typeshed types content as urlretrieve's (filename, headers); any value is kept
            urllib.error.ContentTooShortError.__init__(self, message, content)  # type: ignore[arg-type]
            self.received, self.announced = received, announced

        def __str__(self) -> str:  # URLError's would print "<urlopen error ...>"
            return str(self.args[0]) if self.args else ""

    return TruncatedDownloadError


def _invalid_model_error() -> type:
    from onnx.checker import ValidationError

    class InvalidModelError(FastseqError, ValidationError):
        """A model that ``onnx.checker`` refuses, where ``fastseq.onnx_compose`` would have to
        return it: an ``onnx.checker.ValidationError``, as onnx.compose raises for the same
        models. The checker's own error is the ``__cause__``."""

        __module__ = "fastseq"
        __qualname__ = "InvalidModelError"

    return InvalidModelError


def _invalid_shapes_error() -> type:
    from onnx.shape_inference import InferenceError

    class InvalidShapesError(FastseqError, InferenceError):
        """A model whose types or shapes ``onnx.checker.check_model(full_check=True)`` finds
        inconsistent, where ``fastseq.onnx_compose`` would have to return it: an
        ``onnx.shape_inference.InferenceError``, what that check raises. The checker's own
        error is the ``__cause__``."""

        __module__ = "fastseq"
        __qualname__ = "InvalidShapesError"

    return InvalidShapesError


#: classes made on first use, by name (those deriving from another package's class import
#: it only then)
_LAZY = {
    "TruncatedDownloadError": _truncated_download_error,
    "InvalidModelError": _invalid_model_error,
    "InvalidShapesError": _invalid_shapes_error,
}


def __getattr__(name: str) -> Any:
    make = _LAZY.get(name)
    if make is None:
        raise AttributeError(f"module 'fastseq.errors' has no attribute '{name}'")
    cls = globals()[name] = make()
    return cls


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
    "DownloadTimeoutError",
    "ExportError",
    "FastseqError",
    "InputError",
    "InvalidModelError",  # noqa: F822 - made on first use by __getattr__ (_LAZY)
    "InvalidShapesError",  # noqa: F822 - made on first use by __getattr__ (_LAZY)
    "LoadError",
    "MissingExtraError",
    "OperatorError",
    "OpsetMismatchError",
    "PipelineFileError",
    "ProviderError",
    "RequestError",
    "RunError",
    "RunTimeoutError",
    "TruncatedDownloadError",  # noqa: F822 - made on first use by __getattr__ (_LAZY)
]


#: The distribution that installs fastseq (pyproject.toml's name; the package imports as
#: ``fastseq``). "fastseq" on the package index is another project (Microsoft's FastSeq).
DISTRIBUTION = "fastseq-onnx"


def install_command(extra: str) -> str:
    """The command that installs fastseq with ``extra``: ``pip install 'fastseq-onnx[serve]'``."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def require_extra(feature: str, extra: str, modules: Sequence[str]) -> None:
    """Raises :class:`MissingExtraError` for ``feature`` when a module of ``extra`` cannot be
    imported (looked for, not imported)."""
    import importlib.util

    missing = []
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a parent package missing, or a module set to None
            found = False
        if not found:
            missing.append(module)
    if missing:
        raise MissingExtraError(
            f"{feature} needs the {extra} extra, which is not installed ({', '.join(missing)} missing): "
            f"{install_command(extra)}",
            extra=extra,
            name=missing[0],
        )


def missing_extra(feature: str, extra: str, error: ModuleNotFoundError) -> MissingExtraError:
    """The :class:`MissingExtraError` for ``feature``, whose import of a module of ``extra``
    failed with ``error``."""
    return MissingExtraError(
        f"{feature} needs the {extra} extra, which is not installed ({error.name or error} "
        f"missing): {install_command(extra)}",
        extra=extra,
        name=error.name,
    )


#: Why a runtime name cannot load without ONNX Runtime, and how to install it. ONNX Runtime
#: is an extra, not a dependency: onnxruntime-gpu and onnxruntime share a module, so pip
#: must never install the CPU package beside the GPU one.
NO_RUNTIME = (
    "running a pipeline needs ONNX Runtime, which is not installed: "
    f"{install_command('cpu')} (or '{DISTRIBUTION}[gpu]' for onnxruntime-gpu; never both). "
    "Composing and exporting (fastseq.compose*, merge_models, `fastseq merge`) work without it."
)


def runtime_missing(error: ModuleNotFoundError) -> ModuleNotFoundError | None:
    """The error to raise for ``error`` when it is ONNX Runtime that is missing, else None."""
    if error.name != "onnxruntime":
        return None
    return ModuleNotFoundError(NO_RUNTIME, name="onnxruntime")
