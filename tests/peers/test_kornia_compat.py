"""Side by side with kornia 0.9's ONNXSequential: the same pipelines give the same outputs.

kornia imports torch, a multi-GB install, so this group is marked ``torch`` and left out
of the default run; ``benches/`` installs both, or run it by hand:
    pip install kornia==0.9.0 && python -m pytest -m torch
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest

import fastseq
from conftest import FIXTURES, scale_model

pytestmark = pytest.mark.torch

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    kornia_onnx = pytest.importorskip("kornia.onnx")


def both(*models, **kw):
    return kornia_onnx.ONNXSequential(*models, **kw), fastseq.ONNXSequential(*models, **kw)


def test_builtin_image_pipeline_from_paths():
    paths = [str(fastseq.ops.shipped.path(n)) for n in ("to_float", "resize", "normalize", "color_head")]
    k, f = both(*paths)
    image = np.load(fastseq.ops.shipped.sample())
    np.testing.assert_allclose(f(image)[-1], k(image)[-1], rtol=1e-6, atol=1e-7)


def test_torch_exports_with_io_maps():
    backbone = onnx.load(str(FIXTURES / "torch_cnn_backbone.onnx"))
    head = onnx.load(str(FIXTURES / "torch_head.onnx"))
    k, f = both(backbone, head, io_maps=[[("features", "features")]])
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    np.testing.assert_allclose(f(x)[-1], k(x)[-1], rtol=1e-5, atol=1e-6)
    # kornia keeps prefixed names; fastseq keeps the user's.
    assert [o.name for o in k.get_session().get_outputs()][-1].startswith("K01-")
    assert [o.name for o in f.outputs] == ["logits"]


def test_auto_version_conversion():
    a = scale_model(2.0, opset=13, ir=7, inp="input", out="output")
    b = scale_model(3.0, opset=17, ir=8, inp="input", out="output")
    k, f = both(a, b, auto_ir_version_conversion=True)
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_allclose(f(x)[-1], k(x)[-1])


def test_kornia_warns_on_a_type_mismatch_where_fastseq_refuses():
    a = scale_model(2.0, inp="input", out="output")
    b = scale_model(2.0, inp="input", out="output", dtype=onnx.TensorProto.DOUBLE)
    with pytest.raises(fastseq.CompositionError, match="element type mismatch"):
        fastseq.ONNXSequential(a, b)
    with pytest.raises(Exception), warnings.catch_warnings():  # noqa: B017 - kornia raises whatever ONNX Runtime does
        warnings.simplefilter("ignore")
        kornia_onnx.ONNXSequential(a, b)(np.ones((2, 4), np.float32))
