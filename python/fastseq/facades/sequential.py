"""ONNXSequential: kornia's ONNXSequential, composed by the Rust core in one pass."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import onnxruntime as ort

from fastseq.errors import CompositionError
from fastseq.facades.base import Facade, build_cached, flag
from fastseq.graph.build import build
from fastseq.graph.spec import PipelineSpec
from fastseq.runtime.engine import SessionEngine
from fastseq.runtime.providers import Provider
from fastseq.runtime.tensors import TensorInfo
from fastseq.sources import resolve as loader

if TYPE_CHECKING:
    import onnx

    from fastseq import _core, quantize
    from fastseq.runtime.cache import SessionCache

__all__ = ["ONNXSequential", "TensorInfo"]


class ONNXSequential(Facade):
    """Chains ONNX models into one graph and runs it with ONNX Runtime.

    A drop-in for ``kornia.onnx.ONNXSequential``: same arguments, same ``io_maps``
    convention, same call (``pipe(x)`` returns the list of outputs), same methods
    (``combine``, ``add_metadata``, ``export``, ``create_session``, ``get_session``,
    ``set_session``, ``as_cpu``/``as_cuda``/``as_tensorrt``/``as_openvino``). Unlike
    kornia, the graph inputs and outputs keep the models' own names (no ``K00-`` prefix),
    names that clash are made unique, and the merge is one pass however many models.

    Args:
        *models: the models, in the order they run. Each is an ``onnx.ModelProto``,
            serialized ``bytes``, a path (``str`` or ``os.PathLike``, ``~`` expanded; external
            data is read beside it), an ``http(s)://`` URL (cached; a ``#sha256=<hex>``
            fragment is checked), ``hf://NAME`` (kornia's ``NAME.onnx`` in the Hub repo
            ``kornia/ONNX_models``), ``hf://org/repo[@revision]/path/file.onnx``, or
            ``builtin:NAME`` (an operator shipped with fastseq).
        providers: ONNX Runtime execution providers in priority order, names or
            ``(name, options)`` pairs; default ``["CPUExecutionProvider"]``. A provider this
            onnxruntime build lacks is a ``RuntimeWarning`` (the others are used); a name that
            no build knows is a ``ProviderError`` with the near miss.
        session_options: an ``onnxruntime.SessionOptions`` used as given; default: extended
            graph optimizations (kornia's default).
        io_maps: how consecutive models connect: ``io_maps[i]`` is the list of
            ``(output, input)`` pairs joining model ``i`` to model ``i + 1``, in the models'
            own names, e.g. ``[[("y", "x")], [("logits", "z")]]`` for three models. An output
            may feed several inputs; inputs no pair feeds become graph inputs. For two models
            the flat form ``[("y", "x")]`` is accepted too, and kornia's ``{0: [...]}``.
            Default: each joint connects outputs to inputs by position.
        cache_dir: where URL and Hub downloads are cached (default: huggingface_hub's cache
            for ``hf://``, ``$FASTSEQ_CACHE`` or ``~/.cache/fastseq`` for URLs).
        auto_ir_version_conversion: convert every model to one default-domain opset (the
            highest among them, or ``target_opset_version``) before composing, with
            ``onnx.version_converter`` on a copy without the weights.
        target_ir_version: the IR version of the composed model (default: the highest of the
            models').
        target_opset_version: the default-domain opset to convert every model to first.
        force_download: download URLs and Hub models again even when cached.
        keep_outputs: which outputs the composed model exposes besides the last model's:
            False (default) only the last model's; True every output no later model consumes
            (kornia's behaviour); or a list of output names to keep.
        token: the Hugging Face token for ``hf://`` models (a string, True for the stored
            login, False for none; default: huggingface_hub's own lookup).
        sha256: the expected SHA-256 hex digest of each model file, checked before the file
            is used (a cached download that does not match is fetched again once): one string
            for a single model, else a list with one digest or None per model.
        session_cache: where ONNX Runtime's optimised model is kept between starts (a
            folder, True for ``~/.cache/fastseq/sessions``, a :class:`SessionCache` for a
            folder with its own size limit, False for none; default: the
            ``FASTSEQ_SESSION_CACHE`` variable, a folder or 1, else none). A later start of
            the same pipeline, in any process, skips the graph optimisations.
        adapt: where an output and the input it feeds differ in element type or by one axis
            of size 1, insert a Cast, an Unsqueeze or a Squeeze (True for every joint, or a
            list of edge indices: the joints' pairs in order). The axis is read from the
            shapes' sizes and names (``[N, 32] -> [N, 1, 32]`` is an Unsqueeze of axis 1);
            where several would fit, the error says so and none is inserted. Default False:
            a mismatch is an error that names the adapter that would fix it.
        dynamic_batch: a model exported with a batch of 1 (its inputs' first axis a fixed 1)
            gets a dynamic batch axis: constant Reshape shapes copy the rows' axis, where the
            core's batch analysis proves each row stays apart; where it cannot, a
            CompositionError names the stage and node (docs/real-models.md).

    Raises:
        LoadError, DownloadError: a source is missing, corrupt or cannot be downloaded.
        CompositionError: the models cannot be joined as ``io_maps`` says (the message
            names the joint, the models and the near miss).
        OpsetMismatchError: two models import different opsets of one domain.
        ConversionError: a requested opset conversion cannot be done.
    """

    def __init__(
        self,
        *models: loader.ModelSource,
        providers: Sequence[Provider] | None = None,
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
        session_cache: SessionCache | str | os.PathLike[str] | bool | None = None,
        adapt: bool | Sequence[int] = False,
        dynamic_batch: bool = False,
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
            opset=target_opset_version
            if target_opset_version is not None
            else ("highest" if auto_ir_version_conversion else None),
            cache_dir=None if cache_dir is None else os.fspath(cache_dir),
            force_download=force_download,
            token=token,
            entry="sequential",
            keep_stages=True,
            adapt=adapt if isinstance(adapt, bool) else list(adapt),
            dynamic_batch=flag("dynamic_batch", dynamic_batch),
        )
        built = build_cached(spec, session_cache)
        self._given = built.given  # the stages as given: what verify() runs one by one
        # The loaded models (stages) share their weights with the composed one: combine()
        # composes them again without reading or downloading anything. described: what a
        # session-cache entry records of the stages.
        self._engine = SessionEngine(built.composed, built.labels, stages=built.stages, described=built.described)
        self._spec = spec
        del built  # only the engine holds the models now, so that they can be spilled
        self._engine.start(providers, session_options, session_cache)

    def combine(self, io_maps: Sequence[Sequence[tuple[str, str]]] | None = None) -> onnx.ModelProto:
        """Composes the pipeline's models again with ``io_maps`` (same forms as the
        constructor's; None joins outputs to inputs by position) and returns the result as
        a new ``onnx.ModelProto`` (below 2 GB). Nothing is read or downloaded again, and the
        pipeline itself (its model and session) is not changed; the ``keep_outputs`` and
        ``target_ir_version`` it was built with apply. As in kornia, the models' own
        metadata is kept but not what :meth:`add_metadata` added to the pipeline.

        Raises:
            CompositionError: ``io_maps`` does not fit the models; or the pipeline came from
                pickling, which carries the composed model only.
        """
        import onnx

        stages = self._held_stages("combine them again; build an ONNXSequential from the models instead")
        spec = PipelineSpec.chain(
            stages, io_maps, keep_outputs=self._spec.keep_outputs, ir_version=self._spec.ir_version, entry="sequential"
        )
        return onnx.ModelProto.FromString(build(spec).composed.to_bytes())

    @property
    def operators(self) -> list[onnx.ModelProto]:
        """The models the pipeline was built from (after any opset conversion), as fresh
        ``onnx.ModelProto`` copies (kornia's ``operators`` attribute)."""
        import onnx

        return [onnx.ModelProto.FromString(s.to_bytes()) for s in self._held_stages("list them")]

    def _held_stages(self, what: str) -> list[_core.Composed]:
        stages = self._engine.stages
        if stages is None:
            raise CompositionError(
                f"this pipeline was unpickled: it carries its composed model but not the models it was built "
                f"from, so it cannot {what}"
            )
        return stages

    def quantize(self, path: str | os.PathLike[str], **options: Any) -> quantize.QuantizeResult:
        """Writes an int8 build of the composed pipeline to ``path`` (``onnxruntime.quantization``;
        options as :func:`fastseq.quantize.quantize`: ``static``, ``calibration``,
        ``per_channel``, ``format``) and returns what was written."""
        from fastseq import quantize

        return quantize.quantize_composed(self._engine.composed, path, " -> ".join(self._engine.labels), **options)
