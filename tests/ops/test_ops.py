"""fastseq.ops as stages (every operator batched, built from strings and builtin: names, in
a real classifier's pipeline, on the command line) and its errors; the image operators are
tested in test_image.py, the heads in test_head.py, against the references of references.py."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import onnx
import pytest

import fastseq
from fastseq import ops
from fastseq.ops import OperatorError
from ops.references import Image, batch_of, nchw_float, nearest, run

# --- as stages -------------------------------------------------------------------------


def test_every_operator_has_a_dynamic_batch_axis():
    variants = [
        ops.resize(3, keep_aspect=True, layout="NHWC"),
        ops.resize(3, "cubic", layout="NHWC", dtype="uint8"),
        ops.letterbox(3, layout="NHWC"),
        ops.center_crop(3, layout="NHWC"),
        ops.grayscale(3, dtype="uint8"),
        ops.nms(scores_layout="NBC"),
    ]
    for model in [
        ops.build(n, *([3] if n in ("resize", "center_crop", "letterbox", "topk") else [])) for n in ops.names()
    ] + variants:
        name = model.graph.name
        onnx.checker.check_model(model, full_check=True)
        for value in [*model.graph.input]:
            first = value.type.tensor_type.shape.dim[0]
            assert first.dim_param == "N" and not first.HasField("dim_value"), (name, value.name)
        assert model.doc_string.startswith(f"fastseq.ops.{name}(")
        # An initializer no node reads makes ONNX Runtime print a warning per session.
        read = {i for n in model.graph.node for i in n.input}
        assert not [t.name for t in model.graph.initializer if t.name not in read], name
        assert model.opset_import[0].version == ops.DEFAULT_OPSET


def test_operators_around_a_real_classifier_read_photos_of_digits():
    """The demo's pipeline: built from strings, composed once, right on held-out photos,
    and equal to running each stage in its own session."""
    from sklearn.datasets import load_digits

    from fastseq.cli import DEMO

    io_maps = [[("output", "input")]] * 6 + [[("logits", "input")], [("probabilities", "input")]]
    pipe = fastseq.ONNXSequential(*DEMO, io_maps=io_maps, keep_outputs=["probabilities"])
    sample = np.load(fastseq.ops.shipped.digits_sample())
    probs, predicted = pipe(sample["images"])
    np.testing.assert_array_equal(predicted, sample["labels"])

    # Every digit of the data set rendered as a 40x40 photo: the chain still reads them.
    data = load_digits()
    photos = np.stack(
        [
            np.asarray(Image.fromarray((d * 255 / 16).astype(np.float32), "F").resize((40, 40), Image.BICUBIC))
            for d in data.images[::3]
        ]
    )
    rgb = np.repeat(np.clip(photos, 0, 255).round().astype(np.uint8)[..., None], 3, axis=-1)
    _, guesses = pipe(rgb)
    assert (guesses == data.target[::3]).mean() > 0.9

    stages = [fastseq.compose([s]) for s in DEMO]
    x = {"input": sample["images"][:2]}
    for stage, joint in zip(stages, [*io_maps, None]):
        out = run(stage, *x.values())
        names = [o.name for o in stage.graph.output]
        x = dict(zip(names, out)) if joint is None else {joint[0][1]: dict(zip(names, out))[joint[0][0]]}
    np.testing.assert_array_equal(x["indices"], predicted[:2])


def test_strings_build_the_same_models_as_calls():
    pairs = [
        ("resize?size=224,224&mode=linear", ops.resize((224, 224), mode="linear")),
        ("resize?size=256&keep_aspect=true&antialias=true", ops.resize(256, keep_aspect=True, antialias=True)),
        ("normalize?mean=0.5,0.4,0.3&std=0.2", ops.normalize([0.5, 0.4, 0.3], 0.2)),
        ("to_float?scale=1/255&dtype=uint8", ops.to_float(1 / 255)),
        ("layout?src=NHWC&dst=NCHW", ops.layout("NHWC", "NCHW")),
        ("letterbox?size=640&fill=114&dtype=uint8&layout=nhwc", ops.letterbox(640, 114, dtype="uint8", layout="NHWC")),
        ("topk?k=5", ops.topk(5)),
        ("nms?iou=0.45&score=0.25&max_boxes=300&scores_layout=NBC", ops.nms(0.45, 0.25, 300, scores_layout="NBC")),
        ("grayscale?channels=3", ops.grayscale(3)),
        ("center_crop?size=224&opset=19", ops.center_crop(224, opset=19)),
    ]
    for spec, model in pairs:
        assert ops.from_string(spec).SerializeToString() == model.SerializeToString(), spec
        loaded = fastseq.compose([f"builtin:{spec}"])
        assert [i.name for i in loaded.graph.input] == [i.name for i in model.graph.input]
    assert ops.parse("resize?size=224,224&mode=linear") == ("resize", {"size": (224, 224), "mode": "linear"})


def test_a_builtin_name_has_one_meaning_and_old_names_keep_theirs_with_a_note():
    """builtin:shipped/NAME is the shipped file, byte for byte; builtin:NAME?... and a bare
    name only an operator has build the operator; a bare name the first release gave a file
    that an operator now shares still names the file (old pipelines compute what they did),
    with one FutureWarning saying how to write either."""
    shipped = fastseq.compose(["builtin:shipped/resize"])
    original = onnx.load(fastseq.ops.shipped.path("resize"))
    assert [n.op_type for n in shipped.graph.node] == [n.op_type for n in original.graph.node]
    assert shipped.graph.output[0].type.tensor_type.shape.dim[2].dim_value == 32
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no note for a name with one meaning
        assert fastseq.compose(["builtin:softmax"]).graph.node[0].op_type == "Softmax"
        assert fastseq.compose(["builtin:shipped/normalize"]).graph.node[0].op_type == "Sub"
        fastseq.compose(["builtin:digits"])
    image = np.load(fastseq.ops.shipped.sample())
    files = ["builtin:shipped/to_float", "builtin:shipped/resize", "builtin:shipped/normalize", "builtin:color_head"]
    new = fastseq.ONNXSequential(
        "builtin:to_float?",
        "builtin:layout?src=NHWC&dst=NCHW",
        "builtin:resize?size=32",
        "builtin:normalize?",
        "builtin:color_head",
    )
    np.testing.assert_allclose(new(image)[0], fastseq.ONNXSequential(*files)(image)[0], atol=1e-6)
    with pytest.warns(FutureWarning) as caught:
        old = fastseq.ONNXSequential("builtin:to_float", "builtin:resize", "builtin:normalize", "builtin:color_head")
    assert [str(w.message).split(" ")[0] for w in caught] == ["builtin:to_float", "builtin:resize", "builtin:normalize"]
    assert all(w.filename == __file__ for w in caught), "the note points at the caller's line"
    assert "write builtin:shipped/resize for the file, or builtin:resize?size=32" in str(caught[1].message)
    np.testing.assert_allclose(old(image)[0], new(image)[0], atol=1e-6)
    with pytest.raises(ops.OperatorError, match=r"a shipped model takes no parameters; builtin:resize\?size=3 builds"):
        fastseq.compose(["builtin:shipped/resize?size=3"])
    with pytest.raises(fastseq.LoadError, match=r"no built-in operator 'resise' \(did you mean 'resize'\?\)"):
        fastseq.compose(["builtin:shipped/resise"])
    with pytest.raises(fastseq.LoadError, match="no built-in operator '../normalize'"):
        fastseq.compose(["builtin:shipped/../normalize"])


def test_operator_options_pick_the_opset():
    assert ops.resize(8).opset_import[0].version == 17
    assert ops.resize(8, antialias=True).opset_import[0].version == 18
    assert ops.resize(8, antialias=True, opset=20).opset_import[0].version == 20
    model = ops.resize(8, antialias=True, opset=20)
    (y,) = run(model, np.ones((2, 3, 16, 16), np.float32))
    np.testing.assert_allclose(y, 1, atol=1e-6)


def test_command_line_merges_and_runs_operator_strings(tmp_path):
    cmd = [sys.executable, "-m", "fastseq"]
    stages = ["builtin:to_float?", "builtin:layout?src=NHWC&dst=NCHW", "builtin:resize?size=20,30&mode=nearest"]
    r = subprocess.run(
        [*cmd, "merge", *stages, "-o", "pre.onnx"], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert r.returncode == 0, r.stderr
    x = batch_of("sample")
    (y,) = run(onnx.load(tmp_path / "pre.onnx"), x)
    np.testing.assert_allclose(y, nearest(nchw_float(x) / 255, (20, 30)), atol=1e-6)
    r = subprocess.run(
        [*cmd, "merge", "builtin:resize?size=20&mode=bilnear", "-o", "x.onnx"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert r.returncode == 1 and not (tmp_path / "x.onnx").exists()
    assert r.stderr.strip() == (
        "fastseq: error: builtin:resize?size=20&mode=bilnear: resize: mode must be one of nearest, linear, cubic, "
        "got 'bilnear' (did you mean 'bilinear' or 'linear'?)"
    )


# --- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: ops.build("resise", 3), r"no built-in operator 'resise' \(did you mean 'resize'\?\)"),
        (
            lambda: ops.from_string("resize?sise=3"),
            r"builtin:resize\?sise=3: resize has no parameter 'sise' \(did you mean 'size'\?\)",
        ),
        (lambda: ops.from_string("resize?mode=linear"), r"resize needs size \(e.g. builtin:resize\?size=...\)"),
        (lambda: ops.from_string("resize?size=3&size=4"), r"'size' is given twice"),
        (lambda: ops.from_string("resize?size"), r"'size' is not KEY=VALUE"),
        (lambda: ops.resize(0), r"resize: size must be at least 1, got 0"),
        (lambda: ops.resize(224.5), r"resize: size must be an integer, got 224.5"),
        (lambda: ops.resize((1, 2, 3)), r"resize: size must be an int or \(height, width\)"),
        (lambda: ops.resize(8, keep_aspect="longer"), r"keep_aspect must be one of not_smaller, not_larger"),
        (lambda: ops.resize(8, "nearest", antialias=True), r"antialias=True needs mode 'linear' or 'cubic'"),
        (lambda: ops.resize(8, antialias=True, opset=17), r"antialias=True needs opset 18 or later, got opset=17"),
        (
            lambda: ops.resize(8, dtype="float64"),
            r"resize: dtype must be one of uint8, int8, int32, float32, got float64",
        ),
        (lambda: ops.resize(8, dtype="floot32"), r"dtype must be one of .* got 'floot32' \(did you mean 'float32'\?\)"),
        (lambda: ops.resize(8, layout="CHW"), r"layout must be one of NCHW, NHWC, got 'CHW'"),
        (lambda: ops.normalize([0.5, 0.5], [0.2, 0.2, 0.2]), r"mean has 2 values and std 3"),
        (lambda: ops.normalize(0.5, 0), r"normalize: std must not be zero"),
        (lambda: ops.normalize(layout="NHW"), r"layout must have a channel axis 'C'"),
        (lambda: ops.to_float(scale=float("nan")), r"to_float: scale must be a finite number"),
        (lambda: ops.layout("NHWC", "NCHWW"), r"layout: dst must name each axis with one distinct letter"),
        (lambda: ops.layout("NHWC", "NCHX"), r"src and dst must name the same axes"),
        (lambda: ops.grayscale(2), r"grayscale: channels must be 1 or 3, got 2"),
        (lambda: ops.letterbox(64, fill=300, dtype="uint8"), r"fill must be an integer in \[0, 255\] for uint8"),
        (lambda: ops.topk(0), r"topk: k must be at least 1, got 0"),
        (lambda: ops.softmax(axis=2, rank=2), r"softmax: axis must be in \[-2, 1\] for rank 2, got 2"),
        (lambda: ops.nms(iou=1.5), r"nms: iou must be between 0 and 1"),
        (lambda: ops.nms(box_format="xywh"), r"box_format must be one of xyxy, cxcywh, got 'xywh'"),
        (lambda: ops.center_crop(8, opset=10), r"center_crop: opset must be between 11 and \d+, got 10"),
        (lambda: ops.build("topk", 1, 2, 3, 4), r"topk takes at most 3 positional arguments"),
    ],
)
def test_bad_parameters_are_typed_errors_naming_the_operator(build, message):
    with pytest.raises(OperatorError, match=message) as info:
        build()
    assert isinstance(info.value, fastseq.LoadError) and isinstance(info.value, ValueError)


def test_bad_builtin_strings_fail_in_every_entry_point():
    with pytest.raises(
        fastseq.LoadError, match=r"builtin:grayscal: no built-in operator 'grayscal' \(did you mean 'grayscale'\?\)"
    ):
        fastseq.ONNXSequential("builtin:grayscal")
    with pytest.raises(
        OperatorError, match=r"builtin:letterbox\?size=64&fill=x: letterbox: fill must be a finite number, got 'x'"
    ):
        fastseq.compose(["builtin:letterbox?size=64&fill=x"])


def test_the_readme_pipeline_converts_mixed_opsets_and_runs_quietly(capfd):
    """resize with antialias is built at opset 18, the rest at 17: the README's pipeline
    asks for the conversion, and ONNX Runtime has nothing to warn about."""
    stages = [
        ops.to_float(),
        ops.layout("NHWC", "NCHW"),
        ops.resize(36, keep_aspect=True, antialias=True),
        ops.center_crop(32),
        ops.normalize(),
        "builtin:color_head",
        ops.topk(2),
    ]
    with pytest.raises(fastseq.OpsetMismatchError, match=r"17 in to_float \(#0\).*18 in resize \(#2\)"):
        fastseq.ONNXSequential(*stages)
    image = np.load(fastseq.ops.shipped.sample())
    values, indices = fastseq.ONNXSequential(*stages, auto_ir_version_conversion=True)(image)
    assert indices[0, 0] == fastseq.ops.shipped.CLASSES.index("red") and values[0, 0] > 0.9
    assert "onnxruntime" not in capfd.readouterr().err
