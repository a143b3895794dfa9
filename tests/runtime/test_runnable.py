"""The API pipelines share (fastseq.runtime.runnable), on ONNXSequential and Pipeline:
sessions without a second copy of the weights, calls on precomputed checks, RunOptions,
optimised exports, errors in stage names, pickling, spilling the pipeline's own memory. IO
binding is test_binding.py's, the session cache test_cache.py's."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import fastseq
from conftest import scale_model, tmpfs
from runtime.models import X, chain, reference, slow_input, slow_model


# --- sessions -------------------------------------------------------------------------------
def test_session_does_not_depend_on_the_sources_once_made(tmp_path):
    paths = chain(tmp_path)
    pipe = fastseq.ONNXSequential(*paths)
    for p in paths:  # rewritten in place, as onnx.save does
        onnx.save(scale_model(100.0, shape=("N", 4)), p)
    np.testing.assert_allclose(pipe(X)[0], reference(X))
    for p in paths:
        open(p, "wb").close()  # truncated: a session mapping the sources would die (SIGBUS)
    np.testing.assert_allclose(pipe(X)[0], reference(X))


def test_no_private_files_are_left_behind(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    pipe = fastseq.ONNXSequential(
        scale_model(2.0, shape=("N", 512)), scale_model(3.0, shape=("N", 512)), session_cache=False
    )
    pipe.as_cpu()
    pipe.export(tmp_path / "opt.onnx", optimized=True)
    assert not os.listdir(tmp_path / "tmp")


def test_session_above_the_protobuf_limit(tmp_path):
    """A real 2.1 GB weight (external data, written directly): the session path is the same."""
    rows = (2 << 30) // 4096 + 1024  # 2 GiB + 4 MiB of float32 rows of 1024
    data = tmp_path / "table.bin"
    with open(data, "wb") as f:
        f.truncate(rows * 4096)  # sparse: zeros cost no disk
        f.seek(5 * 4096)
        f.write(np.arange(1024, dtype=np.float32).tobytes())
    table = TensorProto(name="table", data_type=TensorProto.FLOAT, dims=[rows, 1024])
    table.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "table.bin"), ("offset", "0"), ("length", str(rows * 4096))):
        e = table.external_data.add()
        e.key, e.value = k, v
    g = helper.make_graph(
        [helper.make_node("Gather", ["table", "i"], ["y"])],
        "gather",
        [helper.make_tensor_value_info("i", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 1024])],
        [table],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(tmp_path / "g.onnx"))
    pipe = fastseq.ONNXSequential(str(tmp_path / "g.onnx"))
    assert pipe.summary()["weight_bytes"] > 2 << 30
    y = pipe(np.array([5, 0], np.int64))[0]
    np.testing.assert_array_equal(y[0], np.arange(1024, dtype=np.float32))
    assert not y[1].any()


# --- calls ------------------------------------------------------------------------------------
def test_fast_path_and_checked_path_agree_and_checks_still_fire(tmp_path):
    pipe = fastseq.ONNXSequential(*chain(tmp_path))
    np.testing.assert_allclose(pipe(X)[0], reference(X))
    np.testing.assert_allclose(pipe(X.tolist())[0], reference(X))  # lists take the slow path
    np.testing.assert_allclose(pipe(x=X)[0], reference(X))
    with pytest.raises(fastseq.InputError, match="expects float32, got float64"):
        pipe(X.astype(np.float64))
    with pytest.raises(fastseq.InputError, match="expects size 4 on axis 1"):
        pipe(np.ones((2, 5), np.float32))
    with pytest.raises(fastseq.InputError, match="expects rank 2"):
        pipe(np.ones(4, np.float32))


def test_inputs_convert_where_no_value_changes():
    """An exact conversion is made (float16 or int32 to float32: numpy's safe casts); one
    that changes values is refused with the call that does it; lists take the input's dtype
    unless a value would change."""
    pipe = fastseq.ONNXSequential(scale_model(2.0, shape=("N", 4)))
    for x in (X.astype(np.float16), (X * 8).astype(np.int16), X > 0):
        np.testing.assert_array_equal(pipe(x)[0], np.maximum(2 * x.astype(np.float32), 0))
    with pytest.raises(fastseq.InputError, match=r"expects float32, got float64, .*: x.astype\(np.float32\)$"):
        pipe(X.astype(np.float64))
    with pytest.raises(fastseq.InputError, match=r"expects float32, got int64"):
        pipe(np.ones((2, 4), np.int64))
    np.testing.assert_allclose(pipe(X.astype(np.float64).tolist())[0], np.maximum(2 * X, 0))
    ids = fastseq.ONNXSequential(_ids_model())
    assert ids([[1, 2]])[0].tolist() == [[2, 4]]
    assert ids(np.array([[1, 2]], np.int32))[0].tolist() == [[2, 4]]
    assert ids([[1.0, 2.0]])[0].tolist() == [[2, 4]]
    for bad in ([[1.5, 2]], [[2**70, 1]], [[float("nan"), 1]]):
        with pytest.raises(fastseq.InputError, match="input 'ids' expects int64"):
            ids(bad)


def _ids_model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Add", ["ids", "ids"], ["twice"])],
        "ids",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 2])],
        [helper.make_tensor_value_info("twice", TensorProto.INT64, ["N", 2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_run_options_timeout_stops_a_slow_model():
    pipe = slow_model(intra_op_threads=1)
    x = slow_input()
    with pytest.raises(fastseq.RunTimeoutError, match="timeout of 0.05 s"):
        pipe.run({"x": x}, timeout=0.05)
    # Terminate from another thread through the caller's own RunOptions.
    run_options = ort.RunOptions()
    threading.Timer(0.05, lambda: setattr(run_options, "terminate", True)).start()
    with pytest.raises(fastseq.RunTimeoutError, match="stopped"):
        pipe.run({"x": x}, run_options=run_options)
    # The pipeline still works afterwards, with a tag and a log level.
    np.testing.assert_allclose(pipe.run({"x": x[:1]}, timeout=60, tag="after", log_level=3)[0], x[:1])


def reshaper(shape):
    """x -> Reshape(x, shape), its node named 'reshape' (so two of them clash)."""
    s = numpy_helper.from_array(np.array(shape, np.int64), "s")
    g = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape")],
        "r",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m"])],
        [s],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_runtime_failure_names_the_stage_and_its_own_names():
    # Both stages have a node named 'reshape'; the second fails at run time on its shape.
    pipe = fastseq.ONNXSequential(reshaper([8]), reshaper([3, 3]))
    with pytest.raises(fastseq.RunError) as info:
        pipe(X.reshape(8))
    text = str(info.value)
    assert "m1/" not in text and "reshape (in " in text and "#1" in text, text
    assert isinstance(info.value.__cause__, Exception)


# --- optimised exports ------------------------------------------------------------------------
def test_export_optimized_records_its_setup_and_warns_elsewhere(tmp_path):
    pipe = fastseq.ONNXSequential(*chain(tmp_path))
    with pytest.raises(fastseq.ExportError, match="does not exist"):  # as every other path (issue 26)
        pipe.export(tmp_path / "out" / "opt.onnx", optimized=True)
    (tmp_path / "out").mkdir()
    target = pipe.export(tmp_path / "out" / "opt.onnx", optimized=True)
    model = onnx.load(str(target), load_external_data=False)
    meta = json.loads({p.key: p.value for p in model.metadata_props}["fastseq.optimized_for"])
    assert meta["onnxruntime"] == ort.__version__ and meta["providers"] == ["CPUExecutionProvider"]
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(str(target), options, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(s.run(None, {"x": X})[0], reference(X))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fastseq.ONNXSequential(str(target))  # the same setup: no warning
    for p in model.metadata_props:
        if p.key == "fastseq.optimized_for":
            p.value = json.dumps(dict(meta, onnxruntime="1.0.0"))
    onnx.save(model, str(target))
    with pytest.warns(RuntimeWarning, match="optimised by onnxruntime 1.0.0"):
        fastseq.ONNXSequential(str(target))


def test_graph_pipeline_shares_the_runtime(tmp_path):
    """fastseq.Pipeline gets the same session cache, binding and run options."""
    paths = chain(tmp_path)
    stages = {"a": paths[0], "b": paths[1]}
    cache = tmp_path / "c"
    pipe = fastseq.Pipeline(stages, edges=["a.y -> b.x"], session_cache=cache)
    assert pipe.session_info["cache"] == "stored"
    again = fastseq.Pipeline(stages, edges=["a.y -> b.x"], session_cache=cache)
    assert again.session_info["cache"] == "hit"
    np.testing.assert_allclose(again(X)[0], reference(X))
    np.testing.assert_allclose(again.bind(X.copy())()[0], reference(X))
    np.testing.assert_allclose(again.run({"x": X}, timeout=30)[0], reference(X))


def test_runtime_failure_in_a_graph_names_the_stage_by_its_key():
    pipe = fastseq.Pipeline({"first": reshaper([8]), "second": reshaper([3, 3])}, edges=["first.y -> second.x"])
    with pytest.raises(fastseq.RunError, match=r"^stage second: .*reshape \(in second\)") as info:
        pipe(np.ones(8, np.float32))
    assert "m1/" not in str(info.value)


def test_pickling_keeps_the_session_options(tmp_path):
    import pickle

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    pipe = fastseq.ONNXSequential(*chain(tmp_path), session_options=options)
    clone = pickle.loads(pickle.dumps(pipe))
    got = clone.get_session().get_session_options()
    assert got.intra_op_num_threads == 1
    assert got.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC


# --- spilling the pipeline's own memory -------------------------------------------------------
def matmul_files(tmp_path: Path, n: int = 2, dim: int = 512) -> list[str]:
    """``n`` chained MatMul models, each with its own (distinct) ``dim`` x ``dim`` weight."""
    rng = np.random.default_rng(1)
    paths = []
    for k in range(n):
        w = numpy_helper.from_array((rng.standard_normal((dim, dim)) / dim).astype(np.float32), "w")
        g = helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["y"], name=f"mm{k}")],
            f"mm{k}",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", dim])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", dim])],
            [w],
        )
        p = tmp_path / f"mm{k}.onnx"
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(p))
        paths.append(str(p))
    return paths


def test_spilled_pipeline_computes_exports_and_combines_as_before(tmp_path, monkeypatch):
    paths = matmul_files(tmp_path)
    x = np.random.default_rng(2).standard_normal((3, 512)).astype(np.float32)
    # Models in memory (2 MB, below SPILL_MIN) are kept there; weights in files never are.
    kept = fastseq.ONNXSequential(*[onnx.load(p) for p in paths], session_cache=False)
    assert "spilled" not in kept.session_info
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(private))
    pipe = fastseq.ONNXSequential(*paths, session_cache=False)
    assert pipe.session_info["spilled"] >= 2 * 512 * 512 * 4
    assert not os.listdir(private), "the spill file is unlinked, the session's copy removed"
    for p in paths:  # the sources truncated: the spilled pipeline no longer reads them
        open(p, "wb").close()
    np.testing.assert_array_equal(pipe(x)[0], kept(x)[0])
    kept.export(tmp_path / "kept.onnx")
    pipe.export(tmp_path / "spilled.onnx")

    def without_stage_map(path: Path) -> bytes:  # whose labels differ: the models' names, the files'
        model = onnx.load(str(path))
        kept_entries = [e for e in model.metadata_props if e.key != "fastseq.stages"]
        assert len(kept_entries) == len(model.metadata_props) - 1
        del model.metadata_props[:]
        model.metadata_props.extend(kept_entries)
        return model.SerializeToString()

    assert without_stage_map(tmp_path / "kept.onnx") == without_stage_map(tmp_path / "spilled.onnx")
    assert pipe.combine().SerializeToString() == kept.combine().SerializeToString()
    assert [m.SerializeToString() for m in pipe.operators] == [m.SerializeToString() for m in kept.operators]
    pipe.as_cpu()  # a new session from the spilled bytes; nothing is spilled twice
    assert "spilled" not in pipe.session_info
    np.testing.assert_array_equal(pipe(x)[0], kept(x)[0])
    assert not os.listdir(private)


def test_a_temporary_folder_in_memory_is_mapped_too(tmp_path, monkeypatch):
    """On a tmpfs the session's copy is memory already (ONNX Runtime maps it): the pipeline
    maps the same file rather than hold a second copy of the weights."""
    monkeypatch.setattr("fastseq.runtime.engine.SPILL_MIN", 1 << 20)
    with tmpfs(tmp_path / "mem", "64m") as mem:
        monkeypatch.setattr("tempfile.tempdir", str(mem))
        pipe = fastseq.ONNXSequential(*[onnx.load(p) for p in matmul_files(tmp_path)], session_cache=False)
        assert pipe.session_info["spilled"] >= 2 * 512 * 512 * 4
        assert pipe(np.ones((1, 512), np.float32))[0].shape == (1, 512)
        del pipe  # its mapping keeps the tmpfs busy
        gc.collect()


SPILL_RSS = """
import sys
import numpy as np
import fastseq, fastseq.runtime.engine
fastseq.runtime.engine.SPILL_MIN = 1 << 40  # weights in memory stay there
def anon():
    return next(int(l.split()[1]) << 10 for l in open("/proc/self/status") if l.startswith("RssAnon"))
before = anon()
sources = sys.argv[2:] if sys.argv[1] == "files" else [open(p, "rb").read() for p in sys.argv[2:]]
pipe = fastseq.ONNXSequential(*sources, session_cache=False)
del sources
pipe(np.ones((1, 2048), np.float32))
print(anon() - before, pipe.session_info.get("spilled", 0))
"""


def test_weights_in_files_are_never_held_in_memory(tmp_path):
    """In a fresh process, the memory a pipeline holds after it is built: from files, the
    weights go from the sources to the session's copy in the kernel and the pipeline maps
    that copy, so only ONNX Runtime's own copy of the weights remains; from bytes held in
    memory (kept there, below the spill size) they count once more."""
    paths = matmul_files(tmp_path, n=2, dim=2048)  # 2 x 16 MiB
    weights = 2 * 2048 * 2048 * 4

    def held(kind: str) -> tuple[int, int]:
        out = subprocess.run(
            [sys.executable, "-c", SPILL_RSS, kind, *paths], capture_output=True, text=True, check=True
        ).stdout.split()
        return int(out[0]), int(out[1])

    kept, not_spilled = held("bytes")
    freed, spilled = held("files")
    assert not_spilled == 0 and spilled >= weights
    assert freed < kept - 0.7 * weights, (kept, freed)


def test_added_metadata_keeps_where_names_come_from(tmp_path):
    """Runtime errors are translated through the composed model's origins: a model with
    metadata added must keep them."""
    pipe = fastseq.ONNXSequential(*chain(tmp_path))
    before = pipe.engine.composed.origins()
    assert before[1], "the chain renamed its clashing names"
    pipe.add_metadata([("owner", "vision")])
    assert pipe.engine.composed.origins() == before
