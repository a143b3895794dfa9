"""Writes the built-in operator models and the demo samples beside this file.

The .onnx files are committed and shipped in the wheel; rerun this after changing one:
    python python/fastseq/ops/shipped/build.py           # everything
    python python/fastseq/ops/shipped/build.py digits    # only the digits classifier + sample
The fixed operators need only onnx and numpy; the digits classifier needs scikit-learn,
skl2onnx and Pillow (the test extra). Names and conventions follow kornia's operators.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).parent
OPSET = [helper.make_opsetid("", 17)]
IR = 8
SIZE = 32  # the resize target and the head's input size
CLASSES = ["red", "green", "blue"]
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def _save(graph: onnx.GraphProto, name: str, doc: str | None) -> None:
    model = helper.make_model(graph, opset_imports=OPSET, ir_version=IR, producer_name="fastseq")
    model.doc_string = doc or ""
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, HERE / f"{name}.onnx")


def to_float() -> None:
    """uint8 images [N, H, W, 3] (HWC, as decoded) -> float32 [N, 3, H, W] in [0, 1]."""
    g = helper.make_graph(
        [
            helper.make_node("Cast", ["input"], ["as_float"], to=TensorProto.FLOAT),
            helper.make_node("Transpose", ["as_float"], ["nchw"], perm=[0, 3, 1, 2]),
            helper.make_node("Div", ["nchw", "scale"], ["output"]),
        ],
        "to_float",
        [helper.make_tensor_value_info("input", TensorProto.UINT8, ["N", "H", "W", 3])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [numpy_helper.from_array(np.array(255.0, np.float32), "scale")],
    )
    _save(g, "to_float", to_float.__doc__)


def resize() -> None:
    """float32 [N, 3, H, W] -> [N, 3, 32, 32], bilinear."""
    g = helper.make_graph(
        [
            helper.make_node("Shape", ["input"], ["shape"], end=2),
            helper.make_node("Concat", ["shape", "hw"], ["sizes"], axis=0),
            helper.make_node("Resize", ["input", "", "", "sizes"], ["output"], mode="linear"),
        ],
        "resize",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 3, SIZE, SIZE])],
        [numpy_helper.from_array(np.array([SIZE, SIZE], np.int64), "hw")],
    )
    _save(g, "resize", resize.__doc__)


def normalize() -> None:
    """float32 [N, 3, H, W] -> (x - mean) / std with the ImageNet statistics."""
    g = helper.make_graph(
        [
            helper.make_node("Sub", ["input", "mean"], ["centered"]),
            helper.make_node("Div", ["centered", "std"], ["output"]),
        ],
        "normalize",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [
            numpy_helper.from_array(np.array(MEAN, np.float32).reshape(1, 3, 1, 1), "mean"),
            numpy_helper.from_array(np.array(STD, np.float32).reshape(1, 3, 1, 1), "std"),
        ],
    )
    _save(g, "normalize", normalize.__doc__)


def color_head() -> None:
    """A small classifier head: normalized [N, 3, 32, 32] -> probabilities [N, 3] of the
    dominant colour (red, green, blue): global average pool, a linear layer, softmax."""
    weight = (np.eye(3, dtype=np.float32) * 4.0 - 1.0) * 2.0
    g = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", ["input"], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["flat"]),
            helper.make_node("Gemm", ["flat", "weight", "bias"], ["logits"], transB=1),
            helper.make_node("Softmax", ["logits"], ["output"], axis=1),
        ],
        "color_head",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", len(CLASSES)])],
        [numpy_helper.from_array(weight, "weight"), numpy_helper.from_array(np.zeros(3, np.float32), "bias")],
    )
    _save(g, "color_head", color_head.__doc__)


def sample() -> None:
    """A 48x64 RGB image, mostly red with a green square: the demo's input."""
    img = np.zeros((1, 48, 64, 3), np.uint8)
    img[..., 0] = 200
    img[..., 1] = 40
    img[..., 2] = 30
    img[:, 10:20, 10:20, :] = (20, 180, 40)
    np.save(HERE / "sample.npy", img)


def digits() -> None:
    """``digits.onnx``: a logistic regression trained on scikit-learn's bundled digits
    (8x8 grey images, 0 to 16), exported with skl2onnx: [N, 64] pixels scaled to [0, 1]
    and normalised with mean 0.5, std 0.5 -> ``label`` [N] and ``logits`` [N, 10] (raw
    scores: their softmax is the model's ``predict_proba``). ``digits.npz``: held-out
    digits as the photos the demo feeds, uint8 RGB [N, 64, 64, 3] (``images``), with their
    ``labels``."""
    from onnx import version_converter
    from PIL import Image
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType, Int64TensorType
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = ((data.images.reshape(len(data.images), -1) / 16.0 - 0.5) / 0.5).astype(np.float32)
    index = np.arange(len(x))
    train, test = train_test_split(index, test_size=0.25, random_state=0, stratify=data.target)
    clf = LogisticRegression(max_iter=5000).fit(x[train], data.target[train])
    print(f"digits: held-out accuracy {clf.score(x[test], data.target[test]):.3f}")
    model = convert_sklearn(
        clf,
        initial_types=[("input", FloatTensorType([None, 64]))],
        final_types=[("label", Int64TensorType([None])), ("logits", FloatTensorType([None, 10]))],
        options={id(clf): {"zipmap": False, "raw_scores": True}},
        target_opset={"": OPSET[0].version, "ai.onnx.ml": 3},
    )
    # skl2onnx stamps the lowest opset its nodes need (9); the stages of a pipeline share one.
    model = version_converter.convert_version(model, OPSET[0].version)
    model.graph.name = "digits"
    # skl2onnx leaves the batch axis unnamed and shape inference calls it unk__0, unk__1:
    # name it N, as the operators do, so that a pipeline's shapes read [N, 10].
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        value.type.tensor_type.shape.dim[0].dim_param = "N"
    model.doc_string = digits.__doc__ or ""
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, HERE / "digits.onnx")

    # One held-out digit of each of four classes, as a camera would give it: upscaled 8x
    # (bicubic), pale yellow ink on a dark background, RGB.
    picks = [next(i for i in test if data.target[i] == c) for c in (3, 0, 7, 4)]
    ink = np.array([255, 235, 180], np.float32)
    images = []
    for i in picks:
        grey = Image.fromarray((data.images[i] * (255 / 16)).astype(np.float32), "F").resize(
            (64, 64), Image.Resampling.BICUBIC
        )
        level = np.clip(np.asarray(grey), 0, 255)[..., None] / 255
        images.append(np.clip(level * ink + (1 - level) * 12, 0, 255).round().astype(np.uint8))
    assert (clf.predict(x[picks]) == data.target[picks]).all()
    np.savez_compressed(HERE / "digits.npz", images=np.stack(images), labels=data.target[picks])


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["digits"]:
        to_float()
        resize()
        normalize()
        color_head()
        sample()
    digits()
    print("wrote", sorted(p.name for p in HERE.iterdir() if p.suffix in (".onnx", ".npy", ".npz")))
