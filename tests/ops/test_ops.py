"""fastseq.ops against reference implementations (numpy, Pillow) on real images: the two
photos scikit-learn bundles, crops of them, and the samples fastseq ships, in several sizes
and batch sizes, each model run by a real ONNX Runtime session."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import fastseq
from fastseq import ops
from fastseq.ops import OperatorError

Image = pytest.importorskip("PIL.Image")

FILTERS = {"nearest": Image.NEAREST, "linear": Image.BILINEAR, "cubic": Image.BICUBIC}


def run(model: onnx.ModelProto, *arrays: np.ndarray) -> list[np.ndarray]:
    """Checks the model as onnx does, then runs it in a fresh CPU session."""
    onnx.checker.check_model(model, full_check=True)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: a for i, a in zip(session.get_inputs(), arrays)})


def photos() -> list[np.ndarray]:
    from sklearn.datasets import load_sample_images

    return list(load_sample_images().images)  # china.jpg, flower.jpg: 427x640 RGB


def batch_of(name: str) -> np.ndarray:
    """uint8 RGB batches [N, H, W, 3] of several sizes and counts."""
    china, flower = photos()
    if name == "sample":
        return np.load(fastseq.ops.shipped.sample())  # 1 x 48 x 64
    if name == "digits":
        return np.load(fastseq.ops.shipped.digits_sample())["images"]  # 4 x 64 x 64
    if name == "photos":
        return np.stack([china, flower])  # 2 x 427 x 640
    if name == "crops":  # 3 x 301 x 199: tall, odd sizes
        return np.stack([china[:301, :199], flower[100:401, 300:499], china[126:, 441:]])
    raise AssertionError(name)


BATCHES = ["sample", "digits", "photos", "crops"]


@pytest.fixture(scope="module", params=BATCHES)
def nhwc(request) -> np.ndarray:
    return batch_of(request.param)


def nchw_float(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2)).astype(np.float32)


def pil_float(x: np.ndarray, hw: tuple[int, int], mode: str) -> np.ndarray:
    """Pillow's float ("F") resize of every channel of every image of [N, C, H, W]."""
    return np.stack(
        [
            np.stack([np.asarray(Image.fromarray(c, "F").resize((hw[1], hw[0]), FILTERS[mode])) for c in img])
            for img in x
        ]
    )


