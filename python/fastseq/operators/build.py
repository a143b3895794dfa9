"""Writes the built-in operator models and the demo sample beside this file.

The .onnx files are committed and shipped in the wheel; rerun this after changing one:
    python python/fastseq/operators/build.py
Only onnx and numpy are needed. Names and conventions follow kornia's operators.
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


def _save(graph: onnx.GraphProto, name: str, doc: str) -> None:
    model = helper.make_model(graph, opset_imports=OPSET, ir_version=IR, producer_name="fastseq")
    model.doc_string = doc
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


if __name__ == "__main__":
    to_float()
    resize()
    normalize()
    color_head()
    sample()
    print("wrote", sorted(p.name for p in HERE.iterdir() if p.suffix in (".onnx", ".npy")))
