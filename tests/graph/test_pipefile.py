"""Pipeline files as a new user writes them (fastseq.graph.pipefile): the chain form (by
position and by name), stages left unconnected, outputs = [], old-style builtin: names, a
file of several pipelines. Real files, real sessions, compared with each stage run on its
own; writing them is test_pipefile_write.py's."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import fastseq
from conftest import run, run_chain
from fastseq import ops

X = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fastseq", *args], capture_output=True, text=True, cwd=cwd, timeout=240
    )


# --- the chain form ---------------------------------------------------------------------------------


def test_a_chain_joins_its_stages_in_order_by_position(folder):
    (folder / "c.toml").write_text(
        'chain = ["first", "second", "probs"]\n[stages]\nsecond = "b.onnx"\n'
        'first = "a.onnx"\nprobs = "builtin:softmax"\n'
    )
    pipe = fastseq.Pipeline.from_file(folder / "c.toml")
    assert pipe.stages == ["first", "second", "probs"]
    assert [str(e) for e in pipe.edges] == ["first.y -> second.u", "second.v -> probs.input"]
    reference = run_chain([folder / "a.onnx", folder / "b.onnx", ops.softmax().SerializeToString()], {"x": X})
    np.testing.assert_allclose(pipe(X)[0], reference["probabilities"], rtol=1e-6)
    # The same pipeline with each edge spelt out computes the same.
    (folder / "e.toml").write_text(
        'edges = ["first.y -> second.u", "second.v -> probs.input"]\n[stages]\n'
        'first = "a.onnx"\nsecond = "b.onnx"\nprobs = "builtin:softmax"\n'
    )
    np.testing.assert_array_equal(fastseq.Pipeline.from_file(folder / "e.toml")(X)[0], pipe(X)[0])


def test_a_chain_joins_by_name_where_each_joint_gives_an_io_map(folder):
    (folder / "c.toml").write_text(
        'chain = ["split", { stage = "diff", io_map = ["twice:a", "neg:b"] }, '
        '{ stage = "top", io_map = ["d:input"] }]\n'
        '[stages]\nsplit = "two.onnx"\ndiff = "sub.onnx"\ntop = "builtin:topk?k=2"\n'
    )
    pipe = fastseq.Pipeline.from_file(folder / "c.toml")
    values, indices = pipe(X)
    d = 3 * X  # 2x - (-x)
    np.testing.assert_allclose(values, -np.sort(-d, axis=1)[:, :2], rtol=1e-6)
    np.testing.assert_array_equal(indices, np.argsort(-d, axis=1, kind="stable")[:, :2])
    # Written back in the same form, and read back to the same pipeline.
    (folder / "w").mkdir()
    text = pipe.to_file(folder / "w" / "c.toml").read_text()
    assert 'chain = ["split", { stage = "diff", io_map = ["twice:a", "neg:b"] }' in text
    again = fastseq.Pipeline.from_file(folder / "w" / "c.toml")
    np.testing.assert_array_equal(again(X)[0], values)


def test_an_io_map_is_needed_only_on_the_joints_that_join_by_name(folder):
    """Issue 41: one joint by name, the others by position (written back the same way)."""
    (folder / "c.toml").write_text(
        'chain = ["a", "split", { stage = "diff", io_map = ["twice:a", "neg:b"] }, "b"]\n'
        '[stages]\na = "a.onnx"\nsplit = "two.onnx"\ndiff = "sub.onnx"\nb = "b.onnx"\n'
    )
    pipe = fastseq.Pipeline.from_file(folder / "c.toml")
    assert [str(e) for e in pipe.edges] == [
        "a.y -> split.x",
        "split.twice -> diff.a",
        "split.neg -> diff.b",
        "diff.d -> b.u",
    ]
    a = np.maximum(2 * X, 0)  # a and b are relu(c * x)
    np.testing.assert_allclose(pipe(X)[0], np.maximum(3 * (2 * a + a), 0), rtol=1e-6)  # b(twice - neg)
    (folder / "w").mkdir()
    text = pipe.to_file(folder / "w" / "c.toml").read_text()
    assert 'chain = ["a", "split", { stage = "diff", io_map = ["twice:a", "neg:b"] }, "b"]' in text, text
    np.testing.assert_array_equal(fastseq.Pipeline.from_file(folder / "w" / "c.toml")(X)[0], pipe(X)[0])


STAGES = '[stages]\na = "a.onnx"\nb = "b.onnx"\n'


@pytest.mark.parametrize(
    "text,says",
    [
        ('chain = ["a", "bb"]\n' + STAGES, "chain[1]: no stage named 'bb' (did you mean 'b'"),
        ('chain = ["a", "b", "a"]\n' + STAGES, "chain[2]: 'a' is in the chain twice (chain[0]); each stage runs once"),
        ('chain = ["a"]\n' + STAGES, "chain: stage b of [stages] is not in the chain"),
        ("chain = []\n" + STAGES, "chain: expected the stages in the order they run"),
        ('chain = "a"\n' + STAGES, "chain: expected the stages in the order they run"),
        ('chain = ["a", 5]\n' + STAGES, "chain[1]: expected a stage name, got int 5"),
        (
            'chain = ["a", { stage = "b", io_mpa = ["y:u"] }]\n' + STAGES,
            "'io_mpa' is not a key (did you mean 'io_map'?)",
        ),
        ('chain = ["a", { io_map = ["y:u"] }]\n' + STAGES, "chain[1]: needs a 'stage'"),
        ('chain = [{ stage = "a", io_map = [] }, "b"]\n' + STAGES, "chain[0].io_map: the first stage has no stage"),
        (
            'chain = ["a", { stage = "b", io_map = ["yu"] }]\n' + STAGES,
            "chain[1].io_map[0]: 'yu': expected OUTPUT:INPUT",
        ),
        ('chain = ["a", { stage = "b", io_map = "y:u" }]\n' + STAGES, "chain[1].io_map: expected a list"),
        ('chain = ["a", "b"]\nedges = ["a.y -> b.u"]\n' + STAGES, "edges: belongs to the graph form"),
        ('chain = ["a", "b"]\noutputs = ["b.v"]\n' + STAGES, "outputs: belongs to the graph form"),
        ('chain = ["a", "b"]\nadapt = ["a.y -> b.u"]\n' + STAGES, "adapt: a chain's adapters are given as true"),
    ],
)
def test_a_bad_chain_is_a_pipeline_file_error_naming_the_key(folder, text, says):
    (folder / "c.toml").write_text(text)
    with pytest.raises(fastseq.PipelineFileError) as info:
        fastseq.Pipeline.from_file(folder / "c.toml")
    assert str(info.value).startswith(f"{folder / 'c.toml'}: ") and says in str(info.value), str(info.value)


# --- stages left unconnected ---------------------------------------------------------------------------


def test_stages_nothing_connects_are_an_error_naming_them_and_the_forms_that_join_them(folder):
    (folder / "p.toml").write_text('[stages]\na = "a.onnx"\nsm = "builtin:softmax"\ntop = "builtin:topk?k=2"\n')
    with pytest.raises(fastseq.CompositionError) as info:
        fastseq.Pipeline.from_file(folder / "p.toml")
    text = str(info.value)
    assert text.startswith(f"{folder / 'p.toml'}: stages a, sm and top are not connected (no edge joins them): ")
    assert (
        'chain = ["a", "sm", "top"] runs them one after another' in text and 'edges = ["a.OUTPUT -> sm.INPUT"' in text
    )
    r = cli("run", "p.toml", cwd=folder)
    assert r.returncode == 1 and r.stderr.count("fastseq: error:") == 1 and "are not connected" in r.stderr
    # Outputs that leave a group out: the group would be pruned whole.
    (folder / "q.toml").write_text(
        'outputs = ["top.values"]\nedges = ["sm.probabilities -> top.input"]\n'
        '[stages]\na = "a.onnx"\nsm = "builtin:softmax"\ntop = "builtin:topk?k=2"\n'
    )
    with pytest.raises(
        fastseq.CompositionError,
        match=r"groups that nothing connects: a; sm, top, and outputs "
        r"names no output of a",
    ):
        fastseq.Pipeline.from_file(folder / "q.toml")
    with pytest.raises(fastseq.CompositionError, match=r"^stages a and b are not connected .*pass edges="):
        fastseq.Pipeline({"a": folder / "a.onnx", "b": folder / "b.onnx"})


def test_stages_side_by_side_are_built_where_the_outputs_or_a_shared_input_say_so(folder):
    side = fastseq.Pipeline({"a": str(folder / "a.onnx"), "b": str(folder / "b.onnx")}, outputs=["a.y", "b.v"])
    y, v = side(X, X)
    np.testing.assert_allclose(y, run(folder / "a.onnx", {"x": X})["y"])
    np.testing.assert_allclose(v, run(folder / "b.onnx", {"u": X})["v"])
    shared = fastseq.Pipeline({"a": str(folder / "a.onnx"), "b": str(folder / "b.onnx")}, inputs={"x": ["a.x", "b.u"]})
    assert [i.name for i in shared.inputs] == ["x"] and len(shared(X)) == 2


def test_outputs_that_name_nothing_are_refused(folder):
    (folder / "p.toml").write_text('outputs = []\nedges = ["a.y -> b.u"]\n' + STAGES)
    with pytest.raises(fastseq.CompositionError, match=r"p.toml: outputs: empty: the pipeline would compute nothing"):
        fastseq.Pipeline.from_file(folder / "p.toml")
    r = cli("merge", "p.toml", "-o", "m.onnx", cwd=folder)
    assert r.returncode == 1 and "outputs: empty" in r.stderr and not (folder / "m.onnx").exists()
    with pytest.raises(fastseq.CompositionError, match="outputs: empty"):
        fastseq.Pipeline({"a": str(folder / "a.onnx")}, outputs=[])


# --- builtin: names ---------------------------------------------------------------------------------------


def test_old_style_builtin_names_keep_their_models_with_one_note_each(folder):
    old = (
        'chain = ["f", "r", "n", "h"]\n[stages]\nf = "builtin:to_float"\nr = "builtin:resize"\n'
        'n = "builtin:normalize"\nh = "builtin:color_head"\n'
    )
    (folder / "old.toml").write_text(old)
    (folder / "new.toml").write_text(
        old.replace("builtin:to_float", "builtin:shipped/to_float")
        .replace("builtin:resize", "builtin:shipped/resize")
        .replace("builtin:normalize", "builtin:shipped/normalize")
    )
    image = np.load(fastseq.ops.shipped.sample())
    with pytest.warns(FutureWarning) as caught:
        before = fastseq.Pipeline.from_file(folder / "old.toml")
    assert len(caught) == 3 and all("builtin:shipped/" in str(w.message) for w in caught)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        after = fastseq.Pipeline.from_file(folder / "new.toml")
    np.testing.assert_array_equal(before(image)[0], after(image)[0])
    r = cli("run", "old.toml", "--input", str(fastseq.ops.shipped.sample()), cwd=folder)
    assert r.returncode == 0, r.stderr
    notes = [ln for ln in r.stderr.splitlines() if ln.startswith("fastseq: warning:")]
    assert [ln.split()[2] for ln in notes] == ["builtin:to_float", "builtin:resize", "builtin:normalize"]
    assert len(r.stderr.splitlines()) == 4  # the three notes and the progress line
    r = cli("run", "new.toml", "--input", str(fastseq.ops.shipped.sample()), cwd=folder)
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr


def test_a_file_of_several_pipelines_reads_each_and_names_what_is_wrong(tmp_path):
    """read_all: each [pipelines.NAME] table is a pipeline, its paths relative to the file; a
    bad key names its pipeline; read() (every other command) refuses such a file by name."""

    from fastseq.graph import pipefile

    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
    )
    (tmp_path / "m").mkdir()
    onnx.save(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "m" / "r.onnx"
    )
    file = tmp_path / "serve.toml"
    file.write_text(
        '[pipelines.a.stages]\nr = "m/r.onnx"\n\n[pipelines.b]\nchain = ["p", "q"]\n'
        '[pipelines.b.stages]\np = "m/r.onnx"\nq = "m/r.onnx"\n'
    )
    specs = pipefile.read_all(file)
    assert list(specs) == ["a", "b"]
    x = np.array([[-1.0, 2.0]], np.float32)
    for spec in specs.values():
        assert fastseq.Pipeline.from_spec(spec)(x)[0].tolist() == [[0.0, 2.0]]
    with pytest.raises(fastseq.PipelineFileError, match="serve.toml: pipelines: this file names several pipelines"):
        pipefile.read(file)
    single = tmp_path / "one.toml"
    single.write_text('[stages]\nr = "m/r.onnx"\n')
    assert list(pipefile.read_all(single)) == ["one"]  # a file of one pipeline: its stem
    for text, where in (
        ("pipelines = 3\n", "pipelines: expected one [pipelines.NAME] table"),
        ("pipelines = {}\n", "pipelines: expected one [pipelines.NAME] table"),
        ('opset = 17\n[pipelines.a.stages]\nr = "m/r.onnx"\n', "opset: a file of several pipelines holds only"),
        ('[pipelines.a]\nedges = 3\n[pipelines.a.stages]\nr = "m/r.onnx"\n', "pipelines.a.edges: expected a list"),
        ("[pipelines.a]\nstagez = 1\n", "pipelines.a.stagez: not a pipeline key (did you mean 'stages'?)"),
    ):
        file.write_text(text)
        with pytest.raises(fastseq.PipelineFileError, match=re.escape(where)):
            pipefile.read_all(file)
