"""A caller's SessionOptions and RunOptions are theirs (issue 26, item 7): fastseq sets what
one session or one call needs (optimisation off for a cache entry, the optimised model
saved, profiling, a call's terminate flag, log level and tag) on a copy, never on theirs,
so threads that share one options object never see each other's settings."""

from __future__ import annotations

import glob
import os
import re
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import fastseq
from fastseq.graph.session_settings import _CONFIG_KEYS, session_options_dict
from runtime.models import slow_input, slow_model

OPSET = [helper.make_opsetid("", 17)]
EXTERNAL_KEY = "session.optimized_model_external_initializers_file_name"


def matmul_model(k: int = 0, dim: int = 64) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.random.default_rng(k).standard_normal((dim, dim)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Relu", ["t"], ["y"])],
        f"mm{k}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", dim])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", dim])],
        [w],
    )
    return helper.make_model(graph, opset_imports=OPSET, ir_version=8)


def users_options() -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.disable_prepacking", "1")
    return options


def snapshot(options: ort.SessionOptions) -> dict:
    """Everything a program can read back of a SessionOptions."""
    seen = session_options_dict(options)
    for key in (EXTERNAL_KEY, "session.optimized_model_external_initializers_min_size_in_bytes"):
        try:
            seen[key] = options.get_session_config_entry(key)
        except Exception:  # noqa: BLE001 - never set, as it should be
            pass
    return seen


X = np.random.default_rng(9).standard_normal((3, 64)).astype(np.float32)


