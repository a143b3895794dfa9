"""What the request path in the core calls once a batch: a served model's pipeline run over
the batch's tensors. The core hands each input's bytes (a joined batch's contiguous buffer,
or one request's own) and its shape; numpy views them without a copy, the pipeline's runner
runs them, and each output goes back as its datatype, shape and bytes. This is the one place
the server enters Python: once a batch, never once a request."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from fastseq.errors import InputError
from fastseq.serving.datatypes import DTYPES


class Refused(Exception):
    """The values of a batch were refused by the pipeline's input rule or by ONNX Runtime:
    the requests' mistake (a 400), not the model's failure."""

    refused_input = True


class BatchRun:
    """Runs batches of a served model (a :class:`~fastseq.serving.model.ServedModel`) on
    ``runner`` (the pipeline's, or the batchers' own session of it)."""

    def __init__(self, runner: Any, inputs: list[Any], outputs: list[Any]) -> None:
        self.runner = runner
        self.inputs = [(t.name, DTYPES[t.datatype], t.datatype == "BYTES") for t in inputs]
        self.outputs = [t.datatype for t in outputs]
        self.names = runner.output_names(None)

    def __call__(self, tensors: list[tuple[Any, tuple[int, ...]]]) -> list[tuple[str, tuple[int, ...], Any]]:
        feeds = {}
        for (name, dtype, strings), (data, shape) in zip(self.inputs, tensors):
            if strings:
                feeds[name] = _strings(data, shape)
                continue
            array = np.frombuffer(data, dtype).reshape(shape)
            # A binary input right after a JSON header of odd length is not aligned for its dtype.
            feeds[name] = array if array.flags.aligned else array.copy()
        runner = self.runner
        try:
            outputs = runner.run_checked(self.names, runner.check_feeds(feeds))
        except InputError as e:
            raise Refused(str(e)) from None
        except Exception as e:
            if type(e.__cause__).__name__ == "InvalidArgument":  # ONNX Runtime refused the values sent
                raise Refused(str(e)) from None
            raise
        return [(datatype, a.shape, _raw(datatype, a)) for datatype, a in zip(self.outputs, outputs)]


def _raw(datatype: str, array: np.ndarray) -> Any:
    """An output's bytes as the protocol carries them (BYTES: each a 4-byte length and its UTF-8)."""
    if datatype == "BYTES":
        parts: list[bytes] = []
        for v in array.reshape(-1).tolist():
            b = v.encode() if type(v) is str else bytes(v)
            parts += (struct.pack("<I", len(b)), b)
        return b"".join(parts)
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def _strings(data: Any, shape: tuple[int, ...]) -> np.ndarray:
    """BYTES elements (the core checked their lengths) as an array of str."""
    raw = memoryview(data)
    count = int(np.prod(shape)) if shape else 1
    values = []
    at = 0
    unpack = struct.Struct("<I").unpack_from
    for _ in range(count):
        (n,) = unpack(raw, at)
        at += 4
        try:
            values.append(str(raw[at : at + n], "utf-8"))
        except UnicodeDecodeError as e:
            raise Refused(f"a BYTES element is not UTF-8 text ({e.reason}); ONNX strings are text") from None
        at += n
    array = np.empty(count, dtype=object)
    array[:] = values
    return array.reshape(shape)
