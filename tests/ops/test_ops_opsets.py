"""fastseq.ops at opsets 11 and 12 as at 13 and later (issue 41): every operator and variant
built at each, written as onnx.helper writes it, checked by onnx's full check at that opset,
run by ONNX Runtime against numpy and against the default build; what cannot be built there
refused naming the operator and the opset; and pipelines that convert their models to one
opset building their operators at it (the command line before an opset-11 model)."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import fastseq
from fastseq import ops
from fastseq.ops import OperatorError, _graph
from ops.references import bilinear, nearest, nms_reference
from ops.test_proto import IDS, VARIANTS, build_described, feed, with_onnx_helper

#: The opsets where ops changed form (Softmax, ReduceSum, Resize in 13; integer Max in 12),
#: and the default.
OPSETS = (11, 12, 13, ops.DEFAULT_OPSET)


def run(op: ops.Operator | onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(op.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.mark.parametrize("version", (11, 12, 13))
@pytest.mark.parametrize("name, args, kwargs", VARIANTS, ids=IDS)
def test_every_variant_builds_at_early_opsets_and_computes_what_the_default_build_does(
    name, args, kwargs, version, monkeypatch
):
    kwargs = {k: v for k, v in kwargs.items() if k != "opset"}
    if kwargs.get("antialias"):
        # Resize's antialias attribute arrived in opset 18: refused, naming the operator.
        refused = rf"^{name}: antialias=True needs opset 18 or later, got opset={version}$"
        with pytest.raises(OperatorError, match=refused):
            ops.build(name, *args, **kwargs, opset=version)
        return
    op, described = build_described(name, args, {**kwargs, "opset": version}, monkeypatch)
    model = op.to_onnx()
    assert [(o.domain, o.version) for o in model.opset_import] == [("", version)]
    assert model.ir_version == helper.find_min_ir_version_for([helper.make_opsetid("", version)])
    assert bytes(op) == with_onnx_helper(*described).SerializeToString()
    onnx.checker.check_model(model, full_check=True)  # every node in the form this opset defines
    default = ops.build(name, *args, **kwargs)
    rng = np.random.default_rng(0)
    bound: dict[str, int] = {}
    feeds = {t.name: feed(t, bound, rng) for t in op.inputs}
    assert op.inputs == default.inputs and op.outputs == default.outputs
    for got, want in zip(run(op, feeds), run(default, feeds), strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_the_early_forms_are_the_ones_written():
    """Where an op changed form, opsets 11 and 12 get the earlier one (and 13 the current)."""

    def types(op):
        return [n.op_type for n in op.graph.node]

    assert types(ops.softmax(1, rank=3, opset=12)) == ["Transpose", "Softmax", "Transpose"]
    assert types(ops.softmax(-1, rank=3, opset=11)) == ["Softmax"]  # the last axis: one Softmax
    assert types(ops.softmax(1, rank=3, opset=13)) == ["Softmax"]
    reduce = next(n for n in ops.grayscale(opset=11).graph.node if n.op_type == "ReduceSum")
    assert [a.name for a in reduce.attribute] == ["axes", "keepdims"] and len(reduce.input) == 1
    reduce = next(n for n in ops.grayscale(opset=13).graph.node if n.op_type == "ReduceSum")
    assert len(reduce.input) == 2
    assert "Max" not in types(ops.center_crop(4, opset=11)) and "Where" in types(ops.center_crop(4, opset=11))
    assert "Max" in types(ops.center_crop(4, opset=12)) and "Where" not in types(ops.center_crop(4, opset=12))
    for version, roi in ((11, True), (12, True), (13, False)):
        resize = next(n for n in ops.resize(8, opset=version).graph.node if n.op_type == "Resize")
        assert bool(resize.input[1]) is roi and bool(resize.input[2]) is roi


# --- each operator at each opset against numpy ------------------------------------------------

RNG = np.random.default_rng(41)
IMAGES = RNG.integers(0, 256, (2, 9, 13, 3), dtype=np.uint8)  # NHWC, odd sizes
NCHW = IMAGES.transpose(0, 3, 1, 2).astype(np.float32) / 255
SCORES = RNG.random((3, 4, 5), np.float32) * 6 - 3


def _softmax(x, axis):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def _center_crop(x, h, w):
    """torchvision's: the central h x w, zero padding around an image smaller than that."""
    top, left = max(x.shape[2] - h, 0) // 2, max(x.shape[3] - w, 0) // 2
    cut = x[:, :, top : top + h, left : left + w]
    out = np.zeros((*x.shape[:2], h, w), x.dtype)
    ph, pw = (h - cut.shape[2]) // 2, (w - cut.shape[3]) // 2
    out[:, :, ph : ph + cut.shape[2], pw : pw + cut.shape[3]] = cut
    return out


