"""Profiles attribute every node to its stage by the core's origins, whatever the nodes are
called: unnamed nodes (onnx.helper, skl2onnx and many converters leave them so), named ones,
both, names that clash across stages or look like another stage's, graph pipelines,
pipeline files, and files written by fastseq and read back (their stage map), on real
ONNX Runtime sessions and profiles; and the profile as a caller sees it (fastseq.runtime.profile):
its table, dict and drawing, its arguments, the files it leaves, the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import fastseq
from conftest import FIXTURES, tmpfs
from fastseq.runtime.profile import Profile, StageTime
from runtime import models

DIM = 128


def matmuls(n: int, seed: int = 0, names: list[str | None] | None = None, inputs=("x",), output="y") -> onnx.ModelProto:
    """``n`` chained MatMuls [N, DIM] x [DIM, DIM]; node k named ``names[k]`` (None: no name,
    as onnx.helper.make_node leaves it). Several inputs are summed first (an unnamed Sum)."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array((rng.standard_normal((DIM, DIM)) / np.sqrt(DIM)).astype(np.float32), "w")
    names = names if names is not None else [None] * n
    nodes, prev = [], inputs[0]
    if len(inputs) > 1:
        nodes.append(helper.make_node("Sum", list(inputs), ["s"]))
        prev = "s"
    for k in range(n):
        out = output if k == n - 1 else f"h{k}"
        kwargs = {"name": names[k]} if names[k] is not None else {}
        nodes.append(helper.make_node("MatMul", [prev, "w"], [out], **kwargs))
        prev = out
    g = helper.make_graph(
        nodes,
        f"mm{n}",
        [helper.make_tensor_value_info(i, TensorProto.FLOAT, ["N", DIM]) for i in inputs],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["N", DIM])],
        [w],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def rows(k: int = 256, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((k, DIM)).astype(np.float32)


def one_thread() -> ort.SessionOptions:
    """One intra-op thread: on a shared machine, waking a pool of threads lands on whichever
    kernel runs first and can outweigh the work being compared."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return options


def light_heavy(light: onnx.ModelProto | None = None, heavy: onnx.ModelProto | None = None) -> fastseq.Pipeline:
    """One MatMul, then twelve: the issue's pipeline, unnamed nodes by default."""
    return fastseq.Pipeline(
        {"light": light or matmuls(1, seed=1), "heavy": heavy or matmuls(12, seed=2)},
        edges=["light.y -> heavy.x"],
        session_options=one_thread(),
    )


def check_sums(p: fastseq.Profile) -> None:
    """The stages and the rest between them make up the run."""
    assert sum(s.ms for s in p.stages) + p.unassigned_ms == pytest.approx(p.run_ms)
    assert sum(s.share for s in p.stages) + p.unassigned_share == pytest.approx(1.0)


def kernel_names(model: bytes, x: np.ndarray, tmp_path: Path) -> set[str]:
    """The node names ONNX Runtime's own profile report gives the kernels of one run."""
    options = ort.SessionOptions()
    options.enable_profiling, options.profile_file_prefix = True, str(tmp_path / "ort")
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    session.run(None, {session.get_inputs()[0].name: x})
    with open(session.end_profiling()) as f:
        events = json.load(f)
    return {
        e["name"][: -len("_kernel_time")]
        for e in events
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
    }


def test_unnamed_nodes_are_profiled_in_their_stages_as_onnxruntime_reports_them(tmp_path):
    pipe = light_heavy()
    x = rows()
    p = pipe.profile(x, runs=10, warmup=2)
    light, heavy = p.stages
    assert (light.name, light.nodes, heavy.name, heavy.nodes) == ("light", 1, "heavy", 12)
    assert light.ms > 0 and heavy.ms > light.ms and p.hottest is heavy  # twelve times the work
    assert heavy.share > light.share and heavy.share > p.unassigned_share
    check_sums(p)
    # The core named the nodes after their stage and their place there; ONNX Runtime's report,
    # the profile and the composed model say the same names.
    assert [n.name for n in light.slowest] == ["light/MatMul_0"]
    assert {n.name for n in heavy.slowest} <= {f"heavy/MatMul_{k}" for k in range(12)} and len(heavy.slowest) == 5
    merged = [n.name for n in pipe.model.graph.node]
    assert merged == ["light/MatMul_0", *(f"heavy/MatMul_{k}" for k in range(12))]
    assert kernel_names(pipe.model_bytes, x, tmp_path) == set(merged)
    table = str(p)
    assert "heavy (hottest)" in table and "light/MatMul_0 (MatMul)" in table and "note:" not in table


def test_named_unnamed_and_clashing_nodes_each_count_for_their_own_stage():
    # light names a node as heavy's second (unnamed) MatMul would be named, leaves one
    # unnamed, and shares the name 'mm' with heavy; heavy names one as light's unnamed would be.
    light = matmuls(3, seed=1, names=["heavy/MatMul_1", None, "mm"])
    heavy = matmuls(6, seed=2, names=["mm", None, "mm1", None, "light/MatMul_1", None])
    pipe = light_heavy(light, heavy)
    merged = [n.name for n in pipe.model.graph.node]
    # The users' names are theirs; the names given avoid them; the clash is renamed.
    assert merged == [
        "heavy/MatMul_1",
        "light/MatMul_1_1",
        "mm",
        "m1/mm",
        "heavy/MatMul_1_1",
        "mm1",
        "heavy/MatMul_3",
        "light/MatMul_1",
        "heavy/MatMul_5",
    ]
    p = pipe.profile(rows(), runs=5, warmup=1)
    light_t, heavy_t = p.stages
    assert (light_t.nodes, heavy_t.nodes) == (3, 6)
    check_sums(p)
    assert {n.name for n in light_t.slowest} == {"heavy/MatMul_1", "light/MatMul_1_1", "mm"}
    # heavy's names as its own model has them ('mm', not 'm1/mm'); its unnamed as the core named them.
    assert {n.name for n in heavy_t.slowest} <= {
        "mm",
        "heavy/MatMul_1_1",
        "mm1",
        "heavy/MatMul_3",
        "light/MatMul_1",
        "heavy/MatMul_5",
    }
    assert len(heavy_t.slowest) == 5
    assert p.hottest is max(p.stages, key=lambda s: s.share)


def test_the_hottest_stage_has_the_largest_share_and_none_took_no_time():
    def stage(name: str, ms: float, share: float) -> StageTime:
        return StageTime(name, ms, share, 1, ())

    def profile(*stages: StageTime) -> Profile:
        rest = 1.0 - sum(s.share for s in stages)
        return Profile(stages, 1.0, rest, rest, (), 1, 0.0, ("CPUExecutionProvider",))

    p = profile(stage("a", 0.1, 0.1), stage("b", 0.7, 0.7))
    assert p.hottest.name == "b" and "b (hottest)" in str(p) and p.to_dict()["hottest"] == "b"
    idle = profile(stage("a", 0.0, 0.0), stage("b", 0.0, 0.0))
    assert idle.hottest is None and "(hottest)" not in str(idle) and idle.to_dict()["hottest"] is None


def test_a_graph_pipeline_of_unnamed_stages():
    pre, left, right = matmuls(1, seed=1), matmuls(10, seed=2), matmuls(1, seed=3)
    join = matmuls(1, seed=4, inputs=("a", "b"))
    pipe = fastseq.Pipeline(
        {"pre": pre, "left": left, "right": right, "join": join},
        edges=["pre.y -> left.x", "pre.y -> right.x", "left.y -> join.a", "right.y -> join.b"],
        session_options=one_thread(),
    )
    p = pipe.profile(rows(), runs=10, warmup=2)
    assert {s.name: s.nodes for s in p.stages} == {"pre": 1, "left": 10, "right": 1, "join": 2}
    assert all(s.ms > 0 for s in p.stages)
    assert p.hottest.name == "left"
    check_sums(p)
    assert {n.name for n in next(s for s in p.stages if s.name == "join").slowest} == {"join/Sum_0", "join/MatMul_1"}


def test_a_pipeline_files_builtin_stage_is_profiled(tmp_path):
    # The shipped normalize file has unnamed nodes; the torch backbone's are named.
    (tmp_path / "pipeline.toml").write_text(
        'edges = ["pre.output -> backbone.image"]\n'
        f'[stages]\npre = "builtin:shipped/normalize"\nbackbone = "{FIXTURES / "torch_cnn_backbone.onnx"}"\n'
    )
    pipe = fastseq.Pipeline.from_file(tmp_path / "pipeline.toml")
    x = np.random.default_rng(0).standard_normal((32, 3, 32, 32)).astype(np.float32)
    p = pipe.profile(x, runs=5, warmup=1)
    pre, backbone = p.stages
    assert (pre.name, pre.nodes) == ("pre", 2) and pre.ms > 0 and backbone.ms > 0
    assert {n.name for n in pre.slowest} == {"pre/Sub_0", "pre/Div_1"}
    check_sums(p)


def test_an_exported_file_keeps_its_stages_for_profile_and_inspect(tmp_path):
    pipe = light_heavy()
    target = pipe.export(tmp_path / "merged.onnx")
    stage_map = json.loads(dict((e.key, e.value) for e in onnx.load(str(target)).metadata_props)["fastseq.stages"])
    assert stage_map["stages"] == [["light", 0, 1, 0], ["heavy", 1, 13, 0]] and stage_map["nodes"] == 13
    # Read back, alone: the stages of the file, its profile and errors in their names.
    again = fastseq.ONNXSequential(str(target), session_options=one_thread())
    p = again.profile(rows(), runs=5, warmup=1)
    assert [(s.name, s.nodes) for s in p.stages] == [("light", 1), ("heavy", 12)] and p.hottest.name == "heavy"
    assert p.note is None
    check_sums(p)
    # An export of the export keeps them.
    again.export(tmp_path / "again.onnx")
    assert (
        fastseq.ONNXSequential(str(tmp_path / "again.onnx")).profile(rows(8), runs=1, warmup=0).stages[0].name
        == "light"
    )
    out = cli("inspect", str(target))
    assert out.returncode == 0, out.stderr
    assert "stages (from its stage map):\n  light: 1 node (#0)\n  heavy: 12 nodes (#1-#12)" in out.stdout


@pytest.mark.parametrize("edit", ["rename a node", "drop a node", "move a range"])
def test_a_file_edited_elsewhere_is_not_misattributed(tmp_path, edit):
    target = light_heavy().export(tmp_path / "merged.onnx")
    model = onnx.load(str(target))
    if edit == "rename a node":
        model.graph.node[5].name = "edited"
    elif edit == "drop a node":  # the last MatMul: its input becomes the output
        last = model.graph.node.pop()
        model.graph.node[-1].output[0] = last.output[0]
    else:  # the map itself edited to say light has more nodes
        entry = next(e for e in model.metadata_props if e.key == "fastseq.stages")
        entry.value = entry.value.replace('["light",0,1,0],["heavy",1,13,0]', '["light",0,7,0],["heavy",7,13,0]')
    onnx.save(model, str(target))
    pipe = fastseq.ONNXSequential(str(target))
    p = pipe.profile(rows(8), runs=2, warmup=0)
    assert [s.name for s in p.stages] == ["merged.onnx"]  # one stage: the file, not a wrong split
    assert "fastseq.stages" in p.note and p.note.endswith("ignored") and f"note: {p.note}" in str(p)
    out = cli("inspect", str(target))
    assert out.returncode == 0 and "stages (from its stage map)" not in out.stdout
    assert "note: its stage map (fastseq.stages in its metadata)" in out.stdout


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fastseq", *args], capture_output=True, text=True, timeout=120)


def test_the_cli_profiles_an_exported_file_by_its_stages(tmp_path):
    target = light_heavy().export(tmp_path / "merged.onnx")
    np.save(tmp_path / "x.npy", rows(64))
    out = cli("profile", str(target), "--input", f"x={tmp_path / 'x.npy'}", "--runs", "3", "--warmup", "1")
    assert out.returncode == 0, out.stderr
    table = out.stdout.splitlines()
    assert any(line.startswith("light ") for line in table) and any(line.startswith("heavy") for line in table)
    assert "(hottest)" in out.stdout and "light/MatMul_0 (MatMul)" in out.stdout and "heavy/MatMul_" in out.stdout


def test_the_onnx_compose_drop_in_leaves_unnamed_nodes_unnamed():
    from fastseq import onnx_compose

    a, b = matmuls(1, seed=1), matmuls(2, seed=2)
    ours = onnx_compose.merge_models(a, b, io_map=[("y", "x")], prefix1="a/", prefix2="b/")
    theirs = onnx.compose.merge_models(a, b, io_map=[("y", "x")], prefix1="a/", prefix2="b/")
    assert [n.name for n in ours.graph.node] == [n.name for n in theirs.graph.node] == ["", "", ""]
    assert not any(e.key == "fastseq.stages" for e in ours.metadata_props)


def test_the_profile_never_imports_onnx(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(matmuls(2, seed=1), str(model))
    code = (
        "import sys, numpy as np, fastseq\n"
        f"pipe = fastseq.ONNXSequential({str(model)!r}, {str(model)!r})\n"
        "p = pipe.profile(np.ones((4, 128), np.float32), runs=2, warmup=0)\n"
        "assert [s.nodes for s in p.stages] == [2, 2], p\n"
        "assert 'onnx' not in sys.modules, 'the profile imported onnx'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_one_stalled_run_makes_no_stage_the_hot_one(monkeypatch):
    """On a busy machine one run's kernel can stall for a second: medians over the runs keep
    the heavy stage the hot one (a mean gave the lightest stage 90% of the time)."""
    from fastseq.runtime import profile as profile_module

    real, stall = profile_module._read_events, 1_000_000  # µs

    def stalled(path):
        events = real(path)
        runs = sorted((e for e in events if e.name == "model_run"), key=lambda e: e.ts)
        window = runs[5]  # a profiled run (3 warm-up runs before)
        first = min(
            (e for e in events if e.cat == "Node" and window.ts <= e.ts < window.ts + window.dur), key=lambda e: e.ts
        )  # the light stage's MatMul: it runs first
        out = []
        for e in events:
            if e is first or e is window:
                e = e._replace(dur=e.dur + stall)
            elif e.ts > first.ts:
                e = e._replace(ts=e.ts + stall)
            out.append(e)
        return out

    monkeypatch.setattr(profile_module, "_read_events", stalled)
    p = light_heavy().profile(rows(), runs=9, warmup=3)
    assert p.hottest.name == "heavy" and p.run_ms < stall / 1000 / 10
    check_sums(p)


# --- profiles (the API: table, dict, drawing, arguments, files, the command line) ----------------


def test_profile_maps_the_time_back_to_the_stages_and_their_own_node_names():
    pipe = models.light_heavy()
    session = pipe.get_session()
    x = models.rows(256)
    before = pipe(x)
    p = pipe.profile(x, runs=20, warmup=2)
    light, heavy = p.stages
    assert (light.name, light.nodes, heavy.name, heavy.nodes) == ("light", 1, "heavy", 10)
    assert heavy.ms > light.ms and p.hottest is heavy  # ten times the work
    # Both stages name their nodes mm0, mm1, ...: the merge renamed the clash, the profile does not show it.
    assert [(n.name, n.op_type) for n in light.slowest] == [("mm0", "MatMul")]
    assert {n.name for n in heavy.slowest} <= {f"mm{k}" for k in range(10)} and len(heavy.slowest) == 5
    assert all(n.op_type == "MatMul" for n in heavy.slowest)
    # The stages and the rest between them make up the run.
    assert sum(s.ms for s in p.stages) + p.unassigned_ms == pytest.approx(p.run_ms)
    assert sum(s.share for s in p.stages) + p.unassigned_share == pytest.approx(1.0)
    assert p.runs == 20 and p.session_s > 0 and p.providers == ("CPUExecutionProvider",)
    # The pipeline's own session is untouched.
    assert pipe.get_session() is session
    models.same(pipe(x), before)


def test_profile_table_dict_and_drawing():
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    pipe = models.light_heavy(session_options=options)
    p = pipe.profile(models.rows(8), runs=3, warmup=1)
    assert not options.enable_profiling  # the pipeline's options are its own again
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    table = str(p)
    assert (
        f"{p.hottest.name} (hottest)" in table and "light" in table and "heavy" in table and "(between stages)" in table
    )
    assert "mm0 (MatMul)" in table
    data = json.loads(json.dumps(p.to_dict()))
    assert data["hottest"] == p.hottest.name and [s["name"] for s in data["stages"]] == ["light", "heavy"]
    assert data["stages"][1]["nodes"] == 10 and data["stages"][0]["slowest"][0]["name"] == "mm0"
    dot = pipe.to_dot(profile=p)
    assert "(hottest)" in dot and f"{p.stages[1].ms:.3g} ms" in dot and "#c62828" in dot  # the hottest in red
    assert "(hottest)" not in pipe.to_dot()


def test_profile_stage_names_from_a_pipeline_file(tmp_path):
    models.light_heavy().to_file(tmp_path / "pipeline.toml")
    pipe = fastseq.Pipeline.from_file(tmp_path / "pipeline.toml")
    p = pipe.profile(x=models.rows(4), runs=2, warmup=0)
    assert [s.name for s in p.stages] == ["light", "heavy"]


def test_profile_of_a_chain_names_its_models_and_counts_adapters_between_stages():
    seq = fastseq.ONNXSequential(models.matmuls(2, seed=3), models.matmuls(3, seed=4))
    p = seq.profile(models.rows(2), runs=2, warmup=1)
    assert [(s.name, s.nodes) for s in p.stages] == [(seq.engine.labels[0], 2), (seq.engine.labels[1], 3)]
    # An adapter the merge inserts between stages (here a Cast) belongs to no stage.
    as_double = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"], name="relu")],
            "d",
            [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["N", 128])],
            [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["N", 128])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=8,
    )
    pipe = fastseq.Pipeline({"a": models.matmuls(1), "b": as_double}, edges=["a.y -> b.x"], adapt=True)
    p = pipe.profile(models.rows(2), runs=2, warmup=1)
    assert [s.nodes for s in p.stages] == [1, 1]
    assert [n.op_type for n in p.unassigned_nodes] == ["Cast"]


def test_a_stage_node_named_like_an_adapter_is_still_the_stages_work():
    # The core says which nodes it inserted; a name is not the test.
    lookalike = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"], name="fastseq/adapt0/Cast")],
            "d",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 128])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 128])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=8,
    )
    pipe = fastseq.Pipeline({"a": models.matmuls(1), "b": lookalike}, edges=["a.y -> b.x"])
    p = pipe.profile(models.rows(2), runs=2, warmup=1)
    assert [s.nodes for s in p.stages] == [1, 1]
    assert p.unassigned_nodes == ()
    assert [n.name for n in p.stages[1].slowest] == ["fastseq/adapt0/Cast"]


