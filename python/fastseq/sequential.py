"""ONNXSequential: kornia's ONNXSequential, composed by the Rust core in one pass."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import onnxruntime as ort

from fastseq import loader, session
from fastseq.runnable import Runnable
from fastseq.session import TensorInfo
from fastseq.spec import PipelineSpec, build

if TYPE_CHECKING:
    from fastseq import quantize

__all__ = ["ONNXSequential", "TensorInfo"]


class ONNXSequential(Runnable):
    """Chains ONNX models into one graph and runs it with ONNX Runtime.

    A drop-in for ``kornia.onnx.ONNXSequential``: same arguments, same ``io_maps``
    convention (``io_maps[i]`` joins model ``i`` to model ``i + 1``), same call
    (``pipe(x)`` returns the list of outputs). Models may be ``onnx.ModelProto``, bytes,
    paths, ``http(s)://`` URLs, ``hf://`` Hub ids or ``builtin:NAME`` operators.
    """

    def __init__(
        self,
        *models: loader.ModelSource,
        providers: Sequence[session.Provider] | None = None,
        session_options: ort.SessionOptions | None = None,
        io_maps: Sequence[Sequence[tuple[str, str]]] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        auto_ir_version_conversion: bool = False,
        target_ir_version: int | None = None,
        target_opset_version: int | None = None,
        force_download: bool = False,
        keep_outputs: bool | Sequence[str] = False,
        token: str | bool | None = None,
        sha256: str | Sequence[str | None] | None = None,
        session_cache: str | os.PathLike[str] | bool | None = None,
    ) -> None:
        if not models:
            raise TypeError("ONNXSequential needs at least one model")
        # kornia's linear form: a chain whose io_maps[i] joins model i to model i + 1.
        spec = PipelineSpec.chain(
            models,
            io_maps,
            sha256=sha256,
            keep_outputs=keep_outputs if isinstance(keep_outputs, bool) else list(keep_outputs),
            ir_version=target_ir_version,
            opset=target_opset_version if target_opset_version is not None
            else ("highest" if auto_ir_version_conversion else None),
            cache_dir=None if cache_dir is None else os.fspath(cache_dir),
            force_download=force_download,
            token=token,
            entry="sequential",
        )
        built = build(spec)
        self._composed, self._labels = built.composed, built.labels
        self._start(providers, session_options, session_cache)

    def quantize(self, path: str | os.PathLike[str], **options: Any) -> quantize.QuantizeResult:
        """Writes an int8 build of the composed pipeline to ``path`` (``onnxruntime.quantization``;
        options as :func:`fastseq.quantize.quantize`: ``static``, ``calibration``,
        ``per_channel``, ``format``) and returns what was written."""
        from fastseq import quantize

        return quantize.quantize_composed(self._composed, path, " -> ".join(self._labels), **options)