def _topk(x, k, axis):
    order = np.argsort(-x, axis, kind="stable")
    indices = np.take(order, np.arange(k), axis)
    return np.take_along_axis(x, indices, axis), indices


BOXES = np.concatenate([xy := RNG.random((2, 6, 2), np.float32) * 10, xy + 1 + RNG.random((2, 6, 2), np.float32)], -1)
BOX_SCORES = RNG.random((2, 3, 6), np.float32)

#: (operator, its arguments, the inputs, what numpy computes from them): every operator.
REFERENCES = [
    ("to_float", (), {}, [IMAGES], [IMAGES.astype(np.float32) / 255]),
    ("layout", ("NHWC", "NCHW"), {"dtype": "uint8"}, [IMAGES], [IMAGES.transpose(0, 3, 1, 2)]),
    ("rgb_to_bgr", (), {}, [NCHW], [NCHW[:, ::-1]]),
    ("grayscale", (), {}, [NCHW], [np.tensordot([0.299, 0.587, 0.114], NCHW, ([0], [1]))[:, None]]),
    (
        "grayscale",
        (3,),
        {"layout": "NHWC"},
        [IMAGES.astype(np.float32)],
        [np.repeat((IMAGES.astype(np.float32) @ np.float32([0.299, 0.587, 0.114]))[..., None], 3, -1)],
    ),
    ("normalize", (0.5, 0.25), {}, [NCHW], [(NCHW - 0.5) / 0.25]),
    ("resize", ((5, 7), "nearest"), {}, [NCHW], [nearest(NCHW, (5, 7))]),
    ("resize", ((17, 4),), {}, [NCHW], [bilinear(NCHW, (17, 4))]),
    ("center_crop", (5,), {}, [NCHW], [_center_crop(NCHW, 5, 5)]),
    ("center_crop", ((12, 16),), {}, [NCHW], [_center_crop(NCHW, 12, 16)]),  # padded on both axes
    ("center_crop", ((4, 20),), {}, [NCHW], [_center_crop(NCHW, 4, 20)]),  # cut one, pad the other
    # 9 x 13 fits in 18 x 18 at scale 18/13: resized to 12 x 18, padded 3 above and below.
    (
        "letterbox",
        (18, 0.5),
        {"mode": "nearest"},
        [NCHW],
        [
            np.pad(nearest(NCHW, (12, 18)), ((0, 0), (0, 0), (3, 3), (0, 0)), constant_values=0.5),
            np.float32(18 / 13),
            np.int64([3, 0, 3, 0]),
        ],
    ),
    ("flatten", (), {}, [NCHW], [NCHW.reshape(2, -1)]),
    ("softmax", (), {}, [SCORES[0]], [_softmax(SCORES[0], -1)]),
    ("softmax", (0,), {"rank": 3}, [SCORES], [_softmax(SCORES, 0)]),
    ("softmax", (1,), {"rank": 3}, [SCORES], [_softmax(SCORES, 1)]),
    ("softmax", (-3,), {"rank": 3, "dtype": "float64"}, [SCORES.astype(np.float64)], [_softmax(SCORES, 0)]),
    ("argmax", (1, True), {"rank": 3}, [SCORES], [SCORES.argmax(1)[:, None]]),
    ("topk", (2, 1), {"rank": 3}, [SCORES], list(_topk(SCORES, 2, 1))),
    ("nms", (0.3, 0.2, 2), {}, [BOXES, BOX_SCORES], None),  # against the greedy reference below
]