def test_profile_refuses_bad_arguments_and_inputs():
    pipe = models.light_heavy()
    with pytest.raises(ValueError, match="runs >= 1"):
        pipe.profile(models.rows(2), runs=0)
    with pytest.raises(fastseq.InputError, match="expects float32"):
        pipe.profile(models.rows(2).astype(np.float64))


def test_profile_leaves_no_files_and_refuses_a_profile_cut_short_by_a_full_disk(tmp_path, monkeypatch):
    pipe = models.light_heavy()
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    pipe.profile(models.rows(4), runs=2, warmup=1)
    assert not os.listdir(tmp_path / "tmp")
    # ONNX Runtime writes its profile without checking the writes: on a full disk the file is
    # cut short, and the profile says so instead of summing what is left.
    with tmpfs(tmp_path / "full", "256k") as full:
        monkeypatch.setattr("tempfile.tempdir", str(full))
        with pytest.raises(fastseq.RunError, match="of the 200 runs measured: its file was cut short"):
            pipe.profile(models.rows(64), runs=200, warmup=0)
        assert not os.listdir(full)
    models.same(pipe(models.rows(2)), pipe(models.rows(2)))  # the pipeline is unharmed


def test_cli_profile_prints_the_table(tmp_path):
    models.light_heavy().to_file(tmp_path / "pipeline.toml")
    np.save(tmp_path / "x.npy", models.rows(4))

    def fastseq_cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "fastseq", *args], capture_output=True, text=True, cwd=tmp_path, timeout=120
        )

    r = fastseq_cli("profile", "pipeline.toml", "--input", "x=x.npy", "--runs", "3", "--warmup", "1")
    assert r.returncode == 0, r.stderr
    assert "light" in r.stdout and "heavy" in r.stdout and "(hottest)" in r.stdout and "(between stages)" in r.stdout
    assert "median of 3 profiled runs" in r.stdout and "mm0 (MatMul)" in r.stdout
    r = fastseq_cli("profile", "pipeline.toml", "--input", "x=missing.npy")
    assert r.returncode != 0 and "fastseq: error: --input x=missing.npy: no such file" in r.stderr
