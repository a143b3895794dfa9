"""fastseq.ray on a real local Ray cluster: outputs against a plain loop, the model sent
once, an actor killed mid-job, the three batch formats, errors, the CLI over a folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import TESTS, scale_model, session

ray = pytest.importorskip("ray", reason="needs the ray extra: pip install 'fastseq-onnx[ray]'")

import fastseq  # noqa: E402
import fastseq.ray as fray  # noqa: E402

pytestmark = pytest.mark.timeout(240)  # a Ray scheduling deadlock would otherwise hang CI

ROWS = 10_000


def linear_model(weights: np.ndarray, inp: str = "x", out: str = "h") -> onnx.ModelProto:
    """h = x @ W + 1 over a dynamic batch axis."""
    k, n = weights.shape
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", [inp, "w"], ["t"]),
            helper.make_node("Add", ["t", "b"], [out]),
        ],
        "linear",
        [helper.make_tensor_value_info(inp, TensorProto.FLOAT, ["N", k])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["N", n])],
        [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(np.ones(n, np.float32), "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture(scope="module")
def cluster():
    """A real two-CPU local Ray cluster, shut down after the module. Workers import this
    test folder (for the killing Predictor below) through PYTHONPATH."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}},
    )
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def models():
    rng = np.random.default_rng(0)
    return linear_model(rng.standard_normal((16, 8)).astype(np.float32)), scale_model(3.0, inp="h", shape=("N", 8))


@pytest.fixture(scope="module")
def pipe(models):
    return fastseq.ONNXSequential(*models, io_maps=[[("h", "h")]])


@pytest.fixture(scope="module")
def data():
    return np.random.default_rng(1).standard_normal((ROWS, 16)).astype(np.float32)


def plain_loop(models, rows: np.ndarray) -> np.ndarray:
    """The reference: each row through each model's own session, one after the other."""
    first, second = session(models[0]), session(models[1])
    return np.concatenate([second.run(None, {"h": first.run(None, {"x": row[None]})[0]})[0] for row in rows])


def by_id(rows: list[dict], column: str) -> np.ndarray:
    ids = np.array([r["id"] for r in rows])
    assert len(ids) == ROWS and len(np.unique(ids)) == ROWS, "a row was lost or duplicated"
    return np.stack([r[column] for r in rows])[np.argsort(ids)]


class ModelSends:
    """Counts how often the driver serializes a value carrying the model's bytes: every
    ray.put, task argument and actor argument goes through SerializationContext.serialize,
    raw bytes as they are and anything else through its module's pickle.dumps."""

    def __init__(self, monkeypatch, model: bytes):
        import types

        from ray._private import serialization

        self.count = 0
        serialize, dumps = serialization.SerializationContext.serialize, serialization.pickle.dumps

        def counting_serialize(context, value):
            if isinstance(value, bytes) and model in value:
                self.count += 1
            return serialize(context, value)

        def counting_dumps(*args, **kwargs):
            out = dumps(*args, **kwargs)
            if model in out:
                self.count += 1
            return out

        pickle = types.SimpleNamespace(
            **{k: getattr(serialization.pickle, k) for k in dir(serialization.pickle) if not k.startswith("__")}
        )
        pickle.dumps = counting_dumps
        monkeypatch.setattr(serialization.SerializationContext, "serialize", counting_serialize)
        monkeypatch.setattr(serialization, "pickle", pickle)


def test_ten_thousand_rows_equal_a_plain_loop_and_the_model_is_sent_once(cluster, models, pipe, data, monkeypatch):
    ds = ray.data.from_items([{"id": i, "x": data[i]} for i in range(ROWS)], override_num_blocks=8)
    sends = ModelSends(monkeypatch, pipe.model_bytes)
    out = pipe.map_batches(ds, compute=ray.data.ActorPoolStrategy(size=2), batch_size=500, num_cpus=1)
    rows = out.take_all()
    assert sends.count == 1, f"the model left the driver {sends.count} times"
    assert set(rows[0]) == {"id", "x", "y"}  # the input column passes through, the output is added
    np.testing.assert_allclose(by_id(rows, "y"), plain_loop(models, data), rtol=1e-5, atol=1e-5)