@pytest.mark.parametrize("version", OPSETS)
@pytest.mark.parametrize(
    "name, args, kwargs, inputs, expected", REFERENCES, ids=[f"{r[0]}{r[1]}{r[2]}" for r in REFERENCES]
)
def test_each_operator_at_each_opset_against_numpy(name, args, kwargs, inputs, expected, version):
    op = ops.build(name, *args, **kwargs, opset=version)
    assert op.opset_import[0].version == version
    got = run(op, {t.name: x for t, x in zip(op.inputs, inputs)})
    if expected is None:  # nms: the greedy reference's picks, and what each holds
        picked = nms_reference(BOXES, BOX_SCORES, *args)
        b, c, i = picked.T
        expected = [picked, BOXES[b, i], BOX_SCORES[b, c, i], c]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == np.shape(e)
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def test_every_operator_is_checked_against_numpy():
    assert {r[0] for r in REFERENCES} == set(ops.names())


# --- refused where an op does not exist -------------------------------------------------------


@pytest.mark.parametrize("name", sorted(set(ops.names())))
def test_opsets_before_11_are_refused_naming_the_operator(name):
    args = {"resize": (8,), "center_crop": (8,), "letterbox": (8,), "topk": (1,)}.get(name, ())
    with pytest.raises(
        OperatorError,
        match=rf"^{name}: opset must be between 11 and {_graph.LATEST_OPSET}, got 10: "
        r"opset 10 lacks the forms of the ops",
    ):
        ops.build(name, *args, opset=10)
    with pytest.raises(
        OperatorError,
        match=rf"^{name}: opset must be between 11 and {_graph.LATEST_OPSET}, got "
        rf"{_graph.LATEST_OPSET + 1}$",
    ):
        ops.build(name, *args, opset=_graph.LATEST_OPSET + 1)
    ops.build(name, *args, opset=11)


def test_a_builtin_string_at_an_opset_without_the_op_names_the_operator():
    with pytest.raises(
        OperatorError,
        match=r"^builtin:resize\?size=8&antialias=true&opset=12: resize: antialias=True "
        r"needs opset 18 or later, got opset=12$",
    ):
        fastseq.compose(["builtin:resize?size=8&antialias=true&opset=12"])
    with pytest.raises(OperatorError, match=r"^builtin:topk\?k=3&opset=9: topk: opset must be between 11"):
        fastseq.compose(["builtin:topk?k=3&opset=9"])


# --- pipelines converted to one opset build their operators at it -----------------------------


def pooled_opset11(path=None) -> onnx.ModelProto:
    """A model as exported at opset 11: ReduceMean with its axes as an attribute, Softmax over
    the last axis; images float32 [N, 3, H, W] -> scores [N, 3]."""
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["image"], ["pooled"], axes=[2, 3], keepdims=0),
            helper.make_node("Softmax", ["pooled"], ["scores"], axis=1),
        ],
        "pooled",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=6)
    onnx.checker.check_model(model, full_check=True)
    if path is not None:
        onnx.save(model, path)
    return model


def expected_scores(images: np.ndarray) -> np.ndarray:
    return _softmax((images.astype(np.float32) / 255).mean((1, 2)), -1)


def test_at_opset_builds_operators_again_and_leaves_the_rest():
    op = ops.topk(2, axis=0)
    again = ops.at_opset(op, 11)
    assert again == ops.topk(2, axis=0, opset=11) and again.opset_import[0].version == 11
    assert ops.at_opset(pickle.loads(pickle.dumps(op)), 12) == ops.topk(2, axis=0, opset=12)
    assert ops.at_opset(ops.topk(2, opset=13), 11) is None  # its opset named: kept
    assert ops.at_opset("builtin:topk?k=2", 11) == "builtin:topk?k=2&opset=11"
    assert ops.at_opset("builtin:softmax", 12) == "builtin:softmax?opset=12"
    assert ops.at_opset("builtin:topk?k=2&opset=13", 11) is None
    assert ops.at_opset("builtin:color_head", 11) is None  # shipped files are models
    assert ops.at_opset("builtin:shipped/normalize", 11) is None
    assert ops.at_opset("model.onnx", 11) is None and ops.at_opset(bytes(op), 11) is None
    with pytest.raises(
        OperatorError,
        match=r"^builtin:resize\?size=8&antialias=true: resize: antialias=True needs "
        r"opset 18 or later, got opset=11$",
    ):
        ops.at_opset("builtin:resize?size=8&antialias=true", 11)


