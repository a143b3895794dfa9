"""What every operator builder shares: parameter checks, dtypes, layouts, and the small
graph builder that turns a few nodes into a model.

Neither onnx nor numpy is imported here: the model's bytes are written by :mod:`._proto`,
so that building a first operator costs milliseconds, not the 1-2 s of ``import onnx``.
"""

from __future__ import annotations

import copy
import functools
import math
import struct
import sys
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any, ParamSpec

from fastseq.errors import OperatorError
from fastseq.ops import _proto
from fastseq.ops.operator import Operator, Tensor

#: The default-domain opset of the models built, unless an option needs a later one or the
#: caller passes ``opset=``. 17 is what ``torch.onnx.export`` writes by default, and the
#: opset of the shipped ``builtin:`` models: stages must share one opset to compose.
DEFAULT_OPSET = 17
#: The earliest opset an operator is built at: 11 is where Resize takes the output size, Pad
#: and Slice their pads and bounds as inputs, TopK its k as an input, and where
#: NonMaxSuppression's and GatherND's forms stand (torch.onnx.export's default for years,
#: so many exported models import it). Where an op took its current form later (ReduceSum's
#: axes and Resize's optional roi and scales in 13, Softmax's one axis in 13, integer Max in
#: 12), :class:`Graph` writes the earlier form that computes the same.
MIN_OPSET = 11
#: The lowest IR version that carries each opset (onnx.helper.VERSION_TABLE): the models
#: are written with it, as ``onnx.helper.find_min_ir_version_for`` picks. Its last key is
#: the latest opset an operator can be built at.
IR_FOR_OPSET = {
    11: 6,
    12: 7,
    13: 7,
    14: 7,
    15: 8,
    16: 8,
    17: 8,
    18: 8,
    19: 9,
    20: 9,
    21: 10,
    22: 10,
    23: 11,
    24: 12,
    25: 13,
    26: 13,
    27: 13,
    28: 14,
}
LATEST_OPSET = max(IR_FOR_OPSET)

#: ONNX element types used in Cast nodes and declarations (TensorProto.FLOAT, .INT64).
FLOAT, INT64 = 1, 7
#: Element types the operators accept, by numpy name.
FLOATS = ("float16", "float32", "float64")
INTEGERS = ("uint8", "int8", "uint16", "int16", "int32", "int64")
#: The range of each integer type (numpy.iinfo's min and max).
INT_RANGE = {
    "uint8": (0, 255),
    "int8": (-128, 127),
    "uint16": (0, 65535),
    "int16": (-32768, 32767),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
}


def fail(op: str, message: str) -> OperatorError:
    """The error to raise for operator ``op``; the message names the parameter."""
    return OperatorError(f"{op}: {message}")


P = ParamSpec("P")


def parameters(f: Callable[..., Any]) -> tuple[list[str], int, set[str]]:
    """An operator's parameter names, how many may be positional, and those without a
    default (from its code object: ``inspect`` costs more to import than a build)."""
    f = getattr(f, "__wrapped__", f)
    code = f.__code__
    positional = code.co_argcount
    names = list(code.co_varnames[: positional + code.co_kwonlyargcount])
    defaults = len(f.__defaults__ or ())
    required = set(names[: positional - defaults]) | {
        n for n in names[positional:] if n not in (f.__kwdefaults__ or {})
    }
    return names, positional, required


def check_arguments(
    f: Callable[..., Any], args: tuple[Any, ...], params: dict[str, Any], where: str, example: str
) -> None:
    """An OperatorError, with the near miss, unless ``f(*args, **params)`` names only its
    parameters, gives each one once, no more positional arguments than it takes and every
    one it needs (``example``: how to give one, ``{}`` standing for its name). A TypeError
    from the call itself would not say which operator, nor what was meant."""
    name = getattr(f, "__name__", where)
    at = f"{where}: {name}" if where else name
    known, positional, required = parameters(f)
    for key in params:
        if key not in known:
            raise OperatorError(f"{at} has no parameter '{key}'{near(key, known)}; parameters: {', '.join(known)}")
    if len(args) > positional:
        raise OperatorError(f"{at} takes at most {positional} positional arguments, got {len(args)}")
    twice = [k for k in known[: len(args)] if k in params]
    if twice:
        raise OperatorError(f"{at} got {twice[0]} twice (by position and by name)")
    given = set(known[: len(args)]) | set(params)
    missing = [n for n in known if n in required and n not in given]
    if missing:
        raise OperatorError(f"{at} needs {', '.join(missing)} (e.g. {example.format(missing[0])})")


