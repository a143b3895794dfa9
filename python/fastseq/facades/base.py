"""What the public classes add to the runner: the integrations that sit above it."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from fastseq.graph.build import Built, build
from fastseq.runtime.runnable import Runnable

if TYPE_CHECKING:
    from fastseq.graph.spec import PipelineSpec
    from fastseq.runtime.cache import SessionCache
    from fastseq.runtime.parity import Parity


def flag(name: str, value: Any) -> bool:
    """A keyword that must be True or False (an :class:`fastseq.InputError` otherwise)."""
    if not isinstance(value, bool):
        from fastseq.errors import InputError

        raise InputError(f"{name} must be True or False, got {value!r}")
    return value


def build_cached(spec: PipelineSpec, session_cache: SessionCache | str | os.PathLike[str] | bool | None) -> Built:
    """:func:`~fastseq.graph.build.build` for an entry point with a session cache: stages
    converted to other opsets are kept in it, so that a later start neither converts them
    again nor imports onnx (the session itself comes from the cache as always). With
    ``spec.dynamic_batch`` a batch-1 export gets its dynamic batch axis here (the core's
    adapter, refused with the stage and node where it cannot be proved)."""
    built = _built(spec, session_cache)
    if spec.dynamic_batch:
        from fastseq.runtime.rows import dynamic_batch

        built.composed = dynamic_batch(built.composed)
    return built


def _built(spec: PipelineSpec, session_cache: SessionCache | str | os.PathLike[str] | bool | None) -> Built:
    if spec.opset is None:
        return build(spec)
    from fastseq.runtime.cache import root_from

    cache = root_from(session_cache)
    if cache is None:
        return build(spec)
    from fastseq.runtime.cache_entry import ConvertedStages

    with ConvertedStages(cache) as store:
        return build(spec, store)


class Facade(Runnable):
    """The runtime API (:class:`~fastseq.runtime.runnable.Runnable`) plus the methods that
    reach the integrations (Ray Data), which the runtime layer does not import."""

    #: declared by the pipeline's description: each row's outputs depend on that row alone
    #: (its batcher, and fastseq serve, batch it without the core's analysis)
    row_independent: bool = False

    #: the stages as they were given, what verify() runs one by one (None once rebuilt from a
    #: pickle or a portable copy)
    _given: Any = None

    @property
    def stages_given(self) -> Any:
        """The stages as they were given to the core, before any conversion: what
        :meth:`verify` runs one by one (None for a pipeline rebuilt from a pickle)."""
        return self._given

    def map_batches(self, ds: Any, **ray_kwargs: Any) -> Any:
        """Runs this pipeline over a Ray Dataset as stateful actors (extra ``fastseq-onnx[ray]``;
        see :func:`fastseq.ray.map_batches`). Returns the new, lazy dataset."""
        from fastseq import ray as fastseq_ray

        return fastseq_ray.map_batches(self, ds, **ray_kwargs)

    def verify(self, *inputs: Any, rtol: float = 1e-4, atol: float = 1e-5, **named: Any) -> Parity:
        """The composed pipeline against its stages run one by one as they were given (before
        opset conversion, ONNX Runtime's optimisations or ``dynamic_batch``), on these inputs:
        each output's largest absolute and relative difference, within ``rtol``/``atol`` or
        not, and where they part, the first stage whose outputs differ (a
        :class:`fastseq.runtime.parity.Parity`; ``bool(parity)`` is whether all agree)."""
        from fastseq.runtime.parity import verify

        return verify(self, inputs, named, rtol, atol)
