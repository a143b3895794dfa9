"""What the public classes add to the runner: the integrations that sit above it."""

from __future__ import annotations

from typing import Any

from fastseq.runtime.runnable import Runnable


class Facade(Runnable):
    """The runtime API (:class:`~fastseq.runtime.runnable.Runnable`) plus the methods that
    reach the integrations (Ray Data), which the runtime layer does not import."""

    def map_batches(self, ds: Any, **ray_kwargs: Any) -> Any:
        """Runs this pipeline over a Ray Dataset as stateful actors (extra ``fastseq[ray]``;
        see :func:`fastseq.ray.map_batches`). Returns the new, lazy dataset."""
        from fastseq.integrations import ray as fastseq_ray

        return fastseq_ray.map_batches(self, ds, **ray_kwargs)
