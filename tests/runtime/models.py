"""Models and inputs that the runtime's tests share: a two-stage chain of scale models,
MatMul chains whose stages' node names clash, a slow model, rows and their comparison, and
fresh processes that run a small pipeline and exit."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import fastseq
from conftest import scale_model

X = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)


def reference(x):
    return np.maximum(np.maximum(2 * x, 0) * 3, 0)


def chain(tmp_path: Path) -> list[str]:
    paths = []
    for k, scale in enumerate((2.0, 3.0)):
        p = tmp_path / f"m{k}.onnx"
        onnx.save(scale_model(scale, shape=("N", 4)), str(p))
        paths.append(str(p))
    return paths


def matmuls(n: int, dim: int = 128, seed: int = 0, batch: str | int | None = "N") -> onnx.ModelProto:
    """``n`` MatMul nodes [batch, dim] x [dim, dim], named mm0, mm1, ... in every model (so the
    names of two such stages clash)."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array((rng.standard_normal((dim, dim)) / np.sqrt(dim)).astype(np.float32), "w")
    nodes, prev = [], "x"
    for k in range(n):
        out = "y" if k == n - 1 else f"h{k}"
        nodes.append(helper.make_node("MatMul", [prev, "w"], [out], name=f"mm{k}"))
        prev = out
    g = helper.make_graph(
        nodes,
        f"mm{n}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, dim])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, dim])],
        [w],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def pipe_processes(folder: Path, body: str, times: int) -> Iterator[subprocess.CompletedProcess[str]]:
    """``times`` fresh Python processes, one after the other, each running ``body`` after
    ``import numpy as np, fastseq``, with ``pipe``, two 8-wide MatMuls (``matmuls(2, dim=8)``,
    saved in ``folder``), and ``x``, ones of shape (2, 8): how each exited."""
    path = folder / "m.onnx"
    onnx.save(matmuls(2, dim=8), path)
    script = (
        f"import numpy as np, fastseq\npipe = fastseq.ONNXSequential({str(path)!r})\nx = np.ones((2, 8), np.float32)\n"
    )
    for _ in range(times):
        yield subprocess.run([sys.executable, "-c", script + body], capture_output=True, text=True, timeout=120)


def light_heavy(**kwargs) -> fastseq.Pipeline:
    """Two stages, the second doing ten times the work of the first."""
    return fastseq.Pipeline(
        {"light": matmuls(1, seed=1), "heavy": matmuls(10, seed=2)}, edges=["light.y -> heavy.x"], **kwargs
    )


# Rows that keep slow_model busy for seconds: 128 rows took 0.08 s on one core here, too close
# to the 0.05 s at which the tests stop a run, and a faster machine's CI let one finish.
SLOW_ROWS = 4096


def slow_input() -> np.ndarray:
    return np.ones((SLOW_ROWS, 128), np.float32)


def slow_model(intra_op_threads: int) -> fastseq.ONNXSequential:
    """3,000 MatMuls by the 128x128 identity (y == x): with slow_input(), seconds of work;
    ONNX Runtime checks terminate between nodes."""
    w = numpy_helper.from_array(np.eye(128, dtype=np.float32), "w")
    nodes, prev = [], "x"
    for k in range(3000):
        nodes.append(helper.make_node("MatMul", [prev, "w"], [f"h{k}"]))
        prev = f"h{k}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    g = helper.make_graph(
        nodes,
        "slow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 128])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 128])],
        [w],
    )
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = intra_op_threads
    return fastseq.ONNXSequential(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), session_options=options
    )


def rows(k: int, dim: int = 128, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((k, dim)).astype(np.float32)


def same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.shape == y.shape and x.dtype == y.dtype
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