def test_long_form_with_pandas_batches_sends_the_model_once(cluster, models, pipe, data, monkeypatch):
    import pandas as pd

    frame = pd.DataFrame({"id": np.arange(ROWS), "pixels": list(data)})
    # In-memory blocks: a read or repartition task would wait forever for a CPU that the two
    # actors hold (the cluster has two).
    ds = ray.data.from_pandas([frame[i : i + 2500] for i in range(0, ROWS, 2500)])
    sends = ModelSends(monkeypatch, pipe.model_bytes)
    out = ds.map_batches(
        fray.Predictor,
        fn_constructor_kwargs={"pipeline": pipe, "input_columns": {"x": "pixels"}, "output_columns": {"y": "score"}},
        compute=ray.data.ActorPoolStrategy(size=2),
        batch_size=1000,
        batch_format="pandas",
        num_cpus=1,
    )
    rows = out.take_all()
    assert sends.count == 1, f"the model left the driver {sends.count} times"
    assert set(rows[0]) == {"id", "pixels", "score"}
    np.testing.assert_allclose(by_id(rows, "score"), plain_loop(models, data), rtol=1e-5, atol=1e-5)


def test_pyarrow_batches_row_by_row_and_fixed_batch_pipelines(cluster):
    import pyarrow as pa

    x = np.arange(40, dtype=np.float32).reshape(10, 4)
    table = pa.table({"id": np.arange(10), "x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 4)})
    expected = np.maximum(x * 2, 0) * 3
    for shape in [(4,), (1, 4), (2, 4)]:  # no batch axis: row by row; a fixed batch of 1; of 2
        fixed = fastseq.ONNXSequential(scale_model(2.0, shape=shape, out="h"), scale_model(3.0, inp="h", shape=shape))
        out = fixed.map_batches(
            ray.data.from_arrow(table),
            compute=ray.data.ActorPoolStrategy(size=1),
            batch_size=10,
            batch_format="pyarrow",
            num_cpus=1,
            drop_columns=True,
            output_columns=["y"],
        )
        batch = out.take_batch(10, batch_format="numpy")
        assert set(batch) == {"y"}, shape
        np.testing.assert_allclose(batch["y"], expected, err_msg=str(shape))


class KillOnce(fray.Predictor):
    """A Predictor whose process is killed (SIGKILL) on the batch holding row 5000, once."""

    def __init__(self, marker: str, **kwargs):
        super().__init__(**kwargs)
        self.marker = marker

    def __call__(self, batch):
        if 5000 in batch["id"]:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                os.kill(os.getpid(), signal.SIGKILL)
        return super().__call__(batch)


def test_an_actor_killed_mid_job_is_restarted_and_no_row_is_lost_or_duplicated(cluster, models, pipe, data, tmp_path):
    ds = ray.data.from_items([{"id": i, "x": data[i]} for i in range(ROWS)], override_num_blocks=10)
    marker = tmp_path / "killed"
    out = ds.map_batches(
        KillOnce,
        fn_constructor_kwargs={"pipeline": fray.ship(pipe), "marker": str(marker)},
        compute=ray.data.ActorPoolStrategy(size=2),
        batch_size=500,
        num_cpus=1,
        max_restarts=2,
        max_task_retries=2,
    )
    rows = out.take_all()
    assert marker.exists(), "no actor was killed"
    np.testing.assert_allclose(by_id(rows, "y"), plain_loop(models, data), rtol=1e-5, atol=1e-5)


def test_errors_name_the_column_and_rows_and_are_raised_in_the_driver(cluster, pipe, data):
    ds = ray.data.from_items([{"id": i, "pixels": data[i]} for i in range(100)])
    with pytest.raises(
        fastseq.InputError,
        match=r"input 'x' reads the column 'x', which the dataset lacks.*"
        r"columns: id, pixels.*input_columns=\{'x': 'COLUMN'\}",
    ):
        pipe.map_batches(ds)
    with pytest.raises(fastseq.InputError, match=r"'pixel', which the dataset lacks \(did you mean 'pixels'\?\)"):
        pipe.map_batches(ds, input_columns={"x": "pixel"})
    with pytest.raises(fastseq.InputError, match=r"input_columns names 'X'.*did you mean 'x'"):
        pipe.map_batches(ds, input_columns={"X": "pixels"})
    with pytest.raises(fastseq.InputError, match=r"output 'y' would replace the column 'id'"):
        pipe.map_batches(ds, input_columns={"x": "pixels"}, output_columns={"y": "id"})
    with pytest.raises(fastseq.InputError, match=r"output_columns names 'why'"):
        pipe.map_batches(ds, input_columns={"x": "pixels"}, output_columns={"why": "y"})
    doubles = ray.data.from_items([{"x": row.astype(np.float64)} for row in data[:100]])
    with pytest.raises(fastseq.InputError, match=r"column 'x' \(all rows\) holds float64, input 'x' expects float32"):
        pipe.map_batches(doubles)
    narrow = ray.data.from_items([{"x": row[:15]} for row in data[:100]])
    with pytest.raises(
        fastseq.InputError, match=r"column 'x' \(all rows\) has rows of shape \[15\]; input 'x' expects \['N', 16\]"
    ):
        pipe.map_batches(narrow)

    # Rows of differing shapes are only seen batch by batch, in an actor: Ray Data raises in
    # the driver with the actor's message, which error_of() reads back.
    ragged = ray.data.from_items([{"x": data[i] if i != 7 else data[i, :9]} for i in range(20)])
    with pytest.raises(Exception) as failed:
        pipe.map_batches(ragged, compute=ray.data.ActorPoolStrategy(size=1), batch_size=20, num_cpus=1).take_all()
    message = fray.error_of(failed.value)
    assert message is not None and "column 'x' (row 7 of the batch) has shape [9] where row 0 has [16]" in message

    # With Ray Data's own switch on, the driver raises the actor's InputError itself.
    context = ray.data.DataContext.get_current()
    context.raise_original_map_exception = True
    try:
        ragged = ray.data.from_items([{"x": data[i] if i != 7 else data[i, :9]} for i in range(20)])  # takes a copy
    finally:
        context.raise_original_map_exception = False
    with pytest.raises(fastseq.InputError, match=r"column 'x' \(row 7 of the batch\) has shape \[9\]"):
        pipe.map_batches(ragged, compute=ray.data.ActorPoolStrategy(size=1), batch_size=20, num_cpus=1).take_all()


def _raise_in_a_task(kind: str) -> None:
    if kind == "core":
        fastseq.compose([b"garbage"])  # a LoadError raised by the Rust core
    try:
        raise ConnectionResetError(104, "Connection reset by peer")
    except OSError as e:
        raise fastseq.DownloadTimeoutError("http://h/m.onnx: the server went quiet") from e


def test_errors_raised_in_a_ray_task_keep_their_class_message_and_cause(cluster):
    task = ray.remote(_raise_in_a_task)
    with pytest.raises(fastseq.LoadError, match="not a valid ONNX model") as core:
        ray.get(task.remote("core"))
    assert type(core.value.cause) is fastseq.LoadError  # Ray's wrapper holds the original
    assert "fastseq.LoadError" in str(core.value)
    with pytest.raises(TimeoutError) as chained:  # a DownloadTimeoutError is a TimeoutError
        ray.get(task.remote("chained"))
    original = chained.value.cause
    assert type(original) is fastseq.DownloadTimeoutError and str(original) == "http://h/m.onnx: the server went quiet"
    assert type(original.__cause__) is ConnectionResetError and original.__cause__.errno == 104


def test_a_column_converts_where_no_value_changes_on_a_cluster(cluster, pipe, data):
    """The runtime's one input rule on Ray: an int16 column feeds a float32 input (the call
    converts it, as pipe(x) does; Ray used to refuse what pipe(x) took), an int32 one is
    refused in the driver, and an input declared without a shape takes rows of any shape."""
    ints = (data[:64] * 100).astype(np.int16)
    ds = ray.data.from_items([{"id": i, "x": ints[i]} for i in range(64)])
    rows = pipe.map_batches(ds, compute=ray.data.ActorPoolStrategy(size=1), batch_size=32, num_cpus=1).take_all()
    np.testing.assert_allclose(in_order(rows, "y"), pipe(ints)[0], rtol=1e-5, atol=1e-4)
    wide = ray.data.from_items([{"x": row.astype(np.int32)} for row in ints])
    with pytest.raises(fastseq.InputError, match=r"column 'x' \(all rows\) holds int32, input 'x' expects float32"):
        pipe.map_batches(wide)
    free = fastseq.ONNXSequential(
        helper.make_model(
            helper.make_graph(
                [helper.make_node("Relu", ["v"], ["r"])],
                "free",
                [helper.make_tensor_value_info("v", TensorProto.FLOAT, None)],
                [helper.make_tensor_value_info("r", TensorProto.FLOAT, None)],
            ),
            opset_imports=[helper.make_opsetid("", 17)],
            ir_version=8,
        )
    )
    cubes = data[:8].reshape(8, 4, 4)
    out = free.map_batches(
        ray.data.from_items([{"id": i, "v": cubes[i]} for i in range(8)]),
        compute=ray.data.ActorPoolStrategy(size=1),
        batch_size=4,
        num_cpus=1,
    ).take_all()
    np.testing.assert_array_equal(in_order(out, "r"), np.maximum(cubes, 0))


def in_order(rows: list[dict], column: str) -> np.ndarray:
    return np.stack([r[column] for r in sorted(rows, key=lambda r: r["id"])])


def test_predictor_outside_ray_checks_batches_like_an_actor(pipe, data):
    """The same class runs in-process: batch errors name the column and the rows."""
    predictor = fray.Predictor(pipe)
    out = predictor({"x": data[:5], "id": np.arange(5)})
    np.testing.assert_allclose(out["y"], pipe(data[:5])[0])
    with pytest.raises(fastseq.InputError, match=r"column 'x' \(rows 0-4 of the batch\) holds float64"):
        predictor({"x": data[:5].astype(np.float64)})
    with pytest.raises(
        fastseq.InputError, match=r"input 'x' reads the column 'x', which this batch \(rows 0-4\) lacks"
    ):
        predictor({"xs": data[:5]})
    with pytest.raises(fastseq.InputError, match=r"output 'y' would replace the column 'y'"):
        predictor({"x": data[:5], "y": data[:5]})


def test_session_options_travel_and_threads_are_sized_to_the_actor(cluster, models):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.add_session_config_entry("session.disable_prepacking", "1")
    configured = fastseq.ONNXSequential(*models, session_options=options)
    shipped = fray.ship(configured)

    @ray.remote(num_cpus=1)
    class Probe(fray.Predictor):
        def settings(self):
            o = self.session.get_session_options()
            return (
                o.intra_op_num_threads,
                o.inter_op_num_threads,
                int(o.graph_optimization_level),
                o.get_session_config_entry("session.disable_prepacking"),
                self.session.get_providers(),
            )

    probe = Probe.remote(pipeline=shipped)
    assert ray.get(probe.settings.remote(), timeout=120) == (1, 1, 0, "1", ["CPUExecutionProvider"])
    ray.kill(probe)


def test_providers_for_an_actor():
    assert fray.actor_providers(None, []) == ["CPUExecutionProvider"]
    assert fray.actor_providers(None, [3]) == [("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"]
    cuda = [
        ("CUDAExecutionProvider", {"device_id": 2, "arena_extend_strategy": "kSameAsRequested"}),
        "CPUExecutionProvider",
    ]
    assert fray.actor_providers(cuda, [5]) == [
        ("CUDAExecutionProvider", {"device_id": 0, "arena_extend_strategy": "kSameAsRequested"}),
        "CPUExecutionProvider",
    ]
    assert fray.actor_providers(cuda, []) == ["CPUExecutionProvider"]


def test_import_fastseq_does_not_import_ray():
    code = "import sys, fastseq; assert 'ray' not in sys.modules and 'fastseq.ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_cli_runs_a_folder_of_npy_files_and_a_parquet_dataset_on_a_cluster(cluster, tmp_path):
    import pyarrow.parquet as pq

    onnx.save(scale_model(2.0, shape=("N", 4)), tmp_path / "m.onnx")
    folder = tmp_path / "data"
    folder.mkdir()
    x = np.arange(24, dtype=np.float32).reshape(6, 4) - 10
    for i in range(3):
        np.save(folder / f"part{i}.npy", x[2 * i : 2 * i + 2])
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    command = [sys.executable, "-m", "fastseq", "run", "m.onnx", "--input", "data", "--output", "out", "--ray", cluster]
    r = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr
    assert "wrote 6 rows to out" in r.stdout
    table = pq.read_table(tmp_path / "out")
    got = np.stack(table.column("y").to_numpy(zero_copy_only=False))
    assert sorted(map(tuple, got)) == sorted(map(tuple, np.maximum(2 * x, 0)))

    # A Parquet dataset whose column has another name than the input: a one-line error.
    import pyarrow as pa

    pixels = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 4)
    pq.write_table(pa.table({"pixels": pixels}), tmp_path / "p.parquet")
    r = subprocess.run(
        [*command[:6], "p.parquet", "--output", "out_p", *command[9:]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert r.returncode == 1
    assert "fastseq: error:" in r.stderr and "input 'x' reads the column 'x'" in r.stderr


def test_predictor_takes_empty_batches_and_selected_outputs(pipe):
    for shape in [("N", 4), (2, 4), (4,)]:
        fixed = fastseq.ONNXSequential(scale_model(2.0, shape=shape))
        out = fray.Predictor(fixed)({"x": np.zeros((0, 4), np.float32)})
        assert out["y"].shape == (0, 4) and out["y"].dtype == np.float32, shape
    keep = fastseq.ONNXSequential(scale_model(2.0, out="h"), scale_model(3.0, inp="h"), keep_outputs=["h", "y"])
    x = np.ones((2, 4), np.float32)
    assert set(fray.Predictor(keep, output_columns=["h"], drop_columns=True)({"x": x})) == {"h"}
    np.testing.assert_allclose(fray.Predictor(keep, output_columns={"y": "z"})({"x": x})["z"], 6.0)


def test_session_options_description_round_trips():
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    options.inter_op_num_threads = 3
    options.intra_op_num_threads = 5
    options.enable_mem_pattern = False
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    described = fray.describe_options(options)
    import pickle

    rebuilt = fray.build_options(pickle.loads(pickle.dumps(described)), cpus=2)
    assert rebuilt.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert (rebuilt.inter_op_num_threads, rebuilt.intra_op_num_threads) == (3, 5)  # set by the user: kept
    assert rebuilt.enable_mem_pattern is False
    assert rebuilt.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    default = fray.build_options(fray.describe_options(None), cpus=2.5)
    assert (default.intra_op_num_threads, default.inter_op_num_threads) == (2, 1)
    assert default.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED


def test_a_model_on_shared_storage_ships_as_its_path(tmp_path, pipe, data):
    target = pipe.export(tmp_path / "pipe.onnx", external_data=True)  # weights in a file beside it
    shipped = fray.ship(str(target))
    assert shipped.model == str(target.resolve()) and shipped.inputs is None
    out = fray.Predictor(shipped)({"x": data[:3]})
    np.testing.assert_allclose(out["y"], pipe(data[:3])[0])
    with pytest.raises(fastseq.InputError, match="no such model file"):
        fray.ship(tmp_path / "missing.onnx")


def test_a_graph_pipeline_runs_in_a_predictor_too(models, data):
    """fastseq.Pipeline shares the runtime API: the same payload, the same Predictor."""
    graph = fastseq.Pipeline({"lin": models[0], "act": models[1]}, edges=["lin.h -> act.h"])
    assert hasattr(graph, "map_batches")
    out = fray.Predictor(graph, output_columns={"y": "score"})({"x": data[:7], "id": np.arange(7)})
    np.testing.assert_allclose(out["score"], plain_loop(models, data[:7]), rtol=1e-5, atol=1e-5)


def test_a_local_cluster_gets_an_object_store_that_fits_the_machine(monkeypatch, tmp_path):
    """fastseq run --ray without ADDRESS: a quarter of the memory available, between 256 MB
    and 2 GB (Ray's default, 30% of all memory, ignores what the machine's other processes
    use); with ADDRESS the cluster's own store is used as it is."""
    with open("/proc/meminfo") as f:
        available = int(next(line for line in f if line.startswith("MemAvailable")).split()[1]) * 1024
    from fastseq.ray import local_object_store

    size = local_object_store()
    assert 256 << 20 <= size <= 2 << 30
    assert abs(size - min(max(available // 4, 256 << 20), 2 << 30)) < 256 << 20  # memory moves between reads
    calls = []

    def init(**kwargs):
        calls.append(kwargs)
        raise RuntimeError("no cluster in this test")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    pipe = fastseq.ONNXSequential(scale_model(2.0))
    (tmp_path / "data").mkdir()
    for address in (None, "ray://head:10001"):
        with pytest.raises(RuntimeError, match="no cluster"):
            fray.run_dataset(pipe, tmp_path / "data", tmp_path / "out", address)
    local, remote = calls
    assert set(local) == {"object_store_memory", "log_to_driver"} and 256 << 20 <= local["object_store_memory"]
    assert remote == {"address": "ray://head:10001", "log_to_driver": False}


def test_a_failure_in_an_actor_names_the_stage(cluster):
    """The Predictor runs the pipeline's own runtime: a node failing in the second stage is a
    RunError naming that stage (no node names clash, so the core renamed nothing), in-process
    and, through error_of(), from an actor."""
    shape = numpy_helper.from_array(np.array([3, 3], np.int64), "square_shape")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["h", "square_shape"], ["y"], name="square")],
        "square",
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [shape],
    )
    square = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    pipe = fastseq.Pipeline(
        {"scale": scale_model(2.0, out="h", shape=("N", 4)), "square": square}, edges=["scale.h -> square.h"]
    )
    x = np.ones((2, 4), np.float32)
    with pytest.raises(fastseq.RunError, match=r"^stage square: .*Name:'square \(in square\)'"):
        fray.Predictor(pipe)({"x": x})
    ds = ray.data.from_items([{"x": row} for row in np.ones((4, 4), np.float32)])
    with pytest.raises(Exception) as failed:
        pipe.map_batches(ds, compute=ray.data.ActorPoolStrategy(size=1), batch_size=2, num_cpus=1).take_all()
    message = fray.error_of(failed.value)
    assert message is not None and message.startswith("stage square: ") and "square (in square)" in message
