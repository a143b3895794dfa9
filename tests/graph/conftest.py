"""The folder of models the pipeline-file tests write their files beside."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from conftest import scale_model


def two_outputs() -> onnx.ModelProto:
    """x -> (neg = -x, twice = 2x)."""
    g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["neg"]), helper.make_node("Add", ["x", "x"], ["twice"])],
        "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 4]) for n in ("neg", "twice")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def sub_model() -> onnx.ModelProto:
    """(a, b) -> d = a - b."""
    g = helper.make_graph(
        [helper.make_node("Sub", ["a", "b"], ["d"])],
        "sub",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 4]) for n in ("a", "b")],
        [helper.make_tensor_value_info("d", TensorProto.FLOAT, ["N", 4])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    onnx.save(scale_model(2.0, shape=("N", 4)), tmp_path / "a.onnx")
    onnx.save(scale_model(3.0, inp="u", out="v", shape=("N", 4)), tmp_path / "b.onnx")
    onnx.save(two_outputs(), tmp_path / "two.onnx")
    onnx.save(sub_model(), tmp_path / "sub.onnx")
    return tmp_path
