"""fastseq.Pipeline: graphs of real models (the torch fixtures, skl2onnx, onnx's own test
models) checked against each stage run in its own ONNX Runtime session and wired by hand;
the clean-ups, every wiring error, pipeline files, the CLI and the drawing."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import fastseq
from conftest import FIXTURES, ONNX_DATA, run, scale_model
from fastseq.graph import build as graph_build
from fastseq.graph import drawing, parse, spec

BACKBONE = str(FIXTURES / "torch_cnn_backbone.onnx")  # image [batch, 3, 32, 32] -> features [batch, 16]
HEAD = str(FIXTURES / "torch_head.onnx")  # features [batch, 16] -> logits [batch, 10]
RESIDUAL = str(FIXTURES / "torch_residual_functions.onnx")  # x [batch, 16] -> '12' (local functions)


@pytest.fixture(scope="module")
def image() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((2, 3, 32, 32)).astype(np.float32)


@pytest.fixture(scope="module")
def classifier() -> onnx.ModelProto:
    """A scikit-learn logistic regression on 16 features: X -> label, probabilities."""
    pytest.importorskip("skl2onnx")
    from skl2onnx import to_onnx
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    x = rng.standard_normal((60, 16)).astype(np.float32)
    model = LogisticRegression().fit(x, (x[:, 0] + x[:, 3] > 0).astype(np.int64))
    return to_onnx(model, x[:1], options={"zipmap": False}, target_opset={"": 17, "ai.onnx.ml": 1})


def add_model(shape=("batch", 16), dtype=TensorProto.FLOAT) -> onnx.ModelProto:
    """y = a + b: a stage with two inputs, for fan-in."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"])],
        "add",
        [helper.make_tensor_value_info(n, dtype, list(shape)) for n in ("a", "b")],
        [helper.make_tensor_value_info("y", dtype, list(shape))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def double_model() -> onnx.ModelProto:
    """y = 2x in float64: an edge from a float stage needs a Cast."""
    c = onnx.numpy_helper.from_array(np.array(2.0, np.float64), "two")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"])],
        "double",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["batch", 16])],
        [c],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def only(outputs: dict) -> np.ndarray:
    (value,) = outputs.values()
    return value


# --- graphs checked against the stages run one by one ---------------------------------------