def nearest(x: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """The pixel under each output pixel's centre, floor((i + 0.5) * in / out), computed
    exactly (Pillow's float arithmetic goes either way where that lands on a pixel edge)."""
    rows = (2 * np.arange(hw[0]) + 1) * x.shape[-2] // (2 * hw[0])
    cols = (2 * np.arange(hw[1]) + 1) * x.shape[-1] // (2 * hw[1])
    return x[..., rows, :][..., cols]


def bilinear(x: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """Bilinear interpolation at half-pixel centres without filtering ([..., H, W])."""

    def taps(out: int, size: int):
        c = np.clip((np.arange(out) + 0.5) * (size / out) - 0.5, 0, size - 1)
        lo = np.floor(c).astype(int)
        return lo, np.minimum(lo + 1, size - 1), (c - lo).astype(np.float32)

    (ylo, yhi, fy), (xlo, xhi, fx) = taps(hw[0], x.shape[-2]), taps(hw[1], x.shape[-1])
    rows = x[..., ylo, :] * (1 - fy)[:, None] + x[..., yhi, :] * fy[:, None]
    return rows[..., xlo] * (1 - fx) + rows[..., xhi] * fx


# --- pixels and channels ---------------------------------------------------------------


def test_to_float_layout_and_channel_order(nhwc):
    (f,) = run(ops.to_float(), nhwc)
    assert f.dtype == np.float32
    np.testing.assert_array_equal(f, nhwc.astype(np.float32) * np.float32(1 / 255))
    (half,) = run(ops.to_float(scale=2.0, dtype="uint16", to="float16", rank=4), nhwc.astype(np.uint16))
    np.testing.assert_array_equal(half, (nhwc.astype(np.float16) * 2).astype(np.float16))

    (chw,) = run(ops.layout("NHWC", "NCHW", dtype="uint8"), nhwc)
    np.testing.assert_array_equal(chw, nhwc.transpose(0, 3, 1, 2))
    (back,) = run(ops.layout("nchw", "nhwc"), nchw_float(nhwc))
    np.testing.assert_array_equal(back, nhwc.astype(np.float32))

    (bgr,) = run(ops.rgb_to_bgr(layout="NHWC", dtype=np.uint8), nhwc)
    np.testing.assert_array_equal(bgr, nhwc[..., ::-1])
    (bgr_chw,) = run(ops.rgb_to_bgr(), nchw_float(nhwc))
    np.testing.assert_array_equal(bgr_chw, nchw_float(nhwc)[:, ::-1])


def test_grayscale_matches_pillow_and_the_luma_formula(nhwc):
    (grey,) = run(ops.grayscale(layout="NHWC", dtype="uint8"), nhwc)
    reference = np.stack([np.asarray(Image.fromarray(img).convert("L")) for img in nhwc])[..., None]
    diff = np.abs(grey.astype(int) - reference)
    # Pillow rounds in 16-bit fixed point; the model in float32.
    assert diff.max() <= 1 and (diff == 0).mean() > 0.99

    x = nchw_float(nhwc) / 255
    (luma,) = run(ops.grayscale(), x)
    expected = (0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2])[:, None]
    np.testing.assert_allclose(luma, expected, atol=1e-6)
    (three,) = run(ops.grayscale(channels=3), x)
    np.testing.assert_allclose(three, np.repeat(expected, 3, axis=1), atol=1e-6)


def test_normalize_per_channel_and_per_layout(nhwc):
    x = nchw_float(nhwc) / 255
    (y,) = run(ops.normalize(), x)
    mean = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1)
    std = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1)
    np.testing.assert_allclose(y, (x - mean) / std, rtol=1e-6, atol=1e-6)
    (z,) = run(ops.normalize(0.5, 0.25, layout="NHWC"), nhwc.astype(np.float32) / 255)
    np.testing.assert_allclose(z, (nhwc.astype(np.float32) / 255 - 0.5) / 0.25, atol=1e-6)
    rows = x.reshape(len(x), -1)[:, :5]
    (r,) = run(ops.normalize([1, 2, 3, 4, 5], 2, layout="NC"), rows)
    np.testing.assert_allclose(r, (rows - np.arange(1, 6)) / 2, atol=1e-6)


def test_flatten_gives_feature_rows(nhwc):
    x = nchw_float(nhwc)
    (y,) = run(ops.flatten(), x)
    np.testing.assert_array_equal(y, x.reshape(len(x), -1))
    (z,) = run(ops.flatten(axis=2, dtype="uint8"), nhwc)
    np.testing.assert_array_equal(z, nhwc.reshape(len(nhwc) * nhwc.shape[1], -1))


