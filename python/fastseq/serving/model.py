"""One pipeline as the server serves it: its name and version, its inputs and outputs in
KServe datatypes, the metadata and configuration documents the protocol returns, and how a
request runs: through a batcher of the pipeline's (requests of many connections joined into
one run, by the batcher's rules) or, where the pipeline cannot be batched or batching is off,
each on its own through ``run_async``. Ready once a warm-up run has passed."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from fastseq import _core
from fastseq._core import MAX_BATCH_SIZE
from fastseq.errors import CompositionError, InputError
from fastseq.runtime.batcher import Batcher, batchable
from fastseq.runtime.engine import Engine, Pipelined, engine_of
from fastseq.serving.datatypes import DTYPES, datatype_of
from fastseq.serving.protocol import Tensor, served_spec

log = logging.getLogger("fastseq.serve")

#: the version every pipeline is served as (one pipeline per name)
VERSION = "1"


def _tensors(args: list[Any], infos: list[Any], kind: str) -> dict[str, Tensor]:
    """The session's inputs or outputs as the protocol describes them (-1: a dynamic axis)."""
    found = {}
    for arg, info in zip(args, infos):
        datatype = datatype_of(info, arg.type, kind)
        shape = None if info.shape is None else tuple(d if isinstance(d, int) and d >= 0 else -1 for d in info.shape)
        found[arg.name] = Tensor(arg.name, datatype, shape)
    return found


class ServedModel:
    """A pipeline served under ``name``: ``infer(feeds)`` returns every output, in order.

    ``max_batch_size`` > 1 joins concurrent requests through ``pipe.batcher`` (with
    ``max_delay_ms``, and ``row_independent`` as the batcher takes it); a pipeline the batcher
    refuses (its rows may mix, or no shared batch axis) is served request by request, which
    the log says once. ``on_batch`` is the batcher's observer (the server's metrics);
    ``run_with``, a coroutine function of the feeds, batches in the batcher's place (Ray
    Serve's ``@serve.batch``)."""

    def __init__(
        self,
        name: str,
        pipe: Engine | Pipelined,
        *,
        max_batch_size: int = 32,
        max_delay_ms: float = 0.0,
        row_independent: bool = False,
        on_batch: Callable[[int, list[float], float], None] | None = None,
        run_with: Callable[[dict[str, np.ndarray]], Awaitable[list[np.ndarray]]] | None = None,
    ) -> None:
        if (
            isinstance(max_batch_size, bool)
            or not isinstance(max_batch_size, int)
            or not 1 <= max_batch_size <= MAX_BATCH_SIZE
        ):
            raise InputError(f"max_batch_size must be an int from 1 to {MAX_BATCH_SIZE}, got {max_batch_size!r}")
        self.name, self.version, self.pipe = name, VERSION, pipe
        self.engine = engine = engine_of(pipe)
        runner = engine.runner
        session = runner.session
        self.inputs = _tensors(session.get_inputs(), runner.inputs, "input")
        self.outputs = _tensors(session.get_outputs(), runner.outputs, "output")
        self.output_order = list(self.outputs)
        self.output_index = {n: k for k, n in enumerate(self.output_order)}
        self._run_with = run_with  # another batching's (Ray Serve's), in place of the batcher
        self._batcher: Any = None
        # declared by the caller (--row-independent) or by the pipeline's description (its file's row_independent)
        row_independent = row_independent or getattr(pipe, "row_independent", False) is True
        self._row_independent, self._on_batch = row_independent, on_batch
        self.batched = False
        if run_with is None and max_batch_size > 1:
            try:
                batchable(engine, row_independent)
                self.batched = True
            except CompositionError as e:
                # the whole reason, on one line: the node at fault and the flag that overrides it
                log.warning("model '%s' is served request by request: %s", name, " ".join(str(e).split()))
        self.max_delay_ms = float(max_delay_ms)
        self.max_batch_size = max_batch_size if self.batched or run_with is not None else 0
        # the one input of the common pipeline, passed by position: the batcher's short path
        self._single = next(iter(self.inputs)) if len(self.inputs) == 1 else None
        self.ready = False
        # The core's description: requests are decoded and answers encoded against it, the
        # server in the core batches by it, and the metadata and configuration documents are its.
        self.spec = served_spec(
            name,
            VERSION,
            tuple(self.inputs.values()),
            tuple(self.outputs.values()),
            self.max_batch_size,
            int(self.max_delay_ms * 1000),
        )
        self.metadata, self.config = _core.served_documents(self.spec)

    @property
    def batcher(self) -> Any:
        """The pipeline's batcher, made when first asked for (the ASGI app's path; the server
        in the core batches by itself); None where the model is not batched."""
        if self.batched and self._batcher is None:
            self._batcher = Batcher(
                self.engine,
                self.max_batch_size,
                self.max_delay_ms,
                row_independent=self._row_independent,
                spinning=False,
                on_batch=self._on_batch,
            )
        return self._batcher

    def batch_run(self) -> Any:
        """What the core's server calls once a batch: the pipeline's runner (the batchers' own
        session of it, without spinning, where batched on the CPU)."""
        from fastseq.serving.runs import BatchRun

        runner = self.engine.batch_runner() if self.batched else self.engine.runner
        return BatchRun(runner, list(self.inputs.values()), list(self.outputs.values()))

    async def infer(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Every output for ``feeds`` (checked by the pipeline's one input rule)."""
        if self._run_with is not None:
            return await self._run_with(feeds)
        batcher = self.batcher
        if batcher is not None:
            single = self._single
            if single is not None and single in feeds and len(feeds) == 1:
                return await batcher.run_async(feeds[single])
            return await batcher.run_async(**feeds)
        runner = self.engine.runner  # feeds by name through the runner: an input may be named "timeout"
        return await runner.run_async(runner.check_feeds(feeds), runner.output_names(None))

    def warm_up_feeds(self) -> dict[str, np.ndarray]:
        """One row of zeros (empty strings) per input: each dynamic axis 1, fixed ones as declared."""
        feeds = {}
        for t in self.inputs.values():
            shape = tuple(d if d >= 0 else 1 for d in t.shape) if t.shape is not None else (1,)
            dtype = DTYPES[t.datatype]
            feeds[t.name] = np.full(shape, "", dtype=object) if t.datatype == "BYTES" else np.zeros(shape, dtype)
        return feeds

    async def warm_up(self) -> None:
        """Runs the model once on :meth:`warm_up_feeds`, its own path, and marks it ready."""
        await self.infer(self.warm_up_feeds())
        self.ready = True

    def close(self) -> None:
        """Refuses new requests; those taken by the batcher run and are answered first."""
        self.ready = False
        if self._batcher is not None:
            self._batcher.close()
