"""IO binding (fastseq.runtime.binding): outputs in reused buffers, DLPack objects and torch
tensors bound in place, OrtValues out, CUDA tensors kept on the device (marked gpu)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import fastseq
from conftest import scale_model
from runtime.models import X, chain, reference


# --- IO binding -------------------------------------------------------------------------------
def test_binding_matches_run_and_reuses_output_buffers(tmp_path):
    pipe = fastseq.ONNXSequential(*chain(tmp_path))
    x = X.copy()
    b = pipe.bind(x)
    assert repr(b) == (
        "Binding(inputs [x: float32[2, 4] on cpu]; outputs as numpy [y: float32[N, 4] (allocated by the next run)])"
    )
    (y1,) = b()
    assert repr(b) == "Binding(inputs [x: float32[2, 4] on cpu]; outputs as numpy [y: float32[2, 4] on cpu])"
    assert "x: not bound" in repr(pipe.bind())
    np.testing.assert_allclose(y1, pipe.get_session().run(None, {"x": x})[0])
    x[:] = -x  # new data in the bound buffer, no rebinding
    (y2,) = b.run()
    assert y2 is y1  # the same output buffer, overwritten
    np.testing.assert_allclose(y2, reference(-X))
    # A new array (another batch size) is bound and gets its own outputs.
    x3 = np.ones((5, 4), np.float32)
    (y3,) = b(x3)
    assert y3.shape == (5, 4) and not np.shares_memory(y3, y1)
    np.testing.assert_allclose(y3, reference(x3))
    (y4,) = b(x)  # back to the first shape: its buffer again
    assert y4 is y1
    with pytest.raises(fastseq.InputError, match="expects float32"):
        b(x.astype(np.float64))


class DLPackOnly:
    """An array known to the binding only by the DLPack protocol."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_binding_takes_dlpack_objects_in_place_and_ortvalues_out(tmp_path):
    pipe = fastseq.ONNXSequential(*chain(tmp_path))
    x = X.copy()
    b = pipe.bind(DLPackOnly(x), outputs="ortvalue")
    (out,) = b()
    assert isinstance(out, ort.OrtValue)
    np.testing.assert_allclose(out.numpy(), reference(X))
    x *= 2  # bound in place: the binding sees the new values
    np.testing.assert_allclose(b()[0].numpy(), reference(2 * X))


@pytest.mark.torch
def test_binding_torch_cpu_tensors_in_place():
    import torch

    pipe = fastseq.ONNXSequential(scale_model(2.0, shape=("N", 4)), scale_model(3.0, shape=("N", 4)))
    x = torch.from_numpy(X.copy())
    b = pipe.bind(x, outputs="torch")
    (y,) = b()
    assert isinstance(y, torch.Tensor)
    np.testing.assert_allclose(y.numpy(), reference(X))
    x.mul_(-1)
    assert b()[0] is y
    np.testing.assert_allclose(y.numpy(), reference(-X))


# --- GPU (marked; skipped without a CUDA provider and a CUDA torch) ------------------------
def _cuda_ready() -> bool:
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_ready(), reason="needs onnxruntime-gpu, a CUDA torch and a GPU")
def test_cuda_binding_keeps_tensors_on_the_device():
    import torch

    pipe = fastseq.ONNXSequential(
        scale_model(2.0, shape=("N", 4)), scale_model(3.0, shape=("N", 4)), providers=["CUDAExecutionProvider"]
    )
    x = torch.from_numpy(X.copy()).cuda()
    b = pipe.bind(x, outputs="torch")
    (y,) = b()
    assert y.is_cuda
    np.testing.assert_allclose(y.cpu().numpy(), reference(X), rtol=1e-6)
    x.mul_(-1)
    assert b()[0].data_ptr() == y.data_ptr()
    np.testing.assert_allclose(y.cpu().numpy(), reference(-X), rtol=1e-6)
