"""One pipeline as the server serves it: its name and version, its inputs and outputs in
KServe datatypes, the metadata and configuration documents the protocol returns, and how a
request runs: through a batcher of the pipeline's (requests of many connections joined into
one run, by the batcher's rules) or, where the pipeline cannot be batched or batching is off,
each on its own through ``run_async``. Ready once a warm-up run has passed."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from fastseq.errors import CompositionError, InputError
from fastseq.runtime.batcher import Batcher
from fastseq.runtime.engine import Engine, Pipelined, engine_of
from fastseq.serving.datatypes import CONFIG_TYPES, DTYPES, datatype_of
from fastseq.serving.protocol import Tensor

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

    def __init__(self, name: str, pipe: Engine | Pipelined, *, max_batch_size: int = 32, max_delay_ms: float = 0.0,
                 row_independent: bool = False, on_batch: Callable[[int, list[float], float], None] | None = None,
                 run_with: Callable[[dict[str, np.ndarray]], Awaitable[list[np.ndarray]]] | None = None) -> None:
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise InputError(f"max_batch_size must be an int >= 1, got {max_batch_size!r}")
        self.name, self.version, self.pipe = name, VERSION, pipe
        self.engine = engine = engine_of(pipe)
        runner = engine.runner
        session = runner.session
        self.inputs = _tensors(session.get_inputs(), runner.inputs, "input")
        self.outputs = _tensors(session.get_outputs(), runner.outputs, "output")
        self.output_order = list(self.outputs)
        self.batcher: Batcher | None = None
        self._run_with = run_with  # another batching's (Ray Serve's), in place of the batcher
        if run_with is None and max_batch_size > 1:
            try:
                # Without spinning: the server's loop and its clients need the cores that ONNX
                # Runtime's idle pool threads would spin on (measured: 210-230 us of the server's
                # CPU a request against 320-380 us, at the same rows/s or more).
                self.batcher = Batcher(engine, max_batch_size, max_delay_ms, row_independent=row_independent,
                                       spinning=False, on_batch=on_batch)
            except CompositionError as e:
                # the whole reason, on one line: the node at fault and the flag that overrides it
                log.warning("model '%s' is served request by request: %s", name, " ".join(str(e).split()))
        self.max_batch_size = max_batch_size if self.batcher is not None or run_with is not None else 0
        # the one input of the common pipeline, passed by position: the batcher's short path
        self._single = next(iter(self.inputs)) if len(self.inputs) == 1 else None
        self.ready = False
        self.metadata = json.dumps({
            "name": name, "versions": [VERSION], "platform": "onnxruntime_onnx",
            "inputs": [t.as_json() for t in self.inputs.values()],
            "outputs": [t.as_json() for t in self.outputs.values()],
        }).encode()
        self.config = json.dumps(self._config()).encode()

    def _config(self) -> dict[str, Any]:
        """Triton's model configuration, as far as it describes this pipeline: with batching,
        ``max_batch_size`` and each tensor's dims without the batch axis."""
        batched = self.max_batch_size > 0

        def dims(t: Tensor) -> list[int]:
            shape = list(t.shape) if t.shape is not None else [-1]
            return shape[1:] if batched and shape else shape

        def entries(tensors: dict[str, Tensor]) -> list[dict[str, Any]]:
            return [{"name": t.name, "data_type": CONFIG_TYPES[t.datatype], "dims": dims(t)} for t in tensors.values()]

        config: dict[str, Any] = {"name": self.name, "platform": "onnxruntime_onnx", "backend": "fastseq",
                                  "max_batch_size": self.max_batch_size, "input": entries(self.inputs),
                                  "output": entries(self.outputs)}
        if self.batcher is not None:
            config["dynamic_batching"] = {"max_queue_delay_microseconds": int(self.batcher.max_delay_ms * 1000)}
        return config

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
        if self.batcher is not None:
            self.batcher.close()