def test_threads_building_cached_pipelines_leave_a_shared_options_object_as_it_was(tmp_path):
    """Issue 26 (7): 8 threads building cached pipelines with one SessionOptions left it with
    optimized_model_filepath='/proc/self/fd/...' and optimisation level 0 (each thread saved
    and restored another's settings), and the next uncached pipeline built with it failed."""
    options = users_options()
    before = snapshot(options)
    models = [matmul_model(k) for k in range(4)]
    cache = tmp_path / "cache"

    def build(k: int) -> tuple[str, np.ndarray]:
        pipe = fastseq.ONNXSequential(models[k % 4], session_options=options, session_cache=cache)
        return pipe.session_info["cache"], pipe(X)[0]

    with ThreadPoolExecutor(8) as pool:
        built = list(pool.map(build, range(16)))
    assert snapshot(options) == before and options.optimized_model_filepath == ""
    assert {how for how, _ in built} <= {"stored", "hit"} and "hit" in {how for how, _ in built}
    plain = fastseq.ONNXSequential(models[1], session_options=options)  # no cache: the options as they are
    for k, (_, out) in enumerate(built):
        np.testing.assert_allclose(out, fastseq.ONNXSequential(models[k % 4])(X)[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(plain(X)[0], built[1][1], rtol=1e-5, atol=1e-6)
    assert snapshot(options) == before


def test_a_cached_session_runs_with_the_callers_settings(tmp_path):
    """The copy carries what the caller set (threads, config entries); only what the entry
    needs differs: a hit loads the stored optimised model with optimisation off."""
    options = users_options()
    cache = tmp_path / "cache"
    stored = fastseq.ONNXSequential(matmul_model(), session_options=options, session_cache=cache)
    hit = fastseq.ONNXSequential(matmul_model(), session_options=options, session_cache=cache)
    assert (stored.session_info["cache"], hit.session_info["cache"]) == ("stored", "hit")
    for pipe, level in (
        (stored, ort.GraphOptimizationLevel.ORT_ENABLE_ALL),
        (hit, ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
    ):
        used = pipe.get_session().get_session_options()
        assert used.intra_op_num_threads == 1 and used.get_session_config_entry("session.disable_prepacking") == "1"
        assert used.graph_optimization_level == level
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL


def test_profiles_from_threads_with_the_callers_options(tmp_path):
    """Issue 26 (7): profile() from 4 threads raised FileNotFoundError: '' and left
    enable_profiling=True on the caller's options."""
    options = users_options()
    before = snapshot(options)
    pipe = fastseq.ONNXSequential(matmul_model(), session_options=options)
    with ThreadPoolExecutor(4) as pool:
        profiles = list(pool.map(lambda _: pipe.profile(X, runs=3, warmup=1), range(8)))
    assert all(p.runs == 3 and p.stages for p in profiles)
    assert snapshot(options) == before and not options.enable_profiling
    assert options.profile_file_prefix == ort.SessionOptions().profile_file_prefix


def test_an_optimised_export_leaves_the_callers_options(tmp_path):
    options = users_options()
    before = snapshot(options)
    pipe = fastseq.ONNXSequential(matmul_model(), session_options=options)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda k: pipe.export(tmp_path / f"o{k}.onnx", optimized=True), range(4)))
    assert snapshot(options) == before
    for k in range(4):
        np.testing.assert_allclose(
            fastseq.ONNXSequential(str(tmp_path / f"o{k}.onnx"))(X)[0], pipe(X)[0], rtol=1e-5, atol=1e-6
        )


def test_run_settings_go_on_a_copy_and_the_callers_terminate_still_stops_the_call():
    """timeout, log_level and tag were set on the caller's RunOptions (and terminate reset
    after a timeout); now on a copy, which watches the caller's terminate flag."""
    pipe = slow_model(intra_op_threads=1)
    x = np.ones((1, 128), np.float32)
    mine = ort.RunOptions()
    mine.logid, mine.log_severity_level = "mine", 2
    np.testing.assert_array_equal(pipe.run({"x": x}, run_options=mine, log_level=3, tag="t", timeout=600)[0], x)
    assert (mine.logid, mine.log_severity_level, mine.terminate) == ("mine", 2, False)
    with pytest.raises(fastseq.RunTimeoutError):
        pipe.run({"x": slow_input()}, run_options=mine, timeout=0.05)
    assert not mine.terminate
    # The caller stops a call that runs on a copy (it has a timeout) through their own flag.
    threading.Timer(0.05, lambda: setattr(mine, "terminate", True)).start()
    with pytest.raises(fastseq.RunTimeoutError, match="stopped"):
        pipe.run({"x": slow_input()}, run_options=mine, timeout=600)


def test_a_copy_carries_every_config_key_onnxruntime_reads():
    """ONNX Runtime cannot list an options object's config entries, only read them by key:
    the copy asks for every key the installed onnxruntime reads (the strings in its library
    that name session config keys), so none that a caller set is lost."""
    library = glob.glob(os.path.join(os.path.dirname(ort.__file__), "capi", "onnxruntime_pybind11_state*"))
    assert library, "onnxruntime's library not found"
    with open(library[0], "rb") as f:
        data = f.read()
    found = {
        m.decode()
        for m in re.findall(rb"(?<=\x00)((?:session|optimization|mlas|ep)\.[a-z0-9_.]+)(?=\x00)", data)
        if not m.endswith(b".")
    }
    assert len(found) > 50
    missing = sorted(found - set(_CONFIG_KEYS))
    assert not missing, f"add these keys to fastseq/graph/session_settings.py's _CONFIG_KEYS: {missing}"
    from fastseq.runtime.ort_options import session_copy

    options = users_options()
    options.add_session_config_entry("session.intra_op.spin_duration_us", "7")
    copy = session_copy(options)
    assert copy is not options and snapshot(copy) == snapshot(options)
    assert copy.get_session_config_entry("session.intra_op.spin_duration_us") == "7"


def test_a_run_options_copy_keeps_the_callers_settings():
    from fastseq.runtime.ort_options import run_copy

    mine = ort.RunOptions()
    mine.logid, mine.log_verbosity_level, mine.only_execute_path_to_fetches = "mine", 1, True
    mine.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    copy = run_copy(mine)
    assert (copy.logid, copy.log_verbosity_level, copy.only_execute_path_to_fetches) == ("mine", 1, True)
    assert copy.get_run_config_entry("memory.enable_memory_arena_shrinkage") == "cpu:0"
    copy.terminate = True
    assert not mine.terminate


def test_a_custom_operator_library_cannot_be_copied_and_says_so(tmp_path):
    """ONNX Runtime cannot copy custom operator libraries: a pipeline that needs one runs on
    the caller's options as they are, without the session cache (a warning that says why);
    a profile, which needs settings of its own, is a RunError that says why."""
    extensions = pytest.importorskip(
        "onnxruntime_extensions", reason="needs onnxruntime-extensions (a custom op library)"
    )
    graph = helper.make_graph(
        [helper.make_node("StringLower", ["x"], ["y"], domain="ai.onnx.contrib")],
        "lower",
        [helper.make_tensor_value_info("x", TensorProto.STRING, ["N"])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, ["N"])],
    )
    model = helper.make_model(graph, opset_imports=[*OPSET, helper.make_opsetid("ai.onnx.contrib", 1)], ir_version=8)
    options = ort.SessionOptions()
    options.register_custom_ops_library(extensions.get_library_path())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pipe = fastseq.ONNXSequential(model, session_options=options, session_cache=tmp_path / "cache")
    assert pipe(np.array(["AbC"]))[0].tolist() == ["abc"] and pipe.session_info["cache"] is None
    assert any("custom operator libraries" in str(w.message) for w in caught)
    with pytest.raises(fastseq.RunError, match="custom operator libraries"):
        pipe.profile(np.array(["AbC"]), runs=1, warmup=0)