def test_fan_out_to_a_torch_head_and_a_sklearn_classifier(image, classifier):
    pipe = fastseq.Pipeline(
        {"backbone": BACKBONE, "cls": HEAD, "skl": classifier},
        edges=["backbone.features -> cls.features", "backbone.features -> skl.X"],
        outputs=["cls.logits", "skl.probabilities", "kind=skl.label"],
    )
    logits, probabilities, label = pipe(image)
    features = only(run(BACKBONE, {"image": image}))
    ref = run(classifier, {"X": features})
    np.testing.assert_allclose(logits, only(run(HEAD, {"features": features})), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(probabilities, ref["probabilities"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(label, ref["label"])
    assert [o.name for o in pipe.outputs] == ["logits", "probabilities", "kind"]
    assert [i.name for i in pipe.inputs] == ["image"]
    assert pipe.stages == ["backbone", "cls", "skl"] and len(pipe) == 3


def test_fan_in_with_a_skip_and_stages_in_any_order(image):
    # Stages given out of order: the pipeline sorts them topologically.
    pipe = fastseq.Pipeline(
        {"head": HEAD, "join": add_model(), "res": RESIDUAL, "backbone": BACKBONE},
        edges=[
            "backbone.features -> res.x",
            "res.12 -> join.a",
            "backbone.features -> join.b",  # the skip around res
            "join.y -> head.features",
        ],
        inputs={"picture": "backbone.image"},
    )
    assert (
        pipe.stages.index("backbone") < pipe.stages.index("res") < pipe.stages.index("join") < pipe.stages.index("head")
    )
    (logits,) = pipe(picture=image)
    features = only(run(BACKBONE, {"image": image}))
    residual = only(run(RESIDUAL, {"x": features}))
    joined = only(run(add_model(), {"a": residual, "b": features}))
    np.testing.assert_allclose(logits, only(run(HEAD, {"features": joined})), rtol=1e-5, atol=1e-6)
    assert [o.name for o in pipe.outputs] == ["logits"]


def test_one_graph_input_feeds_several_stages(x_features):
    pipe = fastseq.Pipeline(
        {"a": HEAD, "b": RESIDUAL, "join": add_model()},
        edges=["b.12 -> join.a"],
        inputs={"features": ["a.features", "b.x", "join.b"]},
        outputs=["a.logits", "sum=join.y"],
    )
    assert [i.name for i in pipe.inputs] == ["features"]
    logits, total = pipe(x_features)
    np.testing.assert_allclose(logits, only(run(HEAD, {"features": x_features})), rtol=1e-5, atol=1e-6)
    residual = only(run(RESIDUAL, {"x": x_features}))
    np.testing.assert_allclose(total, residual + x_features, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def x_features() -> np.ndarray:
    return np.random.default_rng(2).standard_normal((3, 16)).astype(np.float32)


def test_unfed_inputs_are_named_by_stage_when_they_clash(x_features):
    # Both heads read 'features' and nothing feeds them: two graph inputs, named by stage.
    pipe = fastseq.Pipeline({"h1": HEAD, "h2": HEAD}, outputs=["h1.logits", "two=h2.logits"])
    assert sorted(i.name for i in pipe.inputs) == ["h1.features", "h2.features"]
    one, two = pipe(**{"h1.features": x_features, "h2.features": 2 * x_features})
    np.testing.assert_allclose(two, only(run(HEAD, {"features": 2 * x_features})), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(one, only(run(HEAD, {"features": x_features})), rtol=1e-5, atol=1e-6)


def test_onnx_test_models_sharing_inputs():
    """Two of onnx's own test models (IR 3, opset 6, numeric names that clash) reading the
    same graph input, one of them through both of its inputs; converted to opset 13 (ONNX
    Runtime has no Gemm-6 kernel), the reference converted by onnx.version_converter."""
    from onnx import version_converter

    ops = ONNX_DATA / "pytorch-operator"
    mm, cat = (str(ops / f"test_operator_{n}" / "model.onnx") for n in ("mm", "concat2"))
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3), (3, 4)))
    pipe = fastseq.Pipeline(
        {"mm": mm, "cat": cat},
        inputs={"a": ["mm.0", "cat.0", "cat.1"]},
        outputs=["product=mm.3", "pair=cat.2"],
        opset=13,
    )
    assert [i.name for i in pipe.inputs] == ["a", "1"]  # mm's unfed input keeps its own name
    product, pair = pipe(a=a, **{"1": b})
    mm13, cat13 = (version_converter.convert_version(onnx.load(m), 13) for m in (mm, cat))
    np.testing.assert_allclose(product, only(run(mm13, {"0": a, "1": b})), rtol=1e-6)
    np.testing.assert_allclose(pair, only(run(cat13, {"0": a, "1": a})), rtol=1e-6)
    assert dict(pipe.summary()["opsets"])[""] == 13


# --- clean-ups --------------------------------------------------------------------------------


def test_a_stage_that_no_output_needs_is_pruned(image):
    with pytest.warns(UserWarning, match=r"res\.12 never used"):
        pipe = fastseq.Pipeline(
            {"backbone": BACKBONE, "cls": HEAD, "res": RESIDUAL},
            edges=["backbone.features -> cls.features", "backbone.features -> res.x"],
            outputs=["cls.logits"],
        )
    report = pipe.report()
    assert report["pruned"]["stages"] == ["res"]
    assert report["pruned"]["nodes"] >= 1
    full = fastseq.Pipeline(
        {"backbone": BACKBONE, "cls": HEAD, "res": RESIDUAL},
        edges=["backbone.features -> cls.features", "backbone.features -> res.x"],
        outputs=["cls.logits", "res.12"],
    )
    assert pipe.summary()["nodes"] < full.summary()["nodes"]
    np.testing.assert_allclose(pipe(image)[0], full(image)[0], rtol=1e-6)
    # The picture greys the pruned stage.
    stage_line = next(line for line in pipe.to_dot().splitlines() if line.startswith('  "res" ['))
    assert "dashed" in stage_line and "(pruned)" in stage_line


def test_an_unused_output_is_a_warning_naming_it():
    with pytest.warns(UserWarning, match=r"res\.12 never used and not exported"):
        fastseq.Pipeline(
            {"cls": HEAD, "res": RESIDUAL}, inputs={"features": ["cls.features", "res.x"]}, outputs=["cls.logits"]
        )


def test_identical_weights_are_stored_once(x_features):
    edges = ["backbone.features -> a.features", "backbone.features -> b.features"]
    stages = {"backbone": BACKBONE, "a": HEAD, "b": HEAD}
    deduped = fastseq.Pipeline(stages, edges, outputs=["a.logits", "second=b.logits"])
    copies = fastseq.Pipeline(stages, edges, outputs=["a.logits", "second=b.logits"], dedupe=False)
    head_bytes = fastseq._core.load_model(HEAD).summary()["weight_bytes"]
    report = deduped.report()
    assert report["deduped_bytes"] == head_bytes and report["deduped_initializers"] >= 2
    assert copies.report()["deduped_bytes"] == 0
    assert copies.summary()["weight_bytes"] - deduped.summary()["weight_bytes"] == head_bytes
    image = np.random.default_rng(4).standard_normal((1, 3, 32, 32)).astype(np.float32)
    for got, want in zip(deduped(image), copies(image)):
        np.testing.assert_array_equal(got, want)


def test_symbolic_dims_are_unified_and_static_sizes_must_agree():
    pipe = fastseq.Pipeline({"backbone": BACKBONE, "cls": HEAD}, ["backbone.features -> cls.features"])
    (image,) = pipe.inputs
    (logits,) = pipe.outputs
    assert image.shape[0] == logits.shape[0] == "batch"
    with pytest.raises(
        fastseq.CompositionError,
        match=r"edge 0 \(a\.y -> b\.x\): shape mismatch: output 'y' has shape \[2, 4\] but input 'x' expects \[3, 4\]",
    ):
        fastseq.Pipeline({"a": scale_model(1.0, shape=(2, 4)), "b": scale_model(1.0, shape=(3, 4))}, ["a.y -> b.x"])


def test_an_adapter_casts_where_asked_and_is_suggested_otherwise(x_features):
    stages = {"res": RESIDUAL, "twice": double_model()}
    with pytest.raises(
        fastseq.CompositionError,
        match=r"edge 0 \(res\.12 -> twice\.x\): element type mismatch.*"
        r"pass adapt=True .* to insert a Cast to double",
    ):
        fastseq.Pipeline(stages, ["res.12 -> twice.x"])
    for adapt in (True, [0], ["res.12 -> twice.x"]):
        pipe = fastseq.Pipeline(stages, ["res.12 -> twice.x"], adapt=adapt)
        (y,) = pipe(x_features)
        assert y.dtype == np.float64
        residual = only(run(RESIDUAL, {"x": x_features}))
        np.testing.assert_allclose(y, 2 * residual.astype(np.float64), rtol=1e-6)
        assert pipe.report()["adapters"] and pipe.report()["adapters"][0][0] == 0


# --- errors -----------------------------------------------------------------------------------


def test_a_cycle_is_refused_naming_the_loop():
    with pytest.raises(fastseq.CompositionError, match=r"cycle: a -> b -> a"):
        fastseq.Pipeline({"a": scale_model(1.0), "b": scale_model(2.0)}, ["a.y -> b.x", "b.y -> a.x"])
    with pytest.raises(fastseq.CompositionError, match=r"cycle: a -> a"):
        fastseq.Pipeline({"a": add_model()}, ["a.y -> a.b"])


@pytest.mark.parametrize(
    "edges, inputs, outputs, message",
    [
        (
            ["backbone.features -> clss.features"],
            None,
            None,
            r"edges\[0\]: 'clss\.features': no stage named 'clss' \(did you mean 'cls'\?\)",
        ),
        (
            ["backbone.feature -> cls.features"],
            None,
            None,
            r"edges\[0\]: 'backbone\.feature' is not an output of backbone \(did you mean 'features'\?\)",
        ),
        (
            ["backbone.features -> cls.feature"],
            None,
            None,
            r"'cls\.feature' is not an input of cls \(did you mean 'features'\?\)",
        ),
        (["backbone.features cls.features"], None, None, r"expected 'stage\.output -> stage\.input'"),
        (
            ["backbone.features -> cls.features", "backbone.features -> cls.features"],
            None,
            None,
            r"edges\[1\]: 'cls\.features' is fed twice: by edges\[0\]",
        ),
        (
            ["backbone.features -> cls.features"],
            {"f": "cls.features"},
            None,
            r"inputs\.f\[0\]: 'cls\.features' is fed twice: by edges\[0\]",
        ),
        (
            ["backbone.features -> cls.features"],
            None,
            ["cls.logit"],
            r"outputs\[0\]: 'cls\.logit' is not an output of cls \(did you mean 'logits'\?\)",
        ),
        (
            ["backbone.features -> cls.features"],
            None,
            ["cls.logits", "logits=backbone.features"],
            r"outputs\[1\]: the output name 'logits' is taken by outputs\[0\]",
        ),
        (["backbone.features -> cls.features"], None, ["logits"], r"outputs\[0\]: 'logits': expected 'stage\.name'"),
        (
            ["backbone.features -> cls.features"],
            {"logits": "backbone.image"},
            None,
            r"'logits' is both a graph input and a graph output",
        ),
    ],
)
def test_wiring_errors_name_the_key_and_the_near_miss(edges, inputs, outputs, message):
    with pytest.raises(fastseq.CompositionError, match=message):
        fastseq.Pipeline({"backbone": BACKBONE, "cls": HEAD}, edges, inputs, outputs)


def test_argument_errors():
    with pytest.raises(TypeError, match="non-empty dict"):
        fastseq.Pipeline({})
    with pytest.raises(TypeError, match="list of"):
        fastseq.Pipeline({"a": HEAD}, "a.logits -> a.features")
    with pytest.raises(fastseq.CompositionError, match="may not contain '->'"):
        fastseq.Pipeline({"a->b": HEAD})
    with pytest.raises(
        fastseq.CompositionError, match=r"stages\.a: 'sorce' is not a stage key \(did you mean 'source'\?\)"
    ):
        fastseq.Pipeline({"a": {"sorce": HEAD}})
    with pytest.raises(fastseq.CompositionError, match=r"adapt\[0\]: there is no edge 3"):
        fastseq.Pipeline({"a": HEAD}, adapt=[3])
    with pytest.raises(fastseq.LoadError, match="sha256 mismatch"):
        fastseq.Pipeline({"a": {"source": HEAD, "sha256": "0" * 64}})


def test_dotted_names_split_after_the_longest_known_stage():
    stages = ["det", "det.v2", "cls"]
    assert parse.parse_edge("det.v2.boxes.0 -> cls.in.x", stages, "") == spec.Edge("det.v2", "boxes.0", "cls", "in.x")
    assert parse.parse_edge(" det.out -> cls.x ", stages, "") == spec.Edge("det", "out", "cls", "x")
    assert parse.parse_edge((("det", "a.b"), ("cls", "c")), stages, "") == spec.Edge("det", "a.b", "cls", "c")
    outputs = parse.parse_outputs(["cls.best=cls.p.0", "det.v2.boxes", "det.a=b"], stages, parse._Where(None))
    assert outputs == [
        spec.Exposed("cls.best", "cls", "p.0"),
        spec.Exposed("boxes", "det.v2", "boxes"),
        spec.Exposed("a=b", "det", "a=b"),
    ]


# --- pickling, pipeline files, the command line, the picture ---------------------------------


def test_pickling_keeps_the_graph_and_its_picture(x_features):
    pipe = fastseq.Pipeline(
        {"a": HEAD, "b": RESIDUAL},
        inputs={"features": ["a.features", "b.x"]},
        session_options={"intra_op_num_threads": 1},
    )
    clone = pickle.loads(pickle.dumps(pipe))
    for got, want in zip(clone(x_features), pipe(x_features)):
        np.testing.assert_array_equal(got, want)
    assert clone.to_dot() == pipe.to_dot() and clone.stages == pipe.stages


def test_pipeline_file_round_trip_and_relative_paths(tmp_path, image, classifier):
    models = tmp_path / "models"
    models.mkdir()
    onnx.save(onnx.load(BACKBONE), models / "backbone.onnx")
    onnx.save(onnx.load(HEAD), models / "head.onnx")
    pipe = fastseq.Pipeline(
        {"backbone": str(models / "backbone.onnx"), "cls": str(models / "head.onnx"), "skl": classifier},
        edges=["backbone.features -> cls.features", "backbone.features -> skl.X"],
        inputs={"image": "backbone.image"},
        outputs=["cls.logits", "p=skl.probabilities", "kind=skl.label"],
        providers=["CPUExecutionProvider"],
        session_options={
            "intra_op_num_threads": 1,
            "graph_optimization_level": "extended",
            "session.disable_prepacking": "1",
        },
        metadata={"doc_string": 'a "quoted"\nstring'},
    )
    written = pipe.to_file(tmp_path / "pipeline.toml")
    text = written.read_text()
    assert 'backbone = "models/backbone.onnx"' in text  # relative to the file
    assert 'skl = "pipeline.skl.onnx"' in text and (tmp_path / "pipeline.skl.onnx").exists()
    back = fastseq.Pipeline.from_file(written)  # from any working directory
    assert back.spec.edges == pipe.spec.edges and back.spec.outputs == pipe.spec.outputs
    assert back.spec.inputs == pipe.spec.inputs and back.spec.metadata == pipe.spec.metadata
    assert back.spec.session_options == pipe.spec.session_options
    assert back.model.doc_string == 'a "quoted"\nstring'
    for got, want in zip(back(image), pipe(image)):
        np.testing.assert_array_equal(got, want)
    again = back.to_file(tmp_path / "again.toml")
    assert again.read_text().replace("again.skl", "pipeline.skl") == text


def test_pipeline_file_errors_name_the_file_and_the_key(tmp_path):
    onnx.save(onnx.load(BACKBONE), tmp_path / "backbone.onnx")
    onnx.save(onnx.load(HEAD), tmp_path / "head.onnx")
    f = tmp_path / "pipeline.toml"

    def error(text: str, kind=fastseq.FastseqError) -> str:
        f.write_text(text)
        with pytest.raises(kind) as e:
            fastseq.Pipeline.from_file(f)
        return str(e.value)

    stages = '[stages]\nbackbone = "backbone.onnx"\ncls = "head.onnx"\n'
    msg = error(
        'edges = ["backbone.features -> cls.features", "backbone.features -> cls.x", '
        '"backbone.feature -> cls.x"]\n' + stages
    )
    assert msg == (f"{f}: edges[1]: 'cls.x' is not an input of cls")
    msg = error('edges = ["backbone.feature -> cls.features"]\n' + stages)
    assert msg == f"{f}: edges[0]: 'backbone.feature' is not an output of backbone (did you mean 'features'?)"
    assert error("edges = [\n" + stages, fastseq.LoadError).startswith(f"{f}: not valid TOML")
    assert error("edgs = []\n" + stages, fastseq.LoadError) == f"{f}: edgs: not a pipeline key (did you mean 'edges'?)"
    assert "stages: a [stages] table" in error("edges = []\n", fastseq.LoadError)
    msg = error('[stages]\na = "missing.onnx"\n', fastseq.LoadError)
    assert msg.startswith(f"{f}: stages.a: ") and "missing.onnx: no such file" in msg
    msg = error(stages + "[session_options]\nintra_op_threads = 2\n", fastseq.LoadError)
    assert msg.startswith(f"{f}: session_options: 'intra_op_threads' is not a session option")
    assert "did you mean 'intra_op_num_threads'" in msg
    # A core error (a type mismatch at an edge) names the file too.
    onnx.save(double_model(), tmp_path / "double.onnx")
    msg = error(
        'edges = ["backbone.features -> d.x"]\n[stages]\nbackbone = "backbone.onnx"\nd = "double.onnx"\n',
        fastseq.CompositionError,
    )
    assert msg.startswith(f"{f}: ") and "adapt" in msg


def fastseq_cli(*args: str, cwd=None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fastseq", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def test_cli_merges_runs_and_inspects_a_pipeline_file(tmp_path, image):
    onnx.save(onnx.load(BACKBONE), tmp_path / "backbone.onnx")
    onnx.save(onnx.load(HEAD), tmp_path / "head.onnx")
    onnx.save(onnx.load(RESIDUAL), tmp_path / "res.onnx")
    (tmp_path / "pipeline.toml").write_text(
        'edges = ["backbone.features -> cls.features", "backbone.features -> res.x"]\n'
        'outputs = ["cls.logits"]\n'
        "[stages]\n"
        'backbone = "backbone.onnx"\ncls = "head.onnx"\nres = "res.onnx"\n'
        "[inputs]\n"
        'image = ["backbone.image"]\n'
    )
    r = fastseq_cli("merge", "pipeline.toml", "-o", "out.onnx", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "wrote out.onnx" in r.stdout and "pruned: 1 stage(s) (res)" in r.stdout
    features = only(run(BACKBONE, {"image": image}))
    want = only(run(HEAD, {"features": features}))
    np.testing.assert_allclose(only(run(tmp_path / "out.onnx", {"image": image})), want, rtol=1e-5, atol=1e-6)

    np.save(tmp_path / "x.npy", image)
    r = fastseq_cli("run", "pipeline.toml", "--input", "image=x.npy", "-o", "out.npz", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "logits: float32[2, 10]" in r.stdout
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["logits"], want, rtol=1e-5, atol=1e-6)

    r = fastseq_cli("inspect", "pipeline.toml", "--dot", "p.dot", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "3 stages, 2 edges" in r.stdout and "res: res.onnx (pruned)" in r.stdout
    assert "pruned: 1 stage(s) (res)" in r.stdout and "  image: float32[batch, 3, 32, 32]" in r.stdout
    assert set(parse_dot((tmp_path / "p.dot").read_text())[0]) >= {"backbone", "cls", "res"}
    r = fastseq_cli("inspect", "pipeline.toml", "--svg", "p.svg", cwd=tmp_path)
    if drawing.have_dot():
        assert r.returncode == 0 and (tmp_path / "p.svg").read_text().lstrip().startswith(("<?xml", "<svg"))
    else:
        assert r.returncode == 1 and "Graphviz" in r.stderr

    (tmp_path / "bad.toml").write_text(
        'edges = ["backbone.feature -> cls.features"]\n[stages]\nbackbone = "backbone.onnx"\ncls = "head.onnx"\n'
    )
    r = fastseq_cli("merge", "bad.toml", "-o", "bad.onnx", cwd=tmp_path)
    assert r.returncode == 1 and not (tmp_path / "bad.onnx").exists()
    assert r.stderr.strip().splitlines()[-1] == (
        "fastseq: error: bad.toml: edges[0]: 'backbone.feature' is not an output of backbone (did you mean 'features'?)"
    )


_NODE = re.compile(r'^  "((?:[^"\\]|\\.)*)" \[(.*)\];$')
_EDGE = re.compile(r'^  "((?:[^"\\]|\\.)*)"(?::(\w+))? -> "((?:[^"\\]|\\.)*)"(?::(\w+))?(?: \[(.*)\])?;$')


def parse_dot(text: str) -> tuple[dict[str, str], list[tuple[str, str, str]]]:
    """Node ids with their attributes, and (from, to, attributes) edges, from our DOT text."""
    nodes, edges = {}, []
    for line in text.splitlines():
        if m := _EDGE.match(line):
            edges.append((m[1], m[3], m[5] or ""))
        elif m := _NODE.match(line):
            nodes[m[1]] = m[2]
    return nodes, edges


def test_the_drawing_names_every_stage_edge_input_and_output(classifier):
    with pytest.warns(UserWarning, match=r"skl\.label, res\.12 never used"):
        pipe = fastseq.Pipeline(
            {"backbone": BACKBONE, "cls": HEAD, "skl": classifier, "res": RESIDUAL},
            edges=["backbone.features -> cls.features", "backbone.features -> skl.X", "backbone.features -> res.x"],
            outputs=["cls.logits", "p=skl.probabilities"],
        )
    text = pipe.to_dot()
    assert text.startswith('digraph "pipeline" {') and text.rstrip().endswith("}")
    nodes, edges = parse_dot(text)
    assert {"backbone", "cls", "skl", "res", "in:image", "out:logits", "out:p"} == set(nodes)
    stage_edges = [(a, b, attrs) for a, b, attrs in edges if a in pipe.stages and b in pipe.stages]
    assert sorted((a, b) for a, b, _ in stage_edges) == [("backbone", "cls"), ("backbone", "res"), ("backbone", "skl")]
    for _, _, attrs in stage_edges:
        assert 'label="features: float32[batch, 16]"' in attrs and 'tooltip="backbone.features -> ' in attrs
    assert ("in:image", "backbone", "") in edges and ("cls", "out:logits", 'label="float32[batch, 10]"') in edges
    # Each stage box lists its inputs and outputs with dtypes and shapes; the pruned one is grey.
    assert (
        "image: float32[batch, 3, 32, 32]" in nodes["backbone"] and "features: float32[batch, 16]" in nodes["backbone"]
    )
    assert "probabilities: float32[" in nodes["skl"] and "X: float32[" in nodes["skl"]
    assert "(pruned)" in nodes["res"] and "(pruned)" not in nodes["cls"]
    if drawing.have_dot():
        assert "<svg" in pipe._repr_svg_()
    else:
        assert pipe._repr_svg_() is None
        with pytest.raises(fastseq.ExportError, match="Graphviz"):
            pipe.to_svg()


_PORT = re.compile(r'PORT="([io]\d+)"[^>]*>([^<]*?): ')
_EDGE_PORTS = re.compile(r'^  "((?:[^"\\]|\\.)*)"(?::(\w+))? -> "((?:[^"\\]|\\.)*)"(?::(\w+))?')


def drawn_ports(text: str) -> tuple[list[tuple[str, list[tuple[str, str]]]], list[tuple[str, str, str]]]:
    """The graph inputs the drawing shows, each with the (stage, input) ports it points at,
    and its graph outputs with the (stage, output) port each comes from, in drawing order."""
    nodes, _ = parse_dot(text)
    names = {(stage, port): name for stage, attrs in nodes.items() for port, name in _PORT.findall(attrs)}
    inputs: dict[str, list[tuple[str, str]]] = {}
    outputs: list[tuple[str, str, str]] = []
    for node in nodes:
        if node.startswith("in:"):
            inputs[node[3:]] = []
    for line in text.splitlines():
        if m := _EDGE_PORTS.match(line):
            a, a_port, b, b_port = m.groups()
            if a.startswith("in:"):
                inputs[a[3:]].append((b, names[b, b_port]))
            elif b.startswith("out:"):
                outputs.append((b[4:], a, names[a, a_port]))
    return list(inputs.items()), outputs


def two_inputs(a: str, b: str) -> onnx.ModelProto:
    """y = a + b over [2, 4] floats, its inputs named as asked."""
    graph = helper.make_graph(
        [helper.make_node("Add", [a, b], ["y"])],
        "two_inputs",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 4]) for n in (a, b)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize(
    "case",
    ["input named like another stage's", "shared input", "two heads", "pruned stage", "adapter"],
)
def test_the_drawing_shows_exactly_the_inputs_and_outputs_the_model_has(case):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the pruned stage's unused output
        pipe = {
            # a(x, z) and b(x), a graph input called 'a.x' feeding a.z: a's own x is
            # exposed as 'a.x_1' (the drawing used to show 'a.x' twice).
            "input named like another stage's": lambda: fastseq.Pipeline(
                {"a": two_inputs("x", "z"), "b": scale_model(1.0)},
                inputs={"a.x": ["a.z"]},
                outputs=["a.y", "b.y"],  # side by side, as the outputs say
            ),
            "shared input": lambda: fastseq.Pipeline(
                {"a": HEAD, "b": RESIDUAL}, inputs={"features": ["a.features", "b.x"]}
            ),
            "two heads": lambda: fastseq.Pipeline(
                {"cls": HEAD, "aux": HEAD, "backbone": BACKBONE},
                ["backbone.features -> cls.features", "backbone.features -> aux.features"],
            ),
            "pruned stage": lambda: fastseq.Pipeline(
                {"backbone": BACKBONE, "cls": HEAD, "res": RESIDUAL},
                ["backbone.features -> cls.features", "backbone.features -> res.x"],
                outputs=["cls.logits"],
            ),
            "adapter": lambda: fastseq.Pipeline(
                {"res": RESIDUAL, "twice": double_model()}, ["res.12 -> twice.x"], adapt=True
            ),
        }[case]()
    model = onnx.ModelProto.FromString(pipe.engine.composed.to_bytes())
    drawn_inputs, drawn_outputs = drawn_ports(pipe.to_dot())
    assert [name for name, _ in drawn_inputs] == [i.name for i in model.graph.input] == [i.name for i in pipe.inputs]
    assert (
        [name for name, *_ in drawn_outputs] == [o.name for o in model.graph.output] == [o.name for o in pipe.outputs]
    )
    # Each is drawn at the stage ports the core wired it to.
    assert drawn_inputs == [(name, [tuple(t) for t in feeds]) for name, feeds in pipe._plan["inputs"]]
    assert drawn_outputs == [tuple(o) for o in pipe._plan["outputs"]]
    if case == "input named like another stage's":
        assert drawn_inputs == [("a.x", [("a", "z")]), ("a.x_1", [("a", "x")]), ("b.x", [("b", "x")])]
    if case == "two heads":
        assert pipe.stages == ["backbone", "cls", "aux"]
        assert [name for name, *_ in drawn_outputs] == ["cls.logits", "aux.logits"]
    if case == "pruned stage":
        assert pipe._plan["pruned"] == ["res"]
    if case == "adapter":
        assert pipe._plan["adapters"] == [(0, "Cast to double")]


def test_repr_and_export(tmp_path, x_features):
    pipe = fastseq.Pipeline({"a": HEAD, "b": RESIDUAL}, inputs={"features": ["a.features", "b.x"]})
    assert repr(pipe).startswith("Pipeline(stages a, b; 0 edges; inputs [features: float32[batch, 16]]")
    path = pipe.export(tmp_path / "p.onnx")
    outs = run(path, {"features": x_features})
    for got, name in zip(pipe(x_features), [o.name for o in pipe.outputs]):
        np.testing.assert_array_equal(got, outs[name])


def test_linear_entry_points_build_a_chain_description():
    chain = spec.PipelineSpec.chain([scale_model(1.0), scale_model(2.0)], [[("y", "x")]])
    assert not chain.is_graph and chain.io_maps == [[("y", "x")]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        built = graph_build.build(chain)
    assert built.plan["form"] == "chain" and built.labels == ["scale (#0)", "scale (#1)"]


def test_pipeline_file_stages_from_a_url_with_a_digest(tmp_path, monkeypatch, image):
    from servers import serve_files

    www = tmp_path / "www"
    www.mkdir()
    head = onnx.load(HEAD)
    onnx.save(head, www / "head.onnx")
    digest = __import__("hashlib").sha256((www / "head.onnx").read_bytes()).hexdigest()
    monkeypatch.setenv("FASTSEQ_CACHE", str(tmp_path / "cache"))
    server = serve_files(www)
    try:
        f = tmp_path / "pipeline.toml"
        text = (
            'edges = ["backbone.features -> cls.features"]\n[stages]\n'
            f'backbone = "{BACKBONE}"\ncls = {{ source = "{server.url}/head.onnx", sha256 = "{{}}" }}\n'
        )
        f.write_text(text.replace("{}", digest))
        pipe = fastseq.Pipeline.from_file(f)
        features = only(run(BACKBONE, {"image": image}))
        np.testing.assert_allclose(pipe(image)[0], only(run(HEAD, {"features": features})), rtol=1e-5, atol=1e-6)
        assert fastseq.Pipeline.from_file(pipe.to_file(tmp_path / "again.toml")).spec.stages == pipe.spec.stages
        f.write_text(text.replace("{}", "0" * 64))
        with pytest.raises(fastseq.DownloadError, match=rf"^{re.escape(str(f))}: stages\.cls: .*sha256"):
            fastseq.Pipeline.from_file(f)
    finally:
        server.close()


def test_the_core_orders_the_stages_keeping_the_given_order_and_finds_long_loops():
    # a(a, b) is fed by c and b but given first: the order the edges allow, the given one elsewhere.
    stages = {"a": add_model(shape=(2, 4)), "b": scale_model(1.0), "c": scale_model(2.0), "d": scale_model(3.0)}
    pipe = fastseq.Pipeline(stages, ["c.y -> a.a", "b.y -> a.b"], outputs=["a.y", "d.y"])  # d: side by side
    assert pipe.stages == ["b", "c", "a", "d"]
    assert [s["label"] for s in pipe._plan["stages"]] == ["b", "c", "a", "d"]
    assert [s["given"] for s in pipe._plan["stages"]] == [1, 2, 0, 3]
    # A chain far longer than any recursion limit, given backwards; then closed into a loop.
    names = [f"s{i}" for i in range(5000)]
    data = scale_model(1.0).SerializeToString()
    given = list(reversed(names))
    at = {n: k for k, n in enumerate(given)}
    chain = [(at[a], "y", at[b], "x") for a, b in zip(names, names[1:])]
    composed = fastseq._core.compose([data] * len(names), given, edges=chain)
    assert [s["label"] for s in composed.plan()["stages"]] == names
    at = {n: k for k, n in enumerate(names)}
    chain = [(at[a], "y", at[b], "x") for a, b in zip(names, names[1:])] + [(at["s4999"], "y", at["s0"], "x")]
    with pytest.raises(
        fastseq.CompositionError, match=r"^edges: the edges make a cycle: s0 -> s1 -> .* -> s4999 -> s0$"
    ):
        fastseq._core.compose([data] * len(names), names, edges=chain)
