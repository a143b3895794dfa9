"""Models shipped with fastseq, usable as ``fastseq.ops.shipped.path("digits")`` or by name in
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
    if name not in names():  # also a name with a folder in it
        from fastseq._core import did_you_mean
        from fastseq.errors import LoadError

        raise LoadError(f"no built-in operator '{name}'{did_you_mean(name, names())}; built-ins: {', '.join(names())}")
    return p


#: ``builtin:shipped/NAME`` names the shipped file NAME, whatever operator shares its name.
PREFIX = "shipped/"
#: The operators that compute what each first-release file whose name an operator shares
#: computes (``tests/ops/test_ops.py`` runs both): what the deprecation note suggests.
SAME_AS = {
    "to_float": "builtin:to_float? then builtin:layout?src=NHWC&dst=NCHW",
    "resize": "builtin:resize?size=32",
    "normalize": "builtin:normalize?",
}


def named(spec: str) -> Path | None:
    """The shipped file that ``builtin:<spec>`` names, or None where it names an operator
    built to order (``fastseq.ops``). One meaning for each: ``shipped/NAME`` is the file,
    ``NAME?...`` the operator, and a bare ``NAME`` the operator unless only a file has that
    name (``digits``, ``color_head``). A bare name that the first release gave to a file
    and that an operator now has too (``to_float``, ``resize``, ``normalize``) still names
    the file, so that pipelines written then compute what they did, with a FutureWarning
    saying how to write either."""
    name, mark, _ = spec.partition("?")
    if name.startswith(PREFIX):
        if mark:
            from fastseq.errors import OperatorError

            raise OperatorError(
                f"builtin:{spec}: a shipped model takes no parameters; "
                f"builtin:{name[len(PREFIX) :]}?{spec.partition('?')[2]} builds the operator"
            )
        return path(name[len(PREFIX) :])
    if mark or name not in names():
        return None
    if name in SAME_AS:
        import warnings

        from fastseq.ops import _graph

        warnings.warn(
            f"builtin:{name} names the model file that fastseq's first release shipped, and a later release will "
            f"read it as the operator built to order: write builtin:{PREFIX}{name} for the file, or "
            f"{SAME_AS[name]} (the operators that compute the same)",
            FutureWarning,
            stacklevel=_graph.user_stacklevel(),
        )
    return path(name)


def builtin_names() -> list[str]:
    """What ``builtin:`` takes besides the operators' names: the shipped files, by their
    own names (``shipped/NAME``) and by the names no operator has."""
    return [f"{PREFIX}{n}" for n in names()] + [n for n in names() if n not in SAME_AS]


def sample() -> Path:
    """A small uint8 RGB image [1, 48, 64, 3], mostly red."""
    return HERE / "sample.npy"


def digits_sample() -> Path:
    """Four held-out handwritten digits as uint8 RGB photos [4, 64, 64, 3] (``images``) and
    their ``labels``, in an .npz: the input of ``fastseq demo`` and ``builtin:digits``."""
    return HERE / "digits.npz"
