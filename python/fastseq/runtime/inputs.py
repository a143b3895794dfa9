"""The one input rule, for every entry point: ``pipe(x)``, ``run``, ``run_async``, the
batcher, IO binding and Ray's ``map_batches``.

An input takes an array of its own dtype as it is, and one whose dtype converts to it
without changing any value (numpy's ``can_cast(given, expected, "safe")``: int32 to int64,
float16 to float32, bool to a number; numpy counts int64 to float64 as safe too), converted
once. Any other dtype is an :class:`~fastseq.errors.InputError` naming the input, the stage
that reads it and both dtypes: a cast that changes values would change what the pipeline
computes, so it is the caller's to make. A string input takes str or object arrays. Lists
and scalars carry no dtype of their own: they take the input's, unless a value would change
(1.5 or 300 for a uint8 input); anything numpy cannot read as numbers (``"abc"`` for a float
input, None, ragged lists) is an InputError. An input declared without a shape takes any
shape; a declared one takes its rank, and its fixed sizes on their axes. Every input must
be given, and nothing else.

IO binding binds buffers where they live, without a copy: it takes the same dtypes, ranks
and sizes, and refuses what only a copy would take (a cast, a strided view, a list), since
data written into the original afterwards would not reach the pipeline. Ray's columns feed
inputs by name: columns that feed no input pass through."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np

from fastseq import _core
from fastseq.errors import InputError
from fastseq.runtime.tensors import TensorInfo

#: what :func:`stage_note` says of an input: the stages that read it, in their own names
Reader = Callable[[str], str]


def accepts(expected: np.dtype | None, got: np.dtype) -> bool:
    """Whether an input declared ``expected`` takes an array of ``got`` as it is (strings
    as str or object arrays)."""
    return expected is None or got == expected or (expected.kind == "U" and got.kind in "UO")


def converts(expected: np.dtype | None, got: np.dtype) -> bool:
    """Whether an input declared ``expected`` takes an array of ``got``, as it is or
    converted without changing a value (numpy's safe casts): the rule, for every entry point."""
    return accepts(expected, got) or (
        expected is not None and expected.kind not in "UO" and np.can_cast(got, expected, "safe")
    )


def dtype_refused(name: str, expected: np.dtype | None, got: Any, note: str = "") -> InputError:
    """The error for an array of ``got`` given to input ``name`` of ``expected`` (``note``:
    :func:`stage_note`'s)."""
    return InputError(
        f"input '{name}' expects {expected}, got {got}, which does not convert without changing values"
        f"{note}; convert it if that is meant: x.astype(np.{expected})"
    )


def stage_note(name: str, reader: Reader | None) -> str:
    """`` (stage a reads it as 'x')`` for an input, where the pipeline knows its stages."""
    if reader is None:
        return ""
    try:
        note = reader(name)
    except Exception:  # noqa: BLE001 - an error message must not fail on its way out
        return ""
    return f" ({note})" if note else ""


@dataclass(frozen=True)
class InputCheck:
    """One input's checks, computed once per session: what a call compares against. ``ndim``
    is None for an input declared without a shape (any shape is taken)."""

    name: str
    dtype: np.dtype | None
    ndim: int | None
    static: tuple[tuple[int, int], ...]  # (axis, size) for each fixed dimension
    shape: tuple[int | str | None, ...] | None = None  # as declared, for messages
    # The fixed sizes read out of a shape in one C call, and what they must be: a call's
    # check costs a fraction of a generator over ``static``.
    fixed_of: Callable[[tuple[int, ...]], Any] | None = None
    fixed: Any = None

    @classmethod
    def of(cls, info: TensorInfo) -> InputCheck:
        static = tuple((axis, d) for axis, d in enumerate(info.shape or ()) if isinstance(d, int) and d > 0)
        ndim = len(info.shape) if info.shape is not None else None
        if not static:
            return cls(info.name, info.dtype, ndim, static, info.shape)
        sizes = tuple(size for _, size in static)
        return cls(
            info.name,
            info.dtype,
            ndim,
            static,
            info.shape,
            itemgetter(*(axis for axis, _ in static)),
            sizes[0] if len(sizes) == 1 else sizes,
        )

    def shape_error(self, shape: tuple[int, ...]) -> InputError | None:
        """What is wrong with an array of ``shape`` for this input, or None."""
        if self.ndim is not None and len(shape) != self.ndim:
            return InputError(
                f"input '{self.name}' expects rank {self.ndim} {list(self.shape or ())}, got shape {list(shape)}"
            )
        for axis, size in self.static:
            if shape[axis] != size:
                return InputError(
                    f"input '{self.name}' expects size {size} on axis {axis} {list(self.shape or ())}, "
                    f"got shape {list(shape)}"
                )
        return None


def as_array(name: str, value: Any, dtype: np.dtype | None, reader: Reader | None = None) -> np.ndarray:
    """``value`` as an array of the input's dtype, by the rule (see the module)."""
    if type(value) is not np.ndarray:
        value = _from_value(name, value, dtype)
    if accepts(dtype, value.dtype):
        return value
    if not converts(dtype, value.dtype):
        raise dtype_refused(name, dtype, value.dtype, stage_note(name, reader))
    return value.astype(dtype)  # every value converts exactly


def _from_value(name: str, value: Any, dtype: np.dtype | None) -> np.ndarray:
    if isinstance(value, np.ndarray):  # a subclass (np.matrix, a masked array): its data
        return np.asarray(value)
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor, as kornia takes
        return value.detach().cpu().numpy()
    try:
        given = np.asarray(value)
    except (ValueError, TypeError) as e:  # ragged lists and the like
        raise InputError(
            f"input '{name}' expects {_kind(dtype)}; got a {type(value).__name__} numpy cannot read: {e}"
        ) from None
    if given.dtype.kind not in "biuf" or dtype is None or dtype.kind == "U":
        # Strings for a string input, arrays for an input of unknown type; nothing else
        # converts to numbers without a guess (None would become NaN).
        if dtype is None or (dtype.kind == "U" and given.dtype.kind in "UO"):
            return given
        raise InputError(f"input '{name}' expects {_kind(dtype)}, got a {type(value).__name__} ({given.dtype})")
    # Lists and scalars carry no dtype of their own: they take the input's, unless a value
    # would change on the way (1.5 or 300 for a uint8 input).
    if dtype.kind not in "biu":
        return given.astype(dtype)
    with np.errstate(all="ignore"):  # a NaN or an overflow is caught below
        array = given.astype(dtype)
    if not np.array_equal(array, given):
        raise InputError(f"input '{name}' expects {dtype}, and the values given ({given.dtype}) do not all fit it")
    return array


def _kind(dtype: np.dtype | None) -> str:
    return "an array" if dtype is None else f"{dtype} values"


def check_feeds(
    inputs: list[TensorInfo], checks: Mapping[str, InputCheck], feeds: Any, reader: Reader | None = None
) -> dict[str, np.ndarray]:
    """The feeds of a call by input name, checked and converted by the rule."""
    if type(feeds) is not dict and not isinstance(feeds, Mapping):
        raise InputError(
            f"feeds must map input names to arrays, got a {type(feeds).__name__}; inputs: "
            + ", ".join(map(str, inputs))
        )
    for name in feeds:
        if name not in checks:
            raise InputError(
                f"'{name}' is not an input{_core.did_you_mean(str(name), list(checks))}; inputs: "
                + ", ".join(map(str, inputs))
            )
    if len(feeds) != len(checks):
        missing = [i.name for i in inputs if i.name not in feeds]
        raise InputError(f"missing input{'s' if len(missing) > 1 else ''}: {', '.join(missing)}")
    checked: dict[str, np.ndarray] = {}
    for name, value in feeds.items():
        check = checks[name]
        array = as_array(name, value, check.dtype, reader)
        error = check.shape_error(array.shape)
        if error is not None:
            raise error
        checked[name] = array
    return checked
