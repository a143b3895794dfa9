"""Built-in operator models shipped with fastseq, usable as ``fastseq.operators.path("resize")``
or by name in ``ONNXSequential("builtin:resize", ...)``; ``fastseq demo`` chains them."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent
#: The demo head's classes, in output order.
CLASSES = ("red", "green", "blue")


def names() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.onnx"))


def path(name: str) -> Path:
    p = HERE / f"{name}.onnx"
    if not p.exists():
        from fastseq._core import did_you_mean
        from fastseq.errors import LoadError

        raise LoadError(f"no built-in operator '{name}'{did_you_mean(name, names())}; built-ins: {', '.join(names())}")
    return p


def sample() -> Path:
    """A small uint8 RGB image [1, 48, 64, 3], mostly red."""
    return HERE / "sample.npy"
