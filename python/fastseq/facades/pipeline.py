"""Pipeline: named stages joined by edges (a graph, not only a chain), built into one model
and run with ONNX Runtime through the same API as ONNXSequential."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastseq.facades.base import Facade, build_cached, flag
from fastseq.graph import drawing, pipefile, pipefile_write
from fastseq.graph.parts import Edge
from fastseq.graph.session_settings import session_options, session_options_dict
from fastseq.graph.spec import PipelineSpec
from fastseq.runtime.engine import SessionEngine

if TYPE_CHECKING:
    from fastseq.runtime.cache import SessionCache
    from fastseq.runtime.profile import Profile

__all__ = ["Pipeline"]


class Pipeline(Facade):
    """Models as a graph of named stages, composed into one model and run as one session::

        pipe = fastseq.Pipeline(
            {"pre": "builtin:normalize", "backbone": "resnet.onnx", "cls": "head.onnx", "seg": "seg.onnx"},
            edges=["pre.output -> backbone.input", "backbone.features -> cls.x",
                   "backbone.features -> seg.x", "pre.output -> seg.skip"],
            inputs={"image": ["pre.input"]},   # one graph input may feed several stages
            outputs=["cls.logits", "seg.mask"],  # any stage's outputs; "name=stage.out" renames
        )
        logits, mask = pipe(image)

    Stages take every model form ONNXSequential takes (a value may also be
    ``{"source": ..., "sha256": ...}``) and are ordered topologically. Stage inputs that no
    edge or graph input feeds become graph inputs under their own name when unique, else
    ``stage.input``. Without ``outputs``, every output that no edge consumes is exposed.
    What no exposed output needs is pruned (``prune=False`` keeps it); identical weights
    are stored once (``dedupe=False`` keeps copies); ``adapt=True`` (or a list of edges)
    inserts a Cast or an (Un)squeeze where an edge's two sides differ in type or batch axis.
    The session API is ONNXSequential's: ``providers``, ``session_options``,
    ``session_cache`` (where ONNX Runtime's optimised model is kept between starts: a
    folder, True, or a :class:`SessionCache`),
    calls, ``run(..., timeout=)``, ``bind``, ``export(..., optimized=True)``.
    ``row_independent=True`` declares that each row's outputs depend on that row alone (its
    batcher and ``fastseq serve`` batch it without the core's analysis); ``dynamic_batch=True``
    gives a batch-1 export a dynamic batch axis where the analysis proves it (as
    ONNXSequential's).
    """

    spec: PipelineSpec

    def __init__(
        self,
        stages: Mapping[str, Any],
        edges: Sequence[str | Edge | tuple[Any, ...]] = (),
        inputs: Mapping[str, str | Sequence[str]] | None = None,
        outputs: Sequence[str] | None = None,
        *,
        providers: Sequence[Any] | None = None,
        session_options: Any = None,
        adapt: bool | Sequence[int | str] = False,
        prune: bool = True,
        dedupe: bool = True,
        opset: int | str | None = None,
        ir_version: int | None = None,
        metadata: Mapping[str, str] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        force_download: bool = False,
        token: str | bool | None = None,
        session_cache: SessionCache | str | os.PathLike[str] | bool | None = None,
        row_independent: bool = False,
        dynamic_batch: bool = False,
    ) -> None:
        spec = PipelineSpec.graph(
            stages,
            edges,
            inputs,
            outputs,
            adapt=adapt,
            providers=list(providers) if providers else None,
            session_options=session_options,
            # Only a departure from the graph defaults is recorded (and written to a file).
            prune=None if prune else False,
            dedupe=None if dedupe else False,
            opset=opset,
            ir_version=ir_version,
            metadata=dict(metadata or {}),
            cache_dir=None if cache_dir is None else os.fspath(cache_dir),
            force_download=force_download,
            token=token,
            row_independent=flag("row_independent", row_independent),
            dynamic_batch=flag("dynamic_batch", dynamic_batch),
        )
        self._build(spec, session_cache)

    @classmethod
    def from_spec(
        cls, spec: PipelineSpec, session_cache: SessionCache | str | os.PathLike[str] | bool | None = None
    ) -> Pipeline:
        """A pipeline built from a graph description (``session_cache`` as in the constructor)."""
        if not spec.is_graph and any(st.name is None for st in spec.stages):
            raise TypeError("Pipeline needs named stages: a graph (edges) or a chain of named stages (a pipeline file)")
        pipe = cls.__new__(cls)
        pipe._build(spec, session_cache)
        return pipe

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], session_cache: SessionCache | str | os.PathLike[str] | bool | None = None
    ) -> Pipeline:
        """The pipeline that the TOML file at ``path`` describes (see :mod:`fastseq.graph.pipefile`)."""
        return cls.from_spec(pipefile.read(path), session_cache)

    def to_file(self, path: str | os.PathLike[str]) -> Path:
        """Writes this pipeline's description as a TOML pipeline file (atomically); in-memory
        models are saved beside it. ``Pipeline.from_file`` reads it back."""
        return pipefile_write.write(self.spec, path)

    def _build(
        self, spec: PipelineSpec, session_cache: SessionCache | str | os.PathLike[str] | bool | None = None
    ) -> None:
        built = build_cached(spec, session_cache)
        self.spec = spec
        self.row_independent = spec.row_independent
        self._given = built.given  # the stages as given: what verify() runs one by one
        # described: what a session-cache entry records of the stages
        self._engine = SessionEngine(built.composed, built.labels, described=built.described)
        self._plan, self._sources, self._report = built.plan, built.sources, built.report
        del built  # only the engine holds the model now, so that it can be spilled
        self._engine.start(spec.providers, session_options(spec.session_options), session_cache)

    # --- what was built -----------------------------------------------------------------
    @property
    def stages(self) -> list[str]:
        """The stage names in graph (topological) order."""
        return self._engine.labels

    @property
    def edges(self) -> list[Edge]:
        """The edges, as given."""
        return [Edge(src, output, dst, inp) for src, output, dst, inp, _ in self._plan["edges"]]

    def report(self) -> dict[str, Any]:
        """What the build did besides merging, as the core reports it: ``pruned``
        (``stages``, ``nodes``, ``initializers``, ``inputs``), ``deduped_initializers``,
        ``deduped_bytes``, ``adapters`` ([(edge index, description)]) and
        ``unused_outputs`` ([(stage, output)])."""
        return dict(self._report)

    def to_dot(self, profile: Profile | None = None) -> str:
        """The stage graph as Graphviz DOT text (no Graphviz needed); with a ``profile``
        (:meth:`profile`), each stage's time and share, the hottest stage in red."""
        if profile is None:
            return drawing.to_dot(self._plan, "pipeline", self._sources)
        hottest = profile.hottest
        return drawing.to_dot(
            self._plan, "pipeline", self._sources, profile.stage_labels(), hottest.name if hottest else None
        )

    def to_svg(self, profile: Profile | None = None) -> str:
        """The stage graph as SVG, through Graphviz's ``dot`` (ExportError without it);
        ``profile`` as in :meth:`to_dot`."""
        return drawing.to_svg(self.to_dot(profile))

    def _repr_svg_(self) -> str | None:
        # Notebooks fall back to repr() where Graphviz is missing.
        return self.to_svg() if drawing.have_dot() else None

    def _title(self) -> str:
        return f"stages {', '.join(self._engine.labels)}; {len(self._plan['edges'])} edges"

    # Pickling: the composed model (Runnable's) plus the description and the core's plan.
    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        spec = self.spec
        if spec.session_options is not None and not isinstance(spec.session_options, Mapping):
            from dataclasses import replace

            spec = replace(spec, session_options=session_options_dict(spec.session_options))
        state.update(spec=spec, plan=self._plan, sources=self._sources, report=self._report)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.spec, self._plan, self._report = state["spec"], state["plan"], state["report"]
        self.row_independent = self.spec.row_independent
        self._sources = state["sources"]
        self._engine = SessionEngine.from_portable(state, session_options(self.spec.session_options))