def test_python_pipelines_converted_to_an_early_opset_build_their_operators_at_it():
    model = pooled_opset11()
    stages = [ops.to_float(), ops.layout("NHWC", "NCHW"), model, ops.topk(2)]
    with pytest.raises(fastseq.OpsetMismatchError, match=r"11 in .*17 in"):
        fastseq.compose(stages)  # nothing asked to convert: the opsets differ, as before
    for opset in (11, "highest"):
        composed = fastseq.compose(stages, opset=opset)
        assert [(o.domain, o.version) for o in composed.opset_import] == [("", 11)]
        values, indices = run(composed, {composed.graph.input[0].name: IMAGES})
        want = _topk(expected_scores(IMAGES), 2, -1)
        np.testing.assert_allclose(values, want[0], rtol=1e-5)
        np.testing.assert_array_equal(indices, want[1])
    pipe = fastseq.ONNXSequential(*stages, auto_ir_version_conversion=True)
    np.testing.assert_array_equal(pipe(IMAGES)[1], want[1])
    # An operator that names its opset keeps it: the model is converted up to it.
    composed = fastseq.compose([ops.to_float(opset=13), ops.layout("NHWC", "NCHW"), model], opset="highest")
    assert composed.opset_import[0].version == 13
    # An operator that cannot be built at the opset asked for is refused, named; with
    # "highest" it stays as built and the models go up to it.
    resize = ops.resize(4, antialias=True)
    with pytest.raises(
        OperatorError,
        match=r"resize: antialias=True needs opset 18 or later, got opset=11 \(the "
        r"models are converted to opset 11\)",
    ):
        fastseq.compose([resize, model], opset=11)
    assert fastseq.compose([resize, model], opset="highest").opset_import[0].version == 18


def test_the_command_line_composes_builtin_operators_before_an_opset_11_model(tmp_path):
    pooled_opset11(tmp_path / "pooled11.onnx")
    np.save(tmp_path / "x.npy", IMAGES)
    want = _topk(expected_scores(IMAGES), 2, -1)

    def fastseq_cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "fastseq", *args], capture_output=True, text=True, cwd=tmp_path, timeout=180
        )

    # Operators that name opset 11; and operators following --opset (highest or 11): built at
    # 11, the model left as exported.
    named = [
        "builtin:to_float?opset=11",
        "builtin:layout?src=NHWC&dst=NCHW&opset=11",
        "pooled11.onnx",
        "builtin:topk?k=2&opset=11",
    ]
    following = ["builtin:to_float?", "builtin:layout?src=NHWC&dst=NCHW", "pooled11.onnx", "builtin:topk?k=2"]
    runs = [(named, []), (following, ["--opset", "highest"]), (following, ["--opset", "11"])]
    for i, (stages, extra) in enumerate(runs):
        r = fastseq_cli("run", *stages, *extra, "--input", "x.npy", "-o", f"out{i}.npz")
        assert r.returncode == 0, r.stderr
        out = np.load(tmp_path / f"out{i}.npz")
        np.testing.assert_allclose(out["values"], want[0], rtol=1e-5)
        np.testing.assert_array_equal(out["indices"], want[1])
    r = fastseq_cli("merge", *following, "--opset", "highest", "-o", "m.onnx")
    assert r.returncode == 0, r.stderr
    assert [(o.domain, o.version) for o in onnx.load(tmp_path / "m.onnx").opset_import] == [("", 11)]
    # Without --opset the opsets differ, and the error says how to fix it on the command line.
    r = fastseq_cli("run", *following, "--input", "x.npy")
    assert r.returncode == 1 and "pass --opset highest to convert them" in r.stderr
    # What cannot be built at 11 is refused, naming the operator and the opset.
    r = fastseq_cli("run", "builtin:resize?size=8&antialias=true", "pooled11.onnx", "--opset", "11", "--input", "x.npy")
    assert r.returncode == 1
    assert r.stderr.strip() == (
        "fastseq: error: builtin:resize?size=8&antialias=true: resize: antialias=True needs opset 18 or later, "
        "got opset=11 (the models are converted to opset 11)"
    )
