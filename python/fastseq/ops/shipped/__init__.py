"""Models shipped with fastseq, usable as ``fastseq.operators.path("digits")`` or by name in
``ONNXSequential("builtin:digits", ...)``: the fixed operators of the first release
(``to_float``, ``resize`` to 32x32, ``normalize``, ``color_head``: ``builtin:NAME`` without
parameters keeps meaning them) and the demo's digits classifier. Operators built to order
are in :mod:`fastseq.ops`; ``build.py`` here writes these files."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent
#: The demo head's classes, in output order.
CLASSES = ("red", "green", "blue")


def names() -> list[str]:
    """The shipped models' names, sorted."""
    return sorted(p.stem for p in HERE.glob("*.onnx"))


def path(name: str) -> Path:
    """The shipped model ``name``'s file; a LoadError with the near miss if there is none."""
    p = HERE / f"{name}.onnx"
    if not p.exists():
        from fastseq._core import did_you_mean
        from fastseq.errors import LoadError

        raise LoadError(f"no built-in operator '{name}'{did_you_mean(name, names())}; built-ins: {', '.join(names())}")
    return p


def sample() -> Path:
    """A small uint8 RGB image [1, 48, 64, 3], mostly red."""
    return HERE / "sample.npy"


def digits_sample() -> Path:
    """Four held-out handwritten digits as uint8 RGB photos [4, 64, 64, 3] (``images``) and
    their ``labels``, in an .npz: the input of ``fastseq demo`` and ``builtin:digits``."""
    return HERE / "digits.npz"