# --- options that would make ONNX Runtime write a file (issue 26, item 3) -------------------------
FILE_CASES = [
    ("optimized_model_filepath", '"notes.txt"', "export(path, optimized=True)"),
    ("profile_file_prefix", '"notes"', "profile()"),
    ("enable_profiling", "true", "profile()"),
    ('"session.optimized_model_external_initializers_file_name"', '"notes.txt"', "export(path, optimized=True)"),
    ('"session.collect_node_memory_stats_to_file"', '"notes.txt"', "export the model"),
    ('"ep.context_enable"', '"1"', "export the model"),
    ('"ep.context_file_path"', '"notes.txt"', "export the model"),
    ('"session.debug_layout_transformation"', '"1"', "export the model"),
]


@pytest.mark.parametrize("key,value,instead", FILE_CASES, ids=[c[0].strip('"') for c in FILE_CASES])
def test_a_pipeline_file_cannot_make_onnx_runtime_write_a_file(tmp_path, monkeypatch, key, value, instead):
    """A pipeline file is input that people share: an option naming a file for ONNX Runtime
    to write (or read) is a PipelineFileError naming the option and what to use instead, in
    Python and from the CLI, and nothing is written: before, ``optimized_model_filepath =
    "notes.txt"`` overwrote notes.txt and ``profile_file_prefix`` dropped JSON files."""
    import subprocess
    import sys

    onnx.save(matmul_model(), str(tmp_path / "m.onnx"))
    (tmp_path / "notes.txt").write_text("the user's notes")
    (tmp_path / "p.toml").write_text(f'[stages]\nm = "m.onnx"\n\n[session_options]\n{key} = {value}\n')
    monkeypatch.chdir(tmp_path)
    name = key.strip('"')
    with pytest.raises(fastseq.PipelineFileError) as e:
        fastseq.Pipeline.from_file(tmp_path / "p.toml", session_cache=False)
    assert f"session_options: {name}: a pipeline file cannot name a file" in str(e.value) and instead in str(e.value)
    np.save(tmp_path / "x.npy", np.ones((2, 64), np.float32))
    for args in (["run", "p.toml", "--input", "x=x.npy"], ["merge", "p.toml", "-o", "out.onnx"]):
        r = subprocess.run(
            [sys.executable, "-m", "fastseq", *args], capture_output=True, text=True, timeout=120, cwd=tmp_path
        )
        lines = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(lines) == 1 and name in lines[0] and instead in lines[0], r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "notes.txt", "p.toml", "x.npy"]
    assert (tmp_path / "notes.txt").read_text() == "the user's notes"


def test_a_callers_options_naming_a_file_are_an_input_error_naming_the_option(tmp_path, monkeypatch):
    """The Python API decides as pipeline files do (docs/security.md, "Files that ONNX Runtime
    would write"): a session may start many times (the session cache, pickling, Ray actors),
    each writing the same file, and fastseq writes files through its writer only; the error
    names the option and the call that writes the file through fastseq's writer."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("the user's notes")
    for attribute, value, instead in [
        ("optimized_model_filepath", "notes.txt", "export(path, optimized=True)"),
        ("enable_profiling", True, "profile()"),
        ("profile_file_prefix", "notes", "profile()"),
    ]:
        options = ort.SessionOptions()
        setattr(options, attribute, value)
        makers = [
            lambda o=options: fastseq.ONNXSequential(matmul_model(), session_options=o, session_cache=False),
            lambda o=options: fastseq.ONNXSequential(matmul_model(), session_options=o, session_cache=tmp_path / "c"),
            lambda o=options: fastseq.Pipeline({"m": matmul_model()}, session_options=o, session_cache=False),
            lambda a=attribute, v=value: fastseq.Pipeline(
                {"m": matmul_model()}, session_options={a: v}, session_cache=False
            ),
            lambda o=options: fastseq.ONNXSequential(matmul_model(), session_cache=False).create_session(
                session_options=o
            ),
        ]
        for make in makers:
            with pytest.raises(fastseq.InputError, match=re.escape(f"session_options.{attribute}")) as e:
                make()
            assert instead in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "c") == ["notes.txt"]
    assert (tmp_path / "notes.txt").read_text() == "the user's notes"


def test_to_file_will_not_write_such_options_into_a_pipeline_file(tmp_path):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    pipe = fastseq.Pipeline({"m": matmul_model()}, session_options=options, session_cache=False)
    pipe.to_file(tmp_path / "ok.toml")  # harmless options travel
    assert "intra_op_num_threads = 1" in (tmp_path / "ok.toml").read_text()
    spec = pipe.spec
    from dataclasses import replace

    bad = ort.SessionOptions()
    bad.optimized_model_filepath = "notes.txt"
    from fastseq.graph import pipefile_write

    with pytest.raises(fastseq.ExportError, match="optimized_model_filepath"):
        pipefile_write.write(replace(spec, session_options=bad), tmp_path / "bad.toml")
    assert not (tmp_path / "bad.toml").exists()
