"""IO binding: inputs and outputs bound to buffers once, calls through
``run_with_iobinding`` with nothing converted or copied on the way.

Inputs are bound where they live: numpy arrays, torch tensors (CPU or CUDA) and objects with
``__dlpack__`` or ``__cuda_array_interface__`` by their data pointer, never through
``.cpu().numpy()``. Outputs go into buffers allocated once per input shape and reused by
later calls: numpy arrays on the CPU, torch tensors on the input's device (``outputs="torch"``),
or ONNX Runtime's own ``OrtValue``s (``outputs="ortvalue"``, left where the provider put them).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort

from fastseq.errors import InputError, RunError
from fastseq.runtime.inputs import accepts, converts, dtype_refused
from fastseq.runtime.runner import Runner, compiled_binding_run

_OUTPUT_KINDS = ("numpy", "torch", "ortvalue")


@dataclass(frozen=True)
class _Buffer:
    """Where a tensor lives: what ``bind_input`` / ``bind_output`` take."""

    device: str  # "cpu" or "cuda"
    device_id: int
    dtype: np.dtype
    shape: tuple[int, ...]
    ptr: int


def _torch_dtype_to_numpy(t: Any) -> np.dtype:
    import torch

    table = {
        torch.float32: np.float32,
        torch.float64: np.float64,
        torch.float16: np.float16,
        torch.int8: np.int8,
        torch.int16: np.int16,
        torch.int32: np.int32,
        torch.int64: np.int64,
        torch.uint8: np.uint8,
        torch.bool: np.bool_,
    }
    if t not in table:
        raise InputError(f"torch dtype {t} cannot be bound")
    return np.dtype(table[t])


def buffer_of(name: str, value: Any) -> tuple[_Buffer, Any]:
    """The buffer of a bindable value and the object that keeps it alive. A value whose
    elements are not laid out contiguously in row-major order (a strided view, Fortran order)
    is refused: binding it would bind a copy, and data written into the original in place
    would never reach the pipeline."""
    if isinstance(value, np.ndarray):
        if not value.flags.c_contiguous:
            raise _strided(name, "numpy array", "np.ascontiguousarray(x)")
        return _Buffer("cpu", 0, value.dtype, value.shape, value.ctypes.data), value
    if hasattr(value, "data_ptr") and hasattr(value, "is_contiguous"):  # torch.Tensor
        if not value.is_contiguous():
            raise _strided(name, "torch tensor", "x.contiguous()")
        device = value.device
        return (
            _Buffer(
                "cuda" if device.type == "cuda" else "cpu",
                device.index or 0,
                _torch_dtype_to_numpy(value.dtype),
                tuple(value.shape),
                value.data_ptr(),
            ),
            value,
        )
    cai = getattr(value, "__cuda_array_interface__", None)
    if cai is not None:
        if cai.get("strides") is not None and tuple(cai["strides"]) != _contiguous_strides(cai):
            raise _strided(name, "CUDA array", "a C-contiguous copy (cupy.ascontiguousarray(x))")
        dev = getattr(value, "device", None)
        return _Buffer(
            "cuda", int(getattr(dev, "id", 0) or 0), np.dtype(cai["typestr"]), tuple(cai["shape"]), int(cai["data"][0])
        ), value
    if hasattr(value, "__dlpack__"):
        try:
            array = np.from_dlpack(value)  # zero-copy for CPU memory; refuses device memory
        except (BufferError, RuntimeError, TypeError) as e:
            raise InputError(f"input '{name}': cannot bind a {type(value).__name__} through DLPack: {e}") from e
        if not array.flags.c_contiguous:
            raise _strided(name, f"{type(value).__name__} (DLPack)", "np.ascontiguousarray(x)")
        # The array is a view of the value's memory: keeping both keeps the memory alive.
        return _Buffer("cpu", 0, array.dtype, array.shape, array.ctypes.data), (array, value)
    raise InputError(
        f"input '{name}': cannot bind a {type(value).__name__}; pass a numpy array, a torch tensor or an "
        "object with __dlpack__ / __cuda_array_interface__"
    )


def _where(b: _Buffer) -> str:
    """``float32[2, 4] on cpu``, ``float16[8, 3] on cuda:1``: a bound buffer."""
    device = f"cuda:{b.device_id}" if b.device == "cuda" else b.device
    return f"{b.dtype}[{', '.join(map(str, b.shape))}] on {device}"


def _strided(name: str, what: str, fix: str) -> InputError:
    return InputError(
        f"input '{name}': the {what} is not C-contiguous (a strided view or Fortran order) and cannot be "
        f"bound in place: a copy would be bound, and data written into the original would not reach the "
        f"pipeline; bind {fix} and write into that"
    )


def _contiguous_strides(cai: dict[str, Any]) -> tuple[int, ...] | None:
    itemsize = np.dtype(cai["typestr"]).itemsize
    strides, step = [], itemsize
    for d in reversed(cai["shape"]):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


def check_output_kind(outputs: Any) -> None:
    """``outputs=`` is one of :data:`_OUTPUT_KINDS` (an InputError naming them otherwise)."""
    if not isinstance(outputs, str) or outputs not in _OUTPUT_KINDS:
        raise InputError(f"outputs must be one of {', '.join(map(repr, _OUTPUT_KINDS))}, got {outputs!r}")


class Binding:
    """Inputs and outputs of one session bound once; see :meth:`fastseq.ONNXSequential.bind`.

    ``binding(x)`` (or ``binding(name=x)``) binds new inputs when their buffers changed and
    runs; ``binding.run()`` runs again on the bound buffers (write new data into them in
    place). The arrays returned are the output buffers, overwritten by the next call: copy
    what you keep.

    A binding is for one thread: its bound buffers and reused outputs are one caller's
    state. Threads that call the same pipeline make a binding each (``pipe.bind`` is cheap;
    they share the session, which is safe); a call or ``bind`` entered while another thread
    is in one on the same binding raises :class:`fastseq.RunError` instead of mixing them.
    """

    def __init__(
        self,
        runner: Runner,
        outputs: str = "numpy",
        output_names: Sequence[str] | None = None,
        run_options: ort.RunOptions | None = None,
    ) -> None:
        check_output_kind(outputs)
        self._runner = runner
        self._session = runner.session
        self._iob = self._session.io_binding()
        self._run_bound = compiled_binding_run(self._session, self._iob)
        self._kind = outputs
        # The caller's run options are used as they are (fastseq sets nothing on them).
        self._run_options = run_options if run_options is not None else runner.quiet
        self._names = list(runner.output_names(output_names))
        self._bound: dict[str, tuple[_Buffer, Any]] = {}
        self._out_for: dict[tuple[Any, ...], list[Any]] = {}  # input signature -> output buffers
        self._outputs: list[Any] | None = None
        self._signature: tuple[Any, ...] | None = None
        self._busy = threading.Lock()  # held while a thread binds or runs

    def __repr__(self) -> str:
        ins = []
        for check in self._runner.checks:
            bound = self._bound.get(check.name)
            ins.append(f"{check.name}: " + (_where(bound[0]) if bound else "not bound"))
        infos = {o.name: o for o in self._runner.outputs}
        outs = []
        for k, name in enumerate(self._names):
            if self._signature is not None and self._outputs and self._kind != "ortvalue":
                b, _ = buffer_of(name, self._outputs[k])
                outs.append(f"{name}: {_where(b)}")
            else:
                outs.append(f"{infos[name]} (allocated by the next run)")
        return f"Binding(inputs [{'; '.join(ins)}]; outputs as {self._kind} [{'; '.join(outs)}])"

    # --- binding ------------------------------------------------------------------
    def bind(self, *inputs: Any, **named: Any) -> Binding:
        """Binds inputs (by position or by name) to their buffers; returns the binding."""
        if not self._busy.acquire(False):
            raise _in_use()
        try:
            self._bind(inputs, named)
        finally:
            self._busy.release()
        return self

    def _bind(self, inputs: tuple[Any, ...], named: dict[str, Any]) -> None:
        if inputs and named:
            raise InputError("pass inputs either by position or by name, not both")
        if inputs:
            checks = self._runner.checks
            if len(inputs) != len(checks):
                raise InputError(f"expected {len(checks)} inputs, got {len(inputs)}")
            named = {c.name: x for c, x in zip(checks, inputs)}
        for name, value in named.items():
            self._bind_input(name, value)

    def _bind_input(self, name: str, value: Any) -> None:
        check = self._runner.check_of(name)
        buf, keep = buffer_of(name, value)
        old = self._bound.get(name)
        if old is not None and old[0] == buf:
            self._bound[name] = (buf, keep)
            return
        # The one input rule (runtime/inputs.py), less what only a copy would take: a buffer
        # is bound where it lives.
        if not accepts(check.dtype, buf.dtype):
            if not converts(check.dtype, buf.dtype):
                raise dtype_refused(name, check.dtype, buf.dtype, self._runner.stage_note(name))
            raise InputError(
                f"input '{name}' expects {check.dtype}, got {buf.dtype}: converting it would bind a copy, and data "
                f"written into the original would not reach the pipeline; bind x.astype(np.{check.dtype}) and "
                "write into that"
            )
        error = check.shape_error(buf.shape)
        if error is not None:
            raise error
        self._iob.bind_input(name, buf.device, buf.device_id, buf.dtype, list(buf.shape), buf.ptr)
        self._bound[name] = (buf, keep)
        self._signature = None

    # --- running ------------------------------------------------------------------
    def __call__(self, *inputs: Any, **named: Any) -> list[Any]:
        """Binds the inputs given (re-binding only buffers that changed) and runs."""
        if not self._busy.acquire(False):
            raise _in_use()
        try:
            if inputs or named:
                self._bind(inputs, named)
            return self._run()
        finally:
            self._busy.release()

    def run(self) -> list[Any]:
        """Runs on the bound buffers; returns the output buffers (reused by the next call)."""
        if not self._busy.acquire(False):  # positional: a keyword costs more than the check
            raise _in_use()
        try:
            return self._run()
        finally:
            self._busy.release()

    def _run(self) -> list[Any]:
        if self._signature is None:
            self._prepare_outputs()
        try:
            self._run_bound(self._run_options)
        except Exception as e:
            explained = self._runner.explain(e)
            if explained is e:
                raise
            raise explained from e
        if self._outputs is None:  # shapes not known before the first run
            signature = self._signature
            assert signature is not None  # set by _prepare_outputs
            values = self._iob.get_outputs()
            self._out_for[signature] = self._allocate([v.shape() for v in values])
            self._iob.clear_binding_outputs()
            self._bind_outputs(self._out_for[signature])
            self._outputs = self._out_for[signature]
            # The run's results are in ONNX Runtime's buffers: copy them into ours once.
            for buf, value in zip(self._outputs, values):
                _copy_into(buf, value)
        return self._outputs if self._kind != "ortvalue" else self._iob.get_outputs()

    def _prepare_outputs(self) -> None:
        missing = [c.name for c in self._runner.checks if c.name not in self._bound]
        if missing:
            raise InputError(f"bind every input first; missing: {', '.join(missing)}")
        self._signature = tuple((n, b.device, b.shape) for n, (b, _) in sorted(self._bound.items()))
        self._iob.clear_binding_outputs()
        if self._kind == "ortvalue":
            device, device_id = self._device()
            for n in self._names:
                self._iob.bind_output(n, device, device_id)
            self._outputs = []
            return
        buffers = self._out_for.get(self._signature)
        if buffers is None:
            device, device_id = self._device()
            for n in self._names:  # ONNX Runtime allocates this first time
                self._iob.bind_output(n, device, device_id)
            self._outputs = None
            return
        self._bind_outputs(buffers)
        self._outputs = buffers

    def _device(self) -> tuple[str, int]:
        devices = {(b.device, b.device_id) for b, _ in self._bound.values()}
        cuda = sorted(d for d in devices if d[0] == "cuda")
        if cuda and self._kind != "numpy":
            return cuda[0]
        return ("cpu", 0)

    def _allocate(self, shapes: list[list[int]]) -> list[Any]:
        infos = {o.name: o for o in self._runner.outputs}
        out = []
        device, device_id = self._device()
        for n, shape in zip(self._names, shapes):
            dtype = infos[n].dtype or np.dtype(np.float32)
            if self._kind == "torch":
                import torch

                tdtype = torch.from_numpy(np.empty(0, dtype)).dtype
                dev = torch.device(device, device_id) if device == "cuda" else torch.device("cpu")
                out.append(torch.empty(tuple(shape), dtype=tdtype, device=dev))
            else:
                out.append(np.empty(tuple(shape), dtype))
        return out

    def _bind_outputs(self, buffers: list[Any]) -> None:
        for n, buf in zip(self._names, buffers):
            b, _ = buffer_of(n, buf)
            self._iob.bind_output(n, b.device, b.device_id, b.dtype, list(b.shape), b.ptr)


def _in_use() -> RunError:
    return RunError(
        "this binding is in a call in another thread: a binding's buffers are one thread's; "
        "make one binding per thread with pipe.bind(...)"
    )


def _copy_into(buf: Any, value: ort.OrtValue) -> None:
    """Copies ONNX Runtime's first result into our buffer (only on the first call per shape)."""
    if isinstance(buf, np.ndarray):
        np.copyto(buf, value.numpy())
        return
    import torch

    if value.device_name().lower() == "cpu":
        buf.copy_(torch.from_numpy(value.numpy()))
    else:  # device to device through DLPack where this onnxruntime has it, else via the host
        to_dlpack = getattr(value, "to_dlpack", None)
        buf.copy_(torch.from_dlpack(to_dlpack()) if to_dlpack else torch.from_numpy(value.numpy()))
