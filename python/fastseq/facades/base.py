"""What the public classes add to the runner: the integrations that sit above it."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from fastseq.graph.build import Built, build
from fastseq.runtime.runnable import Runnable

if TYPE_CHECKING:
    from fastseq.graph.spec import PipelineSpec
    from fastseq.runtime.cache import SessionCache


def build_cached(spec: PipelineSpec, session_cache: SessionCache | str | os.PathLike[str] | bool | None) -> Built:
    """:func:`~fastseq.graph.build.build` for an entry point with a session cache: stages
    converted to other opsets are kept in it, so that a later start neither converts them
    again nor imports onnx (the session itself comes from the cache as always)."""
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

    def map_batches(self, ds: Any, **ray_kwargs: Any) -> Any:
        """Runs this pipeline over a Ray Dataset as stateful actors (extra ``fastseq-onnx[ray]``;
        see :func:`fastseq.ray.map_batches`). Returns the new, lazy dataset."""
        from fastseq import ray as fastseq_ray

        return fastseq_ray.map_batches(self, ds, **ray_kwargs)
