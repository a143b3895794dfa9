"""int8 quantization with ``onnxruntime.quantization``: ``fastseq.quantize.quantize(model,
output, ...)``. The public name of :mod:`fastseq.integrations.quantize`, where the code lives."""

from fastseq.integrations.quantize import QuantizeResult, quantize

__all__ = ["QuantizeResult", "quantize"]
