"""Opset and IR version harmonisation, delegated to onnx.version_converter.

The converter never needs the weights, so it gets a copy without them: large tensors are
taken out before and put back after, which keeps the protobuf it sees small (and under the
2 GB limit) whatever the model's size."""

from __future__ import annotations

import re

import onnx
import onnx.version_converter

from fastseq import _core
from fastseq.errors import ConversionError

# Tensors smaller than this stay in place: shape and axes constants that adapters read.
_KEEP_BYTES = 1024


def default_opset(opsets: list[tuple[str, int]]) -> int:
    for domain, version in opsets:
        if domain in ("", "ai.onnx"):
            return version
    return 0


def convert_opset(model: _core.Composed, source: int, target: int, label: str) -> _core.Composed:
    """Converts the default-domain opset of ``model`` from ``source`` to ``target``."""
    if source in (target, 0):
        return model
    stripped = onnx.ModelProto.FromString(model.stripped_bytes(_KEEP_BYTES))
    try:
        converted = onnx.version_converter.convert_version(stripped, target)
    except Exception as e:  # the converter raises RuntimeError, ValueError or its own
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        blocker = _blocking_op(stripped, text)
        blocked = f" (blocked by operator {blocker})" if blocker else ""
        raise ConversionError(f"{label}: cannot convert from opset {source} to {target}{blocked}: {text}") from e
    # A newer opset may need a newer IR version than the model had.
    needed = onnx.helper.find_min_ir_version_for(list(converted.opset_import), ignore_unknown=True)
    converted.ir_version = max(converted.ir_version, needed)
    return model.with_weights(converted.SerializeToString(), label)


def _blocking_op(model: onnx.ModelProto, message: str) -> str | None:
    """The operator the converter's message is about: one of the model's own op types that
    the message names ("No Adapter For Relu", "adapt_upsample_9_8: ..."), longest first."""
    lowered = message.lower()
    ops = {n.op_type for n in model.graph.node}
    named = [op for op in ops if re.search(rf"(?<![a-z]){op.lower()}(?![a-z])", lowered)]
    return max(named, key=len) if named else None


def harmonise(
    models: list[_core.Composed], labels: list[str], target: int | None
) -> list[_core.Composed]:
    """Brings every model to one default-domain opset: ``target``, else the highest."""
    versions = [default_opset(m.summary()["opsets"]) for m in models]
    goal = target if target is not None else max(versions)
    return [convert_opset(m, v, goal, label) for m, v, label in zip(models, versions, labels)]
