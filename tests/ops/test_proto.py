"""fastseq.ops writes its models' protobuf bytes itself (no onnx import): every operator and
parameter set is built again here with onnx.helper from the same description and compared
field by field and byte for byte; every declared output shape is checked against what
ONNX Runtime computes; and a fresh process builds operators without loading onnx or numpy."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from google.protobuf.message import Message
from onnx import helper, numpy_helper

import fastseq
from fastseq import ops
from fastseq.ops import _graph, _proto

#: Every operator with each of its parameters' kinds of value: (name, args, kwargs).
VARIANTS = [
    ("to_float", (), {}),
    ("to_float", (0.5,), {"dtype": "float16", "to": "float64", "rank": 3}),
    ("to_float", (2,), {"dtype": "int32", "to": "float16"}),
    ("to_float", (1 / 255,), {"dtype": np.uint16, "to": np.dtype("float32"), "opset": 19}),
    ("layout", (), {}),
    ("layout", ("NCHW", "NHWC"), {"dtype": "uint8"}),
    ("layout", ("abc", "cab"), {"dtype": "int64"}),
    ("rgb_to_bgr", (), {}),
    ("rgb_to_bgr", (), {"layout": "NHWC", "dtype": "uint8"}),
    ("grayscale", (), {}),
    ("grayscale", (3,), {"dtype": "uint8"}),
    ("grayscale", (1,), {"layout": "NHWC", "dtype": "float16"}),
    ("grayscale", (3,), {"layout": "NHWC", "dtype": "float64"}),
    ("resize", (7,), {}),
    ("resize", ((5, 9),), {"mode": "nearest"}),
    ("resize", (6,), {"mode": "cubic", "layout": "NHWC", "dtype": "uint8"}),
    ("resize", (6,), {"mode": "cubic", "dtype": "int8"}),
    ("resize", (6,), {"mode": "bicubic", "dtype": "int32", "layout": "NHWC"}),
    ("resize", (12,), {"keep_aspect": True, "antialias": True}),
    ("resize", (12,), {"keep_aspect": "not_larger", "layout": "NHWC", "mode": "bilinear"}),
    ("resize", (6,), {"mode": "cubic", "antialias": True, "cubic_coeff": -0.75, "opset": 20}),
    ("center_crop", (4,), {}),
    ("center_crop", ((3, 5),), {"layout": "NHWC", "dtype": "uint8"}),
    ("center_crop", (20,), {"dtype": "float16", "opset": 21}),
    ("letterbox", (16,), {}),
    ("letterbox", (16, 114), {"dtype": "uint8", "layout": "NHWC"}),
    ("letterbox", (8,), {"mode": "cubic", "dtype": "int32"}),
    ("letterbox", ((8, 12), 0.5), {"antialias": True}),
    ("letterbox", (9,), {"mode": "nearest", "dtype": "int8", "fill": -3}),
    ("normalize", (), {}),
    ("normalize", (0.5, 0.25), {}),
    ("normalize", ([0.5, 0.4, 0.3], 0.2), {"dtype": "float16"}),
    ("normalize", (0.1, [0.2, 0.3]), {"layout": "NC", "dtype": "float64"}),
    ("normalize", (1, 2), {"layout": "NHWC"}),
    ("flatten", (), {}),
    ("flatten", (2,), {"rank": 3, "dtype": "int64"}),
    ("flatten", (1,), {"rank": 2}),
    ("flatten", (4,), {"rank": 4, "dtype": "uint8"}),
    ("softmax", (), {}),
    ("softmax", (1,), {"rank": 3, "dtype": "float16"}),
    ("softmax", (-3,), {"rank": 3, "dtype": "float64"}),
    ("argmax", (), {}),
    ("argmax", (0, True), {"rank": 3, "dtype": "uint8"}),
    ("argmax", (1, False), {"rank": 3, "dtype": "int64"}),
    ("topk", (3,), {}),
    ("topk", (2, 1, False), {"rank": 3, "dtype": "int32"}),
    ("topk", (1, 0), {"dtype": "float16", "opset": 18}),
    ("nms", (), {}),
    ("nms", (0.45, 0.25, 300), {"scores_layout": "NBC", "box_format": "cxcywh"}),
    ("nms", (1.0, -1.0, 1), {"opset": 22}),
]
IDS = [f"{n}{a}{k}" for n, a, k in VARIANTS]


def build_described(name, args, kwargs, monkeypatch):
    """The operator, and the description its model was written from."""
    seen = []
    model = _graph.Graph.model

    def capture(self, *a):
        seen.append((self, *a))
        return model(self, *a)

    monkeypatch.setattr(_graph.Graph, "model", capture)
    op = ops.build(name, *args, **kwargs)
    (described,) = seen
    return op, described


def with_onnx_helper(graph, call, inputs, outputs, version) -> onnx.ModelProto:
    """The same model as onnx.helper and numpy_helper build it."""

    def elem(dtype: str) -> int:
        return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))

    nodes = [helper.make_node(t, i, o, name=n, **a) for t, i, o, n, a in graph.nodes]
    constants = [numpy_helper.from_array(np.array(v, d).reshape(s), n) for n, d, s, v in graph.constants]
    g = helper.make_graph(
        nodes,
        graph.op,
        [helper.make_tensor_value_info(t.name, elem(t.dtype), list(t.shape)) for t in inputs],
        [helper.make_tensor_value_info(t.name, elem(t.dtype), list(t.shape)) for t in outputs],
        constants,
    )
    opsets = [helper.make_opsetid("", version)]
    model = helper.make_model(
        g,
        opset_imports=opsets,
        ir_version=helper.find_min_ir_version_for(opsets),
        producer_name="fastseq.ops",
        producer_version=fastseq.__version__,
    )
    model.doc_string = call
    return model


def differences(a: Message, b: Message, path: str = "model") -> list[str]:
    """Every field (by path) where two messages differ: set or not, value, list length."""
    out = []
    for field in a.DESCRIPTOR.fields:
        name = field.name
        where = f"{path}.{name}"
        if field.is_repeated:
            x, y = list(getattr(a, name)), list(getattr(b, name))
            if len(x) != len(y):
                out.append(f"{where}: {len(x)} items against {len(y)}")
            elif field.message_type is not None:
                for i, (p, q) in enumerate(zip(x, y)):
                    out += differences(p, q, f"{where}[{i}]")
            elif x != y:
                out.append(f"{where}: {x} against {y}")
            continue
        if field.has_presence and a.HasField(name) != b.HasField(name):
            out.append(f"{where}: set in {'ours' if a.HasField(name) else 'onnx.helper'} only")
        elif field.has_presence and not a.HasField(name):
            continue
        elif field.message_type is not None:
            out += differences(getattr(a, name), getattr(b, name), where)
        elif getattr(a, name) != getattr(b, name):
            out.append(f"{where}: {getattr(a, name)!r} against {getattr(b, name)!r}")
    return out


@pytest.mark.parametrize("name, args, kwargs", VARIANTS, ids=IDS)
def test_written_bytes_equal_onnx_helpers_model(name, args, kwargs, monkeypatch):
    op, described = build_described(name, args, kwargs, monkeypatch)
    reference = with_onnx_helper(*described)
    ours = onnx.ModelProto.FromString(bytes(op))
    assert differences(ours, reference) == []
    assert ours == reference
    assert bytes(op) == reference.SerializeToString()
    onnx.checker.check_model(op, full_check=True)


def test_the_comparison_names_the_field_that_differs():
    ours = ops.softmax().to_onnx()
    other = ops.softmax().to_onnx()
    other.graph.node[0].attribute[0].i = 0
    other.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 4
    del other.opset_import[:]
    assert differences(ours, other) == [
        "model.opset_import: 1 items against 0",
        "model.graph.node[0].attribute[0].i: -1 against 0",
        "model.graph.output[0].type.tensor_type.shape.dim[1].dim_value: set in onnx.helper only",
        "model.graph.output[0].type.tensor_type.shape.dim[1].dim_param: set in ours only",
    ]


def test_every_operator_is_among_the_variants():
    assert {n for n, _, _ in VARIANTS} == set(ops.names())


def test_ir_versions_are_onnx_helpers():
    for version, ir in _graph.IR_FOR_OPSET.items():
        assert ir == helper.find_min_ir_version_for([helper.make_opsetid("", version)]), version
    assert _graph.LATEST_OPSET <= onnx.defs.onnx_opset_version()


def test_the_encoder_on_edge_values():
    """Negative and large ints, float attributes, scalars with an empty shape, and every
    element type a constant can have, against onnx.helper."""
    for value in [0, -1, -(2**63), 2**63 - 1, 300, [0, -2, 2**40], -0.75, 1e-30, "half_pixel", ""]:
        ours = onnx.AttributeProto.FromString(_proto.attribute("a", value))
        assert ours == helper.make_attribute("a", value), value
    for dtype in _proto.PACK:
        values = [0, 1, 0, 1] if dtype == "bool" else [0, 1, 2, 100]
        ours = onnx.TensorProto.FromString(_proto.tensor("t", dtype, [2, 2], values))
        assert ours == numpy_helper.from_array(np.array(values, dtype).reshape(2, 2), "t"), dtype
    scalar = onnx.ValueInfoProto.FromString(_proto.value_info("s", 1, []))
    assert scalar == helper.make_tensor_value_info("s", 1, [])
    assert scalar.type.tensor_type.HasField("shape")
    with pytest.raises(TypeError, match="unsupported"):
        _proto.attribute("a", [0.5])


def test_operators_read_like_model_protos():
    op = ops.topk(5)
    assert isinstance(op, ops.Operator)
    assert [n.op_type for n in op.graph.node] == ["TopK"]
    assert op.opset_import[0].version == 17 and op.ir_version == 8
    assert op.to_onnx().SerializeToString() == op.SerializeToString() == bytes(op)
    assert op.inputs == (ops.Tensor("input", "float32", ("N", "d1")),)
    assert [str(t) for t in op.outputs] == ["values: float32[N, 5]", "indices: int64[N, 5]"]
    assert repr(op) == (
        "<Operator fastseq.ops.topk(k=5, axis=-1, largest=True, dtype='float32', rank=2): "
        "input: float32[N, d1] -> values: float32[N, 5], indices: int64[N, 5]>"
    )
    copy = pickle.loads(pickle.dumps(op))
    assert copy == op and hash(copy) == hash(op) and copy.outputs == op.outputs
    # A view: editing what it reads changes nothing; to_onnx() is the editable copy.
    op.graph.name = "edited"
    assert op.graph.name == "topk"
    session = ort.InferenceSession(op.SerializeToString(), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["values", "indices"]
    with pytest.raises(AttributeError):
        op._missing  # noqa: B018
    with pytest.raises(TypeError, match="sequence of models"):
        fastseq.compose(op)


def test_operators_go_wherever_a_model_goes(tmp_path):
    x = np.random.default_rng(0).random((3, 10), np.float32)
    expected = np.exp(x) / np.exp(x).sum(1, keepdims=True)
    for run in (
        lambda: fastseq.ONNXSequential(ops.softmax())(x)[0],
        lambda: fastseq.ONNXModule(ops.softmax())(x)[0],
        lambda: fastseq.Pipeline({"s": ops.softmax()})(x)[0],
        lambda: run_proto(fastseq.compose([ops.softmax(), ops.topk(2)]), x)[1],
        lambda: run_proto(fastseq.merge_models(ops.softmax(), ops.topk(2), [("probabilities", "input")]), x)[1],
    ):
        got = run()
        if got.dtype == np.int64:
            np.testing.assert_array_equal(got, np.argsort(-x, 1)[:, :2])
        else:
            np.testing.assert_allclose(got, expected, rtol=1e-5)
    # A pipeline file writes an operator stage beside itself, and reads it back.
    pipe = fastseq.Pipeline({"s": ops.softmax()})
    pipe.to_file(tmp_path / "p.toml")
    np.testing.assert_allclose(fastseq.Pipeline.from_file(tmp_path / "p.toml")(x)[0], expected, rtol=1e-5)


def run_proto(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})


# --- declared shapes -------------------------------------------------------------------

#: Sizes for the symbolic dims operators declare: a channel axis is 3 (RGB), boxes are 4
#: per row; anything else gets a size of its own.
SIZES = {"N": 2, "C": 3, "H": 11, "W": 7, "B": 5, "boxes": 6, "classes": 3}


def feed(t: ops.Tensor, bound: dict[str, int], rng) -> np.ndarray:
    shape = []
    for d in t.shape:
        if isinstance(d, int):
            shape.append(d)
        else:
            bound.setdefault(d, SIZES.get(d, 4 + len(bound)))
            shape.append(bound[d])
    if t.name == "boxes":
        xy = rng.random((*shape[:-1], 2), np.float32) * 10
        return np.concatenate([xy, xy + 1 + rng.random((*shape[:-1], 2), np.float32)], -1)
    if t.dtype in ("float16", "float32", "float64"):
        return rng.random(shape).astype(t.dtype)
    return rng.integers(0, 100, shape).astype(t.dtype)


def size_of(dim: int | str, bound: dict[str, int]) -> int | None:
    """A declared dim's size: a number, a bound name, a product of bound names, or None
    for a name the inputs do not fix (bound on first sight, by the caller)."""
    if isinstance(dim, int):
        return dim
    if "*" in dim:
        return int(np.prod([bound[f] for f in dim.split("*")]))
    return bound.get(dim)


@pytest.mark.parametrize("name, args, kwargs", VARIANTS, ids=IDS)
def test_declared_output_shapes_are_what_onnxruntime_computes(name, args, kwargs):
    op = ops.build(name, *args, **kwargs)
    rng = np.random.default_rng(0)
    bound: dict[str, int] = {}
    feeds = {t.name: feed(t, bound, rng) for t in op.inputs}
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(bytes(op), options, providers=["CPUExecutionProvider"])
    results = session.run(None, feeds)
    assert [o.name for o in session.get_outputs()] == [t.name for t in op.outputs]
    for t, value in zip(op.outputs, results):
        assert value.dtype == np.dtype(t.dtype), t
        assert len(value.shape) == len(t.shape), (t, value.shape)
        for dim, actual in zip(t.shape, value.shape):
            expected = size_of(dim, bound)
            if expected is None:  # a size the operator computes (selected boxes, resized sides)
                bound[dim] = actual
            else:
                assert actual == expected, (t, dim, value.shape, bound)
    # What the session reports is what the operator declares.
    for t, info in zip([*op.inputs, *op.outputs], [*session.get_inputs(), *session.get_outputs()]):
        assert tuple(info.shape) == t.shape


def test_a_fresh_process_builds_operators_without_onnx_or_numpy():
    code = (
        "import sys, fastseq\n"
        "from fastseq import ops\n"
        "ops.resize(224); ops.normalize(); ops.nms(); ops.from_string('to_float?scale=1/255')\n"
        "ops.grayscale(3, dtype='uint8'); ops.letterbox(64, 114, dtype='uint8')\n"
        "print(sorted(m for m in ('onnx', 'numpy', 'inspect', 'onnxruntime') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_dir_shows_operators_and_public_names():
    names = dir(ops)
    assert "resize" in names and "Operator" in names and "OperatorError" in names
    assert not {"Any", "Callable", "Sequence", "TYPE_CHECKING", "annotations"} & set(names)
    assert names == sorted(ops.__all__)


# --- shapes through pipelines -----------------------------------------------------------


def classifier(path, classes: int = 1000, batch: str = "batch") -> None:
    """A resnet18-like stand-in: images float32 [batch, 3, 224, 224] -> logits [batch, classes]."""
    weight = np.random.default_rng(0).random((classes, 3), np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", ["image"], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["flat"]),
            helper.make_node("Gemm", ["flat", "w"], ["logits"], transB=1),
        ],
        "classifier",
        [helper.make_tensor_value_info("image", onnx.TensorProto.FLOAT, [batch, 3, 224, 224])],
        [helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [batch, classes])],
        [numpy_helper.from_array(weight, "w")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


def cli(*args, cwd) -> str:
    r = subprocess.run([sys.executable, "-m", "fastseq", *args], capture_output=True, text=True, cwd=cwd, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_the_command_line_keeps_static_sizes_through_builtin_operators(tmp_path):
    classifier(tmp_path / "resnet18.onnx")
    cli("merge", "resnet18.onnx", "builtin:softmax", "-o", "m.onnx", cwd=tmp_path)
    assert "  probabilities: float32[batch, 1000]\n" in cli("inspect", "m.onnx", cwd=tmp_path)
    cli("merge", "resnet18.onnx", "builtin:softmax", "builtin:topk?k=5", "-o", "t.onnx", cwd=tmp_path)
    shown = cli("inspect", "t.onnx", cwd=tmp_path)
    assert "  values: float32[batch, 5]\n  indices: int64[batch, 5]\n" in shown
    # Before the model: the operators' symbolic sizes take the model's static ones.
    stages = ["builtin:to_float?", "builtin:layout?src=NHWC&dst=NCHW", "resnet18.onnx"]
    cli("merge", *stages, "-o", "pre.onnx", cwd=tmp_path)
    assert "  input: uint8[N, 224, 224, 3]\n" in cli("inspect", "pre.onnx", cwd=tmp_path)


def test_every_way_of_naming_an_operator_gives_the_same_shapes(tmp_path):
    classifier(tmp_path / "resnet18.onnx", classes=10, batch="N")
    want = [("values", "float32", ["N", 3]), ("indices", "int64", ["N", 3])]
    via_ops = fastseq.compose([str(tmp_path / "resnet18.onnx"), ops.softmax(), ops.topk(3)])
    via_strings = fastseq.compose([str(tmp_path / "resnet18.onnx"), "builtin:softmax", "builtin:topk?k=3"])
    (tmp_path / "p.toml").write_text(
        'edges = ["net.logits -> soft.input", "soft.probabilities -> top.input"]\n'
        '[stages]\nnet = "resnet18.onnx"\nsoft = "builtin:softmax"\ntop = "builtin:topk?k=3"\n'
    )
    via_file = fastseq.Pipeline.from_file(tmp_path / "p.toml")
    for model in (via_ops, via_strings):
        got = [
            (o.name, o.type.tensor_type.elem_type, [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim])
            for o in model.graph.output
        ]
        assert got == [(n, helper.np_dtype_to_tensor_dtype(np.dtype(t)), s) for n, t, s in want]
    assert [(o.name, str(o.dtype), list(o.shape)) for o in via_file.outputs] == want
    sequential = fastseq.ONNXSequential(str(tmp_path / "resnet18.onnx"), "builtin:softmax", ops.topk(3))
    assert [(o.name, str(o.dtype), list(o.shape)) for o in sequential.outputs] == want


def test_flatten_gives_the_feature_count_and_the_demo_has_no_made_up_names():
    from fastseq.cli import DEMO

    pipe = fastseq.compose([ops.grayscale(), ops.resize(8), ops.flatten()])
    assert [d.dim_param or d.dim_value for d in pipe.graph.output[0].type.tensor_type.shape.dim] == ["N", 64]
    io_maps = [[("output", "input")]] * 6 + [[("logits", "input")], [("probabilities", "input")]]
    demo = fastseq.ONNXSequential(*DEMO, io_maps=io_maps, keep_outputs=["probabilities"])
    text = repr(demo)
    assert "unk__" not in text
    assert "inputs [input: uint8[N, d1, d2, 3]]; outputs [probabilities: float32[N, 10]; indices: int64[N]]" in text