# --- geometry --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_matches_pillow(nhwc, mode):
    x = nchw_float(nhwc)
    h, w = x.shape[2:]
    for hw, antialias in [((2 * h + 3, w + w // 2), False), ((h // 3 + 1, w // 4 + 1), mode != "nearest")]:
        (y,) = run(ops.resize(hw, mode, antialias=antialias), x)
        assert y.shape == (len(x), 3, *hw)
        # Pillow filters when shrinking: the model does with antialias=True.
        reference = nearest(x, hw) if mode == "nearest" else pil_float(x, hw, mode)
        np.testing.assert_allclose(y, reference, atol=0.02, err_msg=f"{mode} {hw}")
    if mode == "linear":  # shrinking without the filter samples pixels: Pillow has no such mode
        (y,) = run(ops.resize((h // 3 + 1, w // 4 + 1)), x)
        np.testing.assert_allclose(y, bilinear(x, (h // 3 + 1, w // 4 + 1)), atol=0.01)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_uint8_channels_last_matches_pillow(mode):
    x = batch_of("crops")
    for hw, antialias in [((500, 333), False), ((100, 70), mode != "nearest")]:
        (y,) = run(ops.resize(hw, mode, antialias=antialias, layout="NHWC", dtype="uint8"), x)
        ref = np.stack([np.asarray(Image.fromarray(img).resize((hw[1], hw[0]), FILTERS[mode])) for img in x])
        if mode == "nearest":
            ref = nearest(x.transpose(0, 3, 1, 2), hw).transpose(0, 2, 3, 1)
        if mode == "cubic" and not antialias:
            # Pillow's uint8 bicubic clips its overshoot between the two passes (up to 12
            # levels off its own float result), as ONNX Runtime's antialiased uint8 path
            # does; without antialias the model resizes in float32 and rounds once.
            ref = np.clip(np.round(pil_float(nchw_float(x), hw, mode)), 0, 255).transpose(0, 2, 3, 1)
        diff = np.abs(y.astype(int) - ref)
        # Pillow computes uint8 resizes in fixed point: a level or two apart, rarely.
        assert diff.max() <= 2 and diff.mean() < 0.5, (mode, hw, diff.max(), diff.mean())
    if mode == "cubic":  # shrinking without the filter goes through float32 channels-first
        (y,) = run(ops.resize((100, 70), "cubic", layout="NHWC", dtype="uint8"), x)
        (f,) = run(ops.resize((100, 70), "cubic"), nchw_float(x))
        expected = np.clip(np.round(f), 0, 255).transpose(0, 2, 3, 1)
        np.testing.assert_array_equal(y, expected)


def test_resize_keeping_the_aspect_ratio():
    for name in ("photos", "crops", "sample"):
        x = nchw_float(batch_of(name))
        h, w = x.shape[2:]
        for policy, pick in (("not_smaller", max), (True, max), ("not_larger", min)):
            (y,) = run(ops.resize(224, "linear", keep_aspect=policy, antialias=True), x)
            scale = pick(224 / h, 224 / w)
            hw = (int(np.floor(h * scale + 0.5)), int(np.floor(w * scale + 0.5)))
            assert y.shape[2:] == hw
            assert (min(hw) if pick is max else max(hw)) == 224
            np.testing.assert_allclose(y, pil_float(x, hw, "linear"), atol=0.02)


def test_center_crop_crops_and_pads_like_torchvision(nhwc):
    x = nchw_float(nhwc)
    h, w = x.shape[2:]
    for ch, cw in [(h // 2, w // 3), (h - 1, w - 2), (h + 5, w + 2), (h, w)]:
        (y,) = run(ops.center_crop((ch, cw)), x)
        padded = np.pad(
            x,
            [
                (0, 0),
                (0, 0),
                ((max(ch - h, 0)) // 2, (max(ch - h, 0) + 1) // 2),
                ((max(cw - w, 0)) // 2, (max(cw - w, 0) + 1) // 2),
            ],
        )
        top, left = (padded.shape[2] - ch) // 2, (padded.shape[3] - cw) // 2
        np.testing.assert_array_equal(y, padded[:, :, top : top + ch, left : left + cw])
    (sq,) = run(ops.center_crop(32, layout="NHWC", dtype="uint8"), nhwc)
    top, left = (h - 32) // 2, (w - 32) // 2
    np.testing.assert_array_equal(sq, nhwc[:, top : top + 32, left : left + 32])


def test_letterbox_fits_pads_and_reports_the_mapping(nhwc):
    h, w = nhwc.shape[1:3]
    size = (96, 128)
    (y, scale, padding) = run(ops.letterbox(size, fill=114, layout="NHWC", dtype="uint8", antialias=True), nhwc)
    s = min(size[0] / h, size[1] / w)
    fitted = (int(np.floor(h * s + 0.5)), int(np.floor(w * s + 0.5)))
    top, left = (size[0] - fitted[0]) // 2, (size[1] - fitted[1]) // 2
    np.testing.assert_allclose(scale, s, rtol=1e-6)
    assert padding.tolist() == [top, left, size[0] - fitted[0] - top, size[1] - fitted[1] - left]
    assert y.shape == (len(nhwc), *size, 3)
    ref = np.full_like(y, 114)
    ref[:, top : top + fitted[0], left : left + fitted[1]] = np.stack(
        [np.asarray(Image.fromarray(img).resize(fitted[::-1], Image.BILINEAR)) for img in nhwc]
    )
    assert np.abs(y.astype(int) - ref).max() <= 3
    # The right edge maps back through (x - left) / scale, within the rounding of the size.
    assert abs(fitted[1] / scale - w) <= 0.5 / scale + 1e-3


# --- heads -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def logits() -> tuple[np.ndarray, np.ndarray]:
    """The shipped digits classifier's scores and labels on scikit-learn's digits."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = ((data.images.reshape(len(data.images), -1) / 16.0 - 0.5) / 0.5).astype(np.float32)
    labels, scores = run(onnx.load(fastseq.ops.shipped.path("digits")), x)
    return scores, labels


@pytest.mark.parametrize("n", [1, 7, 1797])
def test_softmax_argmax_topk_on_classifier_scores(logits, n):
    scores, labels = logits[0][:n], logits[1][:n]
    (p,) = run(ops.softmax(), scores)
    e = np.exp(scores - scores.max(axis=1, keepdims=True))
    np.testing.assert_allclose(p, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    (idx,) = run(ops.argmax(), p)
    np.testing.assert_array_equal(idx, np.argmax(scores, axis=1))
    np.testing.assert_array_equal(idx, labels)  # the classifier's own label
    (kept,) = run(ops.argmax(keepdims=True), scores)
    assert kept.shape == (n, 1)
    values, indices = run(ops.topk(3), p)
    order = np.argsort(-p, axis=1, kind="stable")[:, :3]
    np.testing.assert_array_equal(indices, order)
    np.testing.assert_array_equal(values, np.take_along_axis(p, order, axis=1))
    _, low = run(ops.topk(2, largest=False), scores)
    np.testing.assert_array_equal(low, np.argsort(scores, axis=1, kind="stable")[:, :2])
    (columns,) = run(ops.softmax(axis=0), scores)
    np.testing.assert_allclose(columns.sum(axis=0), 1, rtol=1e-5)


def nms_reference(boxes, scores, iou, score, max_boxes, cxcywh=False):
    """Greedy NMS per image and class: keep a box unless a kept one overlaps it by more
    than ``iou``; only scores above ``score``; at most ``max_boxes``."""
    if cxcywh:
        boxes = np.concatenate([boxes[..., :2] - boxes[..., 2:] / 2, boxes[..., :2] + boxes[..., 2:] / 2], -1)
    lo, hi = np.minimum(boxes[..., :2], boxes[..., 2:]), np.maximum(boxes[..., :2], boxes[..., 2:])

    def overlap(b, i, j):
        inter = np.prod(np.clip(np.minimum(hi[b, i], hi[b, j]) - np.maximum(lo[b, i], lo[b, j]), 0, None))
        union = np.prod(hi[b, i] - lo[b, i]) + np.prod(hi[b, j] - lo[b, j]) - inter
        return inter / union

    selected = []
    for b in range(scores.shape[0]):
        for c in range(scores.shape[1]):
            kept: list[int] = []
            for i in np.argsort(-scores[b, c], kind="stable"):
                if scores[b, c, i] <= score or len(kept) == max_boxes:
                    break
                if all(overlap(b, i, j) <= iou for j in kept):
                    kept.append(int(i))
            selected += [(b, c, i) for i in kept]
    return np.array(selected, np.int64).reshape(-1, 3)


@pytest.mark.parametrize("n", [1, 3])
def test_nms_matches_greedy_reference(n):
    rng = np.random.default_rng(n)
    # Clusters of jittered boxes around a few objects, as a detector proposes them.
    centres = rng.uniform(50, 590, (n, 6, 2))
    xy = np.repeat(centres, 10, axis=1) + rng.normal(0, 6, (n, 60, 2))
    wh = rng.uniform(30, 90, (n, 60, 2))
    boxes = np.concatenate([xy - wh / 2, xy + wh / 2], -1).astype(np.float32)
    boxes[:, ::7] = boxes[:, ::7][..., [2, 3, 0, 1]]  # corners in either order
    scores = rng.uniform(0, 1, (n, 4, 60)).astype(np.float32)
    for iou, score, max_boxes in [(0.5, 0.0, 100), (0.3, 0.4, 3), (0.7, 0.2, 10)]:
        sel, sel_boxes, sel_scores, classes = run(ops.nms(iou, score, max_boxes), boxes, scores)
        expected = nms_reference(boxes, scores, iou, score, max_boxes)
        np.testing.assert_array_equal(sel, expected)
        np.testing.assert_array_equal(sel_boxes, boxes[expected[:, 0], expected[:, 2]])
        np.testing.assert_array_equal(sel_scores, scores[expected[:, 0], expected[:, 1], expected[:, 2]])
        np.testing.assert_array_equal(classes, expected[:, 1])
    centre = np.concatenate([xy, wh], -1).astype(np.float32)
    nbc = np.ascontiguousarray(scores.transpose(0, 2, 1))
    sel, *_ = run(ops.nms(0.45, 0.1, 20, box_format="cxcywh", scores_layout="NBC"), centre, nbc)
    np.testing.assert_array_equal(sel, nms_reference(centre, scores, 0.45, 0.1, 20, cxcywh=True))


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