def operator(f: Callable[P, Operator]) -> Callable[P, Operator]:
    """Makes an operator builder check its arguments as ``builtin:`` strings are checked: a
    misspelt keyword is an OperatorError with the near miss (``keep_aspects`` -> did you
    mean 'keep_aspect'), not a bare TypeError."""

    @functools.wraps(f)
    def build(*args: P.args, **params: P.kwargs) -> Operator:
        check_arguments(f, args, params, "", f.__name__ + "({}=...)")
        model = f(*args, **params)
        # A copy: a list the caller edits later must not change what builds it again.
        model.recipe = (f.__name__, *copy.deepcopy((args, params)))
        return model

    return build


def user_stacklevel() -> int:
    """The ``stacklevel`` of the first caller outside fastseq, for warnings.warn called by
    the caller of this function: a warning points at the user's code."""
    frame: FrameType | None = sys._getframe(2)
    level = 2
    while frame is not None and frame.f_globals.get("__name__", "").startswith("fastseq"):
        frame, level = frame.f_back, level + 1
    return level


def near(name: str, candidates: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` or nothing."""
    from fastseq._core import did_you_mean

    return did_you_mean(name, list(candidates))


def choice(op: str, param: str, value: Any, allowed: Sequence[str], aliases: dict[str, str] | None = None) -> str:
    """``value`` as spelled in ``allowed`` (case-insensitive; ``aliases`` map other spellings)."""
    by_lower = {a.lower(): a for a in allowed}
    text = value.lower() if isinstance(value, str) else None
    if text is not None and aliases and text in aliases:
        text = aliases[text]
    if text not in by_lower:
        hint = near(str(value), [*allowed, *(aliases or ())])
        raise fail(op, f"{param} must be one of {', '.join(allowed)}, got {value!r}{hint}")
    return by_lower[text]


#: The largest magnitude a float32 constant holds: larger parameters would become inf.
FLOAT32_MAX = 3.4028234663852886e38
#: The int64 range: every integer parameter ends up in an int64 constant or attribute.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: More axes than any tensor has (numpy's own limit is 64).
MAX_RANK = 32


def number(op: str, param: str, value: Any, *, positive: bool = False, nonzero: bool = False) -> float:
    """A finite real number that a float32 constant holds (bools refused: ``True`` is not a
    scale)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(op, f"{param} must be a finite number, got {value!r}")
    try:
        real = float(value)
    except OverflowError:  # an int beyond any float
        real = math.inf
    if not math.isfinite(real) or abs(real) > FLOAT32_MAX:
        shown = value if isinstance(value, float) or abs(value) < 10**20 else f"an integer of {len(str(value))} digits"
        raise fail(op, f"{param} must be a finite number within float32's range (±{FLOAT32_MAX:.4g}), got {shown}")
    if positive and real <= 0:
        raise fail(op, f"{param} must be positive, got {value!r}")
    if nonzero and real == 0:
        raise fail(op, f"{param} must not be zero")
    return real


def _numpy_integer(value: Any) -> bool:
    """A numpy integer scalar (numpy is loaded already if the caller made one)."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.integer)


def integer(op: str, param: str, value: Any, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """An int within int64's range (a float with an integral value is refused: 224.5 pixels
    is a mistake)."""
    if isinstance(value, bool) or not (isinstance(value, int) or _numpy_integer(value)):
        raise fail(op, f"{param} must be an integer, got {value!r}")
    value = int(value)
    low = INT64_MIN if minimum is None else minimum
    high = INT64_MAX if maximum is None else maximum
    if value < low:
        raise fail(op, f"{param} must be at least {low}, got {_int_text(value)}")
    if value > high:
        raise fail(op, f"{param} must be at most {high}, got {_int_text(value)}")
    return value


def _int_text(value: int) -> str:
    return str(value) if abs(value) < 10**30 else f"an integer of {len(str(abs(value)))} digits"


def flag(op: str, param: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise fail(op, f"{param} must be True or False, got {value!r}")
    return value


#: struct's code for each float type: how a Python float is rounded to it.
_PACK = {"float16": "e", "float32": "f", "float64": "d"}
#: The smallest normal magnitude of each float type. Below it a number is subnormal: it
#: keeps few digits, its reciprocal may be inf (1/1e-45 in float32), and it reads as 0
#: where subnormals are flushed to zero (ONNX Runtime's session.set_denormal_as_zero).
SMALLEST_NORMAL = {"float16": 2.0**-14, "float32": 2.0**-126, "float64": 2.0**-1022}


def in_dtype(value: float, dtype: str) -> float:
    """``value`` as a ``dtype`` value holds it: rounded, and ±inf beyond its range."""
    code = _PACK[dtype]
    try:
        return struct.unpack(code, struct.pack(code, float(value)))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def held_in(op: str, param: str, values: Sequence[float], dtype: str, *, nonzero: bool = False) -> None:
    """Checks that ``values`` keep their meaning as ``dtype`` constants: finite there (1e5 is
    inf in float16) and, with ``nonzero`` (a divisor), not rounded to 0 (``1e-46`` is 0 in
    float32): a model of ``inf`` or ``nan`` constants computes nothing useful."""
    for v in values:
        held = in_dtype(v, dtype)
        if not math.isfinite(held):
            raise fail(op, f"{param} must be within {dtype}'s range, got {v!r}")
        if nonzero and held == 0:
            raise fail(
                op,
                f"{param} must not be zero: {v!r} is 0 in {dtype} (its smallest normal value is "
                f"{SMALLEST_NORMAL[dtype]:.4g})",
            )


def normal(op: str, param: str, values: Sequence[float], dtype: str) -> None:
    """Refuses a divisor or scale that is subnormal in ``dtype`` (its reciprocal may still be
    finite, 1/5e-39 in float32): where subnormals are flushed to zero it is 0, and the
    model's output inf or 0."""
    tiny = SMALLEST_NORMAL[dtype]
    for v in values:
        held = in_dtype(v, dtype)
        if held != 0 and abs(held) < tiny:
            raise fail(
                op,
                f"{param} must be at least {tiny:.4g} in magnitude in {dtype}, got {v!r}: it is "
                f"subnormal there, and reads as 0 where subnormals are flushed to zero "
                "(session.set_denormal_as_zero)",
            )


def finite(op: str, param: str, result: float, dtype: str, computes: str, how: str) -> None:
    """Refuses ``param`` when what the model ``computes`` with it, ``result`` (worked out as
    ``how`` says, in ``dtype``), is not finite: the check is on the model's arithmetic, not on
    the Python number (1e-45 is not 0, but a float32 model dividing by it outputs inf)."""
    if not math.isfinite(in_dtype(result, dtype)):
        raise fail(
            op,
            f"{param} must keep the model's values finite in {dtype}: it computes {computes}, and "
            f"{how} is {in_dtype(result, dtype)} there",
        )


def numbers(op: str, param: str, value: Any, **checks: bool) -> list[float]:
    """One number or a sequence of them, as a non-empty list."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise fail(op, f"{param} must not be empty")
    return [number(op, param, v, **checks) for v in items]


def size2(op: str, value: Any, param: str = "size") -> tuple[int, int]:
    """``224`` or ``(height, width)`` as two positive ints."""
    items = list(value) if isinstance(value, (list, tuple)) else [value, value]
    if len(items) != 2:
        raise fail(op, f"{param} must be an int or (height, width), got {value!r}")
    h, w = (integer(op, param, v, minimum=1) for v in items)
    return h, w


def dtype(op: str, value: Any, allowed: Sequence[str]) -> tuple[str, int]:
    """A numpy-style dtype (``"uint8"``, ``np.float32`` ...) as (numpy name, ONNX elem type).
    numpy reads any spelling but the plain names (``"f4"``, ``np.float32``), which need no
    import of it."""
    if isinstance(value, str) and value in _proto.ELEM:
        name = value
    else:
        import numpy as np

        try:
            name = np.dtype(value).name
        except TypeError:
            hint = near(str(value), allowed)
            raise fail(op, f"dtype must be one of {', '.join(allowed)}, got {value!r}{hint}") from None
    if name not in allowed:
        raise fail(op, f"dtype must be one of {', '.join(allowed)}, got {name}")
    return name, _proto.ELEM[name]


def image_layout(op: str, value: Any) -> str:
    """ "NCHW" or "NHWC": where the channel axis of a batch of images is."""
    return choice(op, "layout", value, ("NCHW", "NHWC"))


def letters(op: str, param: str, value: Any) -> str:
    """A layout string such as "NHWC": distinct letters, one per axis."""
    if not isinstance(value, str) or not value.isalpha() or len(set(value.upper())) != len(value):
        raise fail(op, f"{param} must name each axis with one distinct letter, such as 'NCHW', got {value!r}")
    return value.upper()


def opset(op: str, value: Any, needed: int = MIN_OPSET, why: str = "") -> int:
    """The opset to build at: ``value``, or the default raised to what the options need."""
    if value is None:
        return max(DEFAULT_OPSET, needed)
    version = integer(op, "opset", value)
    if version < MIN_OPSET:
        raise fail(
            op,
            f"opset must be between {MIN_OPSET} and {LATEST_OPSET}, got {version}: opset {version} lacks "
            f"the forms of the ops that operators are built from (Resize with an output size, Pad and "
            f"Slice with their bounds as inputs, TopK with k as an input arrived in opsets 10 and 11); "
            f"convert the model to opset {MIN_OPSET} or later instead",
        )
    if version > LATEST_OPSET:
        raise fail(op, f"opset must be between {MIN_OPSET} and {LATEST_OPSET}, got {version}")
    if version < needed:
        raise fail(op, f"{why} needs opset {needed} or later, got opset={version}")
    return version


def call_text(op: str, params: dict[str, Any]) -> str:
    """``fastseq.ops.resize(size=(224, 224), mode='linear')``: the model's doc_string."""
    return f"fastseq.ops.{op}({', '.join(f'{k}={v!r}' for k, v in params.items())})"


class Graph:
    """Collects nodes and constants, naming every value ``<op>/<kind>_<n>`` so that a
    model reads well in Netron; the core renames on clashes anyway.

    ``nodes`` holds ``(op_type, inputs, outputs, name, attributes)`` and ``constants``
    ``(name, dtype, dims, flat values)``: a description that :meth:`model` encodes (and
    that the tests build again with onnx.helper, to compare)."""

    def __init__(self, op: str, version: int) -> None:
        self.op = op
        #: The default-domain opset the model is built at: the helpers below write each op in
        #: the form that opset defines.
        self.version = version
        self.nodes: list[tuple[str, list[str], list[str], str, dict[str, Any]]] = []
        self.constants: list[tuple[str, str, list[int], list[float | int]]] = []
        self._count = 0

    def _name(self, kind: str) -> str:
        self._count += 1
        return f"{self.op}/{kind}_{self._count}"

    def const(self, values: Any, dtype: str, dims: Sequence[int] = (), kind: str = "const") -> str:
        """A constant of ``dtype`` with ``dims`` (a scalar by default) holding ``values``
        (one number, or a flat sequence in row-major order)."""
        flat = list(values) if isinstance(values, (list, tuple)) else [values]
        count = math.prod(dims)
        if len(flat) != count:
            raise AssertionError(f"{kind}: {len(flat)} values for dims {list(dims)}")
        if dtype not in FLOATS:  # an integer type holds ints (a fill of 114.0 is 114)
            flat = [int(v) for v in flat]
        name = self._name(kind)
        self.constants.append((name, dtype, list(dims), flat))
        return name

    def ints(self, values: int | Sequence[int], kind: str = "ints") -> str:
        """An int64 constant: a scalar, or a 1-D tensor from a list."""
        if isinstance(values, int):
            return self.const(values, "int64", (), kind)
        return self.const(list(values), "int64", (len(values),), kind)

    def scalar(self, value: float, dtype: str = "float32", kind: str = "scalar") -> str:
        return self.const(value, dtype, (), kind)

    def node(self, op_type: str, inputs: Sequence[str], outputs: int | Sequence[str] = 1, **attrs: Any) -> Any:
        """Adds a node; returns its output name (or the list of them when several)."""
        names = [self._name(op_type) for _ in range(outputs)] if isinstance(outputs, int) else list(outputs)
        self.nodes.append((op_type, list(inputs), names, self._name(f"{op_type}_node"), attrs))
        return names[0] if len(names) == 1 else names

    def reduce(self, op_type: str, x: str, axes: Sequence[int], keepdims: int) -> str:
        """``op_type`` (ReduceSum, ReduceMax ...) of ``x`` over ``axes``: the axes an input
        from the opset where that op took them so (ReduceSum 13, the others 18), an
        attribute before."""
        if self.version >= (13 if op_type == "ReduceSum" else 18):
            return self.node(op_type, [x, self.ints(list(axes), "axis")], keepdims=keepdims)
        return self.node(op_type, [x], axes=list(axes), keepdims=keepdims)

    def int_max(self, a: str, b: str) -> str:
        """The larger of two integer tensors, element by element: Max from opset 12 (before
        it, Max takes floats only), ``Where(a < b, b, a)`` before."""
        if self.version >= 12:
            return self.node("Max", [a, b])
        return self.node("Where", [self.node("Less", [a, b]), b, a])

    def resize(self, x: str, sizes: str, outputs: int | Sequence[str] = 1, **attrs: Any) -> str:
        """Resize of ``x`` to ``sizes`` (int64, one per axis). From opset 13 its roi and
        scales may be left out (empty names); before, both are required inputs, and given
        empty (with sizes, Resize 11 reads neither)."""
        if self.version >= 13:
            return self.node("Resize", [x, "", "", sizes], outputs, **attrs)
        empty = self.const([], "float32", [0], "empty")
        return self.node("Resize", [x, empty, empty, sizes], outputs, **attrs)

    def model(self, call: str, inputs: Sequence[Tensor], outputs: Sequence[Tensor], version: int) -> Operator:
        """The finished operator: the model (IR version the lowest that the opset allows)
        and what it declares. ``version`` is the graph's own (the nodes were written for it)."""
        from fastseq._core import __version__

        assert version == self.version, (version, self.version)

        data = _proto.model(
            self.op,
            [_proto.node(*n) for n in self.nodes],
            [_proto.tensor(*c) for c in self.constants],
            [_proto.value_info(t.name, _proto.ELEM[t.dtype], t.shape) for t in inputs],
            [_proto.value_info(t.name, _proto.ELEM[t.dtype], t.shape) for t in outputs],
            ir_version=IR_FOR_OPSET[version],
            opset=version,
            producer_name="fastseq.ops",
            producer_version=__version__,
            doc_string=call,
        )
        return Operator(self.op, call, data, tuple(inputs), tuple(outputs))


def tensor(name: str, dtype: str, shape: Sequence[int | str]) -> Tensor:
    """A graph input/output (the checker wants a rank for them)."""
    return Tensor(name, dtype, tuple(shape))


def rank_dims(op: str, rank: Any, minimum: int = 1) -> list[str]:
    """``["N", "d1", ...]``: a batch axis and ``rank - 1`` more, all dynamic."""
    n = integer(op, "rank", rank, minimum=minimum, maximum=MAX_RANK)
    return ["N"] + [f"d{i}" for i in range(1, n)]
