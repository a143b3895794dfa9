"""ONNXModule: kornia's ONNXModule, one model behind the same session API as ONNXSequential."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import onnxruntime as ort

from fastseq.facades.base import Facade, build_cached
from fastseq.graph.spec import PipelineSpec
from fastseq.runtime.engine import SessionEngine
from fastseq.runtime.providers import Provider
from fastseq.sources import resolve as loader

if TYPE_CHECKING:
    import onnx

__all__ = ["ONNXModule", "load"]


class ONNXModule(Facade):
    """One ONNX model, ready to call: a drop-in for ``kornia.onnx.ONNXModule``.

    ``module(x)`` returns the list of outputs; ``module.export(path)``,
    ``module.add_metadata(pairs)``, ``create_session``/``get_session``/``set_session`` and
    ``as_cpu``/``as_cuda``/``as_tensorrt``/``as_openvino`` work as on
    :class:`fastseq.ONNXSequential`.

    Args:
        op: the model: an ``onnx.ModelProto``, serialized ``bytes``, a path (``str`` or
            ``os.PathLike``), an ``http(s)://`` URL, ``hf://NAME`` (kornia's
            ``kornia/ONNX_models`` repo), ``hf://org/repo[@revision]/path/file.onnx`` or
            ``builtin:NAME``. A ``ModelProto`` is copied: later edits to it change nothing here.
        providers: ONNX Runtime execution providers in priority order (names or
            ``(name, options)`` pairs); default ``["CPUExecutionProvider"]``.
        session_options: an ``onnxruntime.SessionOptions`` used as given; default: extended
            graph optimizations.
        cache_dir: where URL and Hub downloads are cached.
        target_ir_version: the IR version to give the model (default: its own).
        target_opset_version: the default-domain opset to convert the model to first (with
            ``onnx.version_converter``, on a copy without the weights).
        force_download: download a URL or Hub model again even when cached.
    """

    def __init__(
        self,
        op: loader.ModelSource,
        providers: Sequence[Provider] | None = None,
        session_options: ort.SessionOptions | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        target_ir_version: int | None = None,
        target_opset_version: int | None = None,
        *,
        force_download: bool = False,
    ) -> None:
        spec = PipelineSpec.chain(
            [op],
            ir_version=target_ir_version,
            opset=target_opset_version,
            cache_dir=None if cache_dir is None else os.fspath(cache_dir),
            force_download=force_download,
            entry="sequential",
        )
        built = build_cached(spec, None)
        # described: what a session-cache entry records of the stages
        self._engine = SessionEngine(built.composed, built.labels, described=built.described)
        del built  # only the engine holds the model now, so that it can be spilled
        self._engine.start(providers, session_options)

    @property
    def op(self) -> onnx.ModelProto:
        """The model as a fresh ``onnx.ModelProto`` (kornia's ``op`` attribute; a copy here:
        editing it changes nothing in the module). Below 2 GB only."""
        return self.model


def load(model_name: loader.ModelSource, *, force_download: bool = False) -> ONNXModule:
    """An :class:`ONNXModule` for ``model_name`` (a path, URL, ``hf://`` id or model):
    kornia's ``kornia.onnx.load``."""
    return ONNXModule(model_name, force_download=force_download)
