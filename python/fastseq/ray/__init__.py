"""A composed pipeline as stateful Ray Data actors (extra: ``fastseq-onnx[ray]``).

``pipe.map_batches(ds, compute=ray.data.ActorPoolStrategy(size=4), batch_size=256)`` or
``ds.map_batches(fastseq.ray.Predictor, fn_constructor_kwargs={"pipeline": pipe}, ...)``.

What travels where: the driver serializes the composed model once and puts it in the object
store once (:func:`ship`); each actor fetches it once (from its node's object store) and
builds one ONNX Runtime session in ``__init__``, with intra-op threads sized to the CPUs Ray
gave the actor and the CUDA provider when Ray gave it a GPU. Per batch, only the batch's
columns move. An ``InferenceSession`` cannot be pickled, so none ever is.

The code is here and in :mod:`.columns` (a dataset's columns as the pipeline's inputs).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

try:
    import ray
except ModuleNotFoundError as e:  # the extra is not installed: a typed error that names it
    from fastseq.errors import missing_extra

    raise missing_extra("fastseq.ray", "ray", e) from e

from fastseq import _core
from fastseq.errors import InputError
from fastseq.graph.session_settings import session_options, session_options_dict
from fastseq.ray.columns import as_columns, batch_len, check_schema, map_hint, routes, run_rows, stack
from fastseq.runtime.engine import Engine, Pipelined, engine_of
from fastseq.runtime.ort_options import default_options
from fastseq.runtime.providers import provider_name
from fastseq.runtime.runnable import Runnable

_GPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider")


@dataclass(frozen=True)
class Shipment:
    """What an actor needs to build its session: the model (an object-store reference to
    its serialized bytes, or a path on storage every node can read), the providers, a
    picklable description of the session options, the model's inputs and outputs when
    known in the driver, and its stages (``labels`` and the core's ``origins``, so that an
    error in an actor names the stage). Small: pickling it never copies the model."""

    model: Any
    providers: list[Any] | None = None
    options: dict[str, Any] = field(default_factory=dict)
    inputs: tuple[Any, ...] | None = None
    outputs: tuple[Any, ...] | None = None
    label: str = "pipeline"
    labels: tuple[str, ...] = ()
    origins: Any = None


def _shipment(pipe: Engine | Pipelined, put: Any) -> Shipment:
    """A pipeline's shipment, its model bytes passed through ``put`` (``ray.put`` in the
    driver): everything fastseq.ray reads from a pipeline, through its engine's
    :meth:`~fastseq.runtime.engine.Engine.portable`."""
    engine = engine_of(pipe)
    portable = engine.portable()
    labels = tuple(portable["labels"])
    return Shipment(
        put(portable["model"]),
        list(portable["providers"]) if portable["providers"] else None,
        portable["session_options"],
        tuple(engine.inputs),
        tuple(engine.outputs),
        label=" -> ".join(labels) if labels else type(pipe).__name__,
        labels=labels,
        origins=portable["origins"],
    )


def describe_options(options: Any) -> dict[str, Any]:
    """An ``ort.SessionOptions`` as a plain, picklable dict (None: an empty dict, the
    defaults): :func:`fastseq.graph.session_settings.session_options_dict`, the one description of them."""
    return session_options_dict(options)


def build_options(described: Mapping[str, Any], cpus: float | None) -> Any:
    """An ``ort.SessionOptions`` from :func:`describe_options`' dict, its intra-op threads
    sized to ``cpus`` (the actor's share) unless the pipeline set them: every actor taking
    every core would oversubscribe the node."""
    options = session_options(dict(described)) if described else default_options()
    if not described.get("intra_op_num_threads") and cpus:
        options.intra_op_num_threads = max(1, int(cpus))
    if not described.get("inter_op_num_threads"):
        options.inter_op_num_threads = 1
    return options


def actor_providers(requested: Sequence[Any] | None, gpu_ids: Sequence[Any]) -> list[Any]:
    """The providers for an actor: the CUDA provider first when Ray gave it a GPU (device 0:
    Ray narrows CUDA_VISIBLE_DEVICES to the actor's GPUs); GPU providers dropped when it has
    none, since they would take a device Ray did not grant."""
    wanted = list(requested) if requested else ["CPUExecutionProvider"]
    if gpu_ids:
        on_gpu = [
            (name, {**opts, "device_id": 0}) if name in _GPU_PROVIDERS else p
            for p in wanted
            for name, opts in [(p, {}) if isinstance(p, str) else p]
        ]
        if not any(provider_name(p) in _GPU_PROVIDERS for p in on_gpu):
            on_gpu.insert(0, ("CUDAExecutionProvider", {"device_id": 0}))
        return on_gpu
    kept = [p for p in wanted if provider_name(p) not in _GPU_PROVIDERS]
    return kept or ["CPUExecutionProvider"]


def ship(pipeline: Any) -> Shipment:
    """Puts a pipeline's model in the object store once and returns the small handle that
    actors build their sessions from. A path (str or PathLike) is shipped as the path, for a
    model on storage every node reads (needed above 2 GB, with its external data beside
    it). A :class:`Shipment` is returned as it is."""
    if isinstance(pipeline, Shipment):
        return pipeline
    if isinstance(pipeline, (str, os.PathLike)):
        path = Path(pipeline).expanduser().resolve()
        if not path.is_file():
            raise InputError(f"{path}: no such model file")
        return Shipment(str(path), label=path.name)
    return _shipment(pipeline, ray.put)


class Predictor:
    """A Ray Data callable class that runs a pipeline over batches.

    ``ds.map_batches(Predictor, fn_constructor_kwargs={"pipeline": pipe}, ...)``, where
    ``pipeline`` is a :class:`Shipment` from :func:`ship` (the model already in the object
    store), the path of an exported model on shared storage, or an ``ONNXSequential``. The
    last arrives in the actor unpickled, which builds its own session first (with its
    session options, which pickling keeps): ``ship(pipe)`` or ``pipe.map_batches`` send
    only the model.

    Columns feed the inputs of the same name; ``input_columns={"x": "pixels"}`` feeds the
    input ``x`` from the column ``pixels``. Outputs become new columns of their own names
    (``output_columns={"probs": "scores"}`` renames; a list keeps only those outputs). The
    other columns pass through, or are dropped with ``drop_columns=True``. Numpy, pandas
    and pyarrow batches are accepted; the result is a dict of numpy columns.

    A column of per-row arrays is stacked on the pipeline's batch axis; a pipeline with a
    fixed batch of N is called N rows at a time, and one without a batch axis row by row.
    A column missing, or of a dtype or row shape the pipeline refuses, is an ``InputError``
    naming the column, the input and the rows. The actor runs the pipeline's own runtime
    (:meth:`~fastseq.runtime.runnable.Runnable.from_portable`): its calls are checked as
    the pipeline's are, and a failure in a stage is a ``RunError`` naming the stage.
    """

    def __init__(
        self,
        pipeline: Any,
        input_columns: Mapping[str, str] | None = None,
        output_columns: Mapping[str, str] | Sequence[str] | None = None,
        drop_columns: bool = False,
    ) -> None:
        shipped = _local_shipment(pipeline)
        self.pipe = unship(shipped)
        self.session = self.pipe.get_session()
        self.label = shipped.label
        self.inputs = self.pipe.inputs
        self.outputs = self.pipe.outputs
        self.columns, self.renamed = routes(self.inputs, self.outputs, input_columns, output_columns)
        self.drop_columns = drop_columns

    def __call__(self, batch: Any) -> dict[str, np.ndarray]:
        """Runs the pipeline over one batch; returns its columns plus the outputs."""
        columns = as_columns(batch)
        rows = batch_len(columns)
        feeds = {}
        for info in self.inputs:
            column = self.columns[info.name]
            if column not in columns:
                raise InputError(
                    f"{self.label}: input '{info.name}' reads the column '{column}', which this batch "
                    f"(rows 0-{rows - 1}) lacks{_core.did_you_mean(column, list(columns))}; columns: "
                    f"{', '.join(columns)}" + map_hint(info.name)
                )
            feeds[info.name] = stack(columns[column], column, info, self.label)
        wanted = [o for o in self.outputs if o.name in self.renamed]  # only these are computed
        results = run_rows(self.pipe, feeds, self.inputs, rows, wanted, self.label)
        out = {} if self.drop_columns else dict(columns)
        for info, value in zip(wanted, results):
            name = self.renamed[info.name]
            if name in out:
                raise InputError(
                    f"{self.label}: output '{info.name}' would replace the column '{name}'; "
                    f"name it with output_columns={{'{info.name}': 'NEW'}} or pass drop_columns=True"
                )
            out[name] = value
        return out


def unship(shipped: Shipment, options: Mapping[str, Any] | None = None) -> Runnable:
    """The pipeline of a shipment, started in this actor: the model fetched once from the
    node's object store, the session sized to the CPUs (and on the GPU) Ray gave the actor;
    ``options``: session config entries (``session.*``) to set where the pipeline's own do not."""
    model = ray.get(shipped.model) if isinstance(shipped.model, ray.ObjectRef) else shipped.model
    resources = _assigned_resources()
    session = build_options(shipped.options, resources["cpus"])
    for key, value in (options or {}).items():  # config entries the pipeline's options leave unset
        if key not in shipped.options:
            session.add_session_config_entry(key, value)
    # The core decodes the bytes (or reads the path and its external data) and the
    # runtime starts the session the way every fastseq pipeline does (weights spilled to
    # the session's private copy when large, so that they do not count twice).
    return Runnable.from_portable(
        {
            "model": model,
            "labels": shipped.labels or [shipped.label],
            "origins": shipped.origins,
            "providers": actor_providers(shipped.providers, resources["gpu_ids"]),
            "session_options": session,
            "session_cache": None,  # the driver's cache folder need not exist on this node
        }
    )


def _local_shipment(pipeline: Any) -> Shipment:
    # In an actor a Shipment arrives as itself; an ONNXSequential arrives unpickled (Ray Data
    # puts the constructor arguments in the object store once), so read it without a put.
    if isinstance(pipeline, (Shipment, str, os.PathLike)):
        return ship(pipeline)
    return _shipment(pipeline, lambda model: model)


def _assigned_resources() -> dict[str, Any]:
    """The CPUs and GPUs Ray gave this actor; none outside Ray or in the driver (then ONNX
    Runtime's own defaults apply)."""
    if not ray.is_initialized():
        return {"cpus": None, "gpu_ids": []}
    try:
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")  # type: ignore[no-untyped-call]
    except AssertionError:  # Ray's answer in the driver, which is assigned nothing
        return {"cpus": None, "gpu_ids": []}
    return {"cpus": cpus, "gpu_ids": ray.get_gpu_ids()}


def map_batches(
    pipeline: Any,
    ds: Any,
    *,
    input_columns: Mapping[str, str] | None = None,
    output_columns: Mapping[str, str] | Sequence[str] | None = None,
    drop_columns: bool = False,
    **ray_kwargs: Any,
) -> Any:
    """``ds.map_batches`` with a :class:`Predictor` over ``pipeline``: the model is put in
    the object store once, the dataset's schema is checked here in the driver, and
    ``ray_kwargs`` (``compute``/``concurrency``, ``batch_size``, ``num_cpus``, ``num_gpus``,
    ``batch_format``, ...) go to Ray Data as they are. Returns the new (lazy) dataset.
    Reading the schema may run the dataset's upstream steps on its first block."""
    shipped = ship(pipeline)
    check_schema(ds, shipped, input_columns, output_columns, drop_columns)
    return ds.map_batches(
        Predictor,
        fn_constructor_kwargs={
            "pipeline": shipped,
            "input_columns": input_columns,
            "output_columns": output_columns,
            "drop_columns": drop_columns,
        },
        **ray_kwargs,
    )


def error_of(exc: BaseException) -> str | None:
    """The fastseq message inside an exception that Ray Data raised for a failed batch
    (Ray wraps an actor's error in its own class and keeps the original only as text,
    unless ``DataContext.raise_original_map_exception`` is set)."""
    for line in reversed(str(exc).splitlines()):
        for name in ("InputError", "RunError", "FastseqError", "LoadError"):
            mark = f"{name}: "
            if mark in line and ("fastseq" in line or line.lstrip().startswith(mark)):
                return line.split(mark, 1)[1].strip()
    return None


def local_object_store() -> int:
    """The object store of a local cluster, in bytes: a quarter of the memory available
    (all of it where /proc/meminfo cannot be read), between 256 MB and 2 GB. Ray's default,
    30% of all memory, counts memory that other processes of a shared machine use."""
    available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        available = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        pass
    return min(max(available // 4, 256 << 20), 2 << 30)


def run_dataset(
    pipe: Engine | Pipelined,
    source: str | os.PathLike[str],
    output: str | os.PathLike[str],
    address: str | None = None,
    concurrency: int | None = None,
    batch_size: int = 256,
) -> int:
    """``fastseq run MODEL --input SOURCE --output OUTPUT --ray [ADDRESS]``: runs a built
    pipeline over a folder of ``.npy`` files (each holding rows on axis 0, for a one-input
    pipeline) or a Parquet dataset (a column per input), on the cluster at ``address`` or a
    local one, and writes the outputs (plus the columns that fed no input) as Parquet.
    Returns the rows written."""
    import ray.data

    engine = engine_of(pipe)
    # Absolute: tasks on a running cluster do not share this process's working directory.
    src = Path(source).expanduser().resolve()
    shown, output = output, Path(output).expanduser().resolve()
    if not src.exists():
        raise InputError(f"{src}: no such folder or Parquet dataset")
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(object_store_memory=local_object_store(), log_to_driver=False)
    input_columns = None
    if src.is_dir() and any(src.glob("*.npy")):
        if len(engine.inputs) != 1:
            raise InputError(
                f"the pipeline has {len(engine.inputs)} inputs; a folder of .npy files feeds one (use a Parquet "
                "dataset with a column per input)"
            )
        ds = ray.data.read_numpy(str(src), include_paths=True)
        input_columns = {engine.inputs[0].name: "data"}  # read_numpy's column
    else:
        ds = ray.data.read_parquet(str(src))
    if concurrency is None:
        # Leave a CPU to the read and write tasks: actors holding every CPU starve them and
        # Ray Data then waits forever.
        concurrency = max(1, int(ray.cluster_resources().get("CPU", 1)) - 1)  # type: ignore[no-untyped-call]
    fed = [(input_columns or {}).get(i.name, i.name) for i in engine.inputs]
    try:
        out = map_batches(
            engine,
            ds,
            input_columns=input_columns,
            compute=ray.data.ActorPoolStrategy(size=concurrency),
            batch_size=batch_size,
            num_cpus=1,
        ).drop_columns(fed)
        out.write_parquet(str(output))
    except InputError:
        raise
    except Exception as e:  # a batch failed in an actor: Ray's wrapper, the message inside
        message = error_of(e)
        if message is None:
            raise
        raise InputError(message) from None
    rows = ray.data.read_parquet(str(output)).count()
    print(f"wrote {rows} rows to {shown}")
    return rows
