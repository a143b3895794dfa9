"""Parameterised operators: small ONNX models built on demand, to put in front of or after
a model in a pipeline.

Each function returns an :class:`Operator` (the model's bytes and the inputs and outputs
it declares, with a dynamic batch axis), which every entry point takes as a stage::

    fastseq.ONNXSequential(
        ops.to_float(), ops.layout("NHWC", "NCHW"), ops.resize(224), ops.normalize(),
        "resnet18.onnx", ops.softmax(), ops.topk(5),
    )

and each is reachable from a string, for the command line and pipeline files:
``"builtin:resize?size=224,224&mode=linear"`` (see :func:`from_string`).

Images: :func:`to_float`, :func:`layout`, :func:`rgb_to_bgr`, :func:`grayscale`,
:func:`resize`, :func:`center_crop`, :func:`letterbox`, :func:`normalize`. Outputs:
:func:`flatten`, :func:`softmax`, :func:`argmax`, :func:`topk`, :func:`nms`. Bad names or
parameters raise :class:`OperatorError`. The models are built at the default-domain opset
:data:`DEFAULT_OPSET` unless an option needs a later one or ``opset=`` says otherwise (11 or
later: where an op took its current form after 11, the earlier form that computes the same is
written): the stages of a pipeline share one opset, and a pipeline converted to one builds
its operators at it (:func:`at_opset`).

Building one imports neither onnx nor numpy; ``op.to_onnx()`` is an ``onnx.ModelProto`` of
it, and an operator reads like one (``op.graph.node``, ``op.SerializeToString()``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from fastseq.errors import OperatorError
from fastseq.ops.operator import Operator, Tensor

if TYPE_CHECKING:  # what type checkers and editors see; at run time, __getattr__ below
    from fastseq.ops._graph import DEFAULT_OPSET
    from fastseq.ops.head import argmax, flatten, nms, softmax, topk
    from fastseq.ops.image import center_crop, grayscale, layout, letterbox, normalize, resize, rgb_to_bgr, to_float

    OPERATORS: dict[str, Callable[..., Any]]

# The operators' modules are imported on first use (module __getattr__ below): a pipeline of
# model files reads Operator from this package and should not pay for building code it
# never runs.
_IMAGE = ("to_float", "layout", "rgb_to_bgr", "grayscale", "resize", "center_crop", "letterbox", "normalize")
_HEAD = ("flatten", "softmax", "argmax", "topk", "nms")
_HOME_OF = {**dict.fromkeys(_IMAGE, "fastseq.ops.image"), **dict.fromkeys(_HEAD, "fastseq.ops.head")}
_operators: dict[str, Callable[..., Any]] | None = None


def _all() -> dict[str, Callable[..., Any]]:
    """Every operator by the name it has in ``builtin:NAME?...`` strings (see ``OPERATORS``)."""
    global _operators
    if _operators is None:
        import importlib

        _operators = {name: getattr(importlib.import_module(_HOME_OF[name]), name) for name in _HOME_OF}
    return _operators


if not TYPE_CHECKING:  # type checkers see the imports above, and flag a misspelt name

    def __getattr__(name: str) -> Any:
        if name == "OPERATORS":
            return _all()
        if name == "DEFAULT_OPSET":
            from fastseq.ops._graph import DEFAULT_OPSET

            return DEFAULT_OPSET
        if name in _HOME_OF:
            return _all()[name]
        if name == "shipped":  # the models shipped with fastseq (their files and samples)
            import importlib

            return importlib.import_module("fastseq.ops.shipped")
        raise AttributeError(f"module 'fastseq.ops' has no attribute '{name}'")


def names() -> list[str]:
    """The operators' names, sorted."""
    return sorted(_all())


def _value(text: str) -> Any:
    """One parameter value: a bool, an int, a float (``1/255`` too) or a string."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    top, sep, bottom = text.partition("/")
    if sep:
        try:
            return float(top) / float(bottom)
        except (ValueError, ZeroDivisionError):
            pass
    return text


def parse(spec: str) -> tuple[str, dict[str, Any]]:
    """``"resize?size=224,224&mode=linear"`` -> ``("resize", {"size": (224, 224), "mode":
    "linear"})``. A value with commas is a tuple; ``true``/``false`` are bools; numbers
    (and fractions such as ``1/255``) are numbers; anything else is a string."""
    from urllib.parse import unquote

    name, _, query = spec.partition("?")
    params: dict[str, Any] = {}
    for item in filter(None, query.split("&")):
        key, sep, raw = item.partition("=")
        key = unquote(key).strip()
        if not sep or not key:
            raise OperatorError(f"builtin:{spec}: '{item}' is not KEY=VALUE")
        if key in params:
            raise OperatorError(f"builtin:{spec}: '{key}' is given twice")
        values = [_value(unquote(v).strip()) for v in raw.split(",")]
        params[key] = values[0] if len(values) == 1 else tuple(values)
    return name.strip(), params


def to_string(name: str, params: dict[str, Any]) -> str:
    """``("topk", {"k": 5, "axis": -1})`` -> ``"topk?k=5&axis=-1"``: what :func:`parse` reads
    back (``builtin:`` strings for pipeline files)."""
    from urllib.parse import quote

    def text(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (tuple, list)):
            return ",".join(text(x) for x in v)
        return quote(str(v), safe="")

    query = "&".join(f"{quote(k, safe='')}={text(v)}" for k, v in params.items())
    return f"{name}?{query}"


def build(name: str, *args: Any, **params: Any) -> Operator:
    """The operator ``name`` built with these arguments: ``build("resize", 224)``. An
    unknown name or parameter is an :class:`OperatorError` with the near miss."""
    return _lookup(name, ())(*args, **_checked(name, params, args))


def from_string(spec: str, others: Sequence[str] = ()) -> Operator:
    """Builds the operator that ``"NAME?KEY=VALUE&..."`` describes (the part after
    ``builtin:``), e.g. ``"resize?size=224,224&mode=linear"``, ``"normalize?mean=0.5&std=0.25"``,
    ``"to_float?scale=1/255"``. ``others`` are further names the caller knows (for the
    did-you-mean of an unknown name)."""
    name, params = parse(spec)
    try:
        return _lookup(name, others)(**_checked(name, params, (), spec))
    except OperatorError as e:
        message = str(e)
        raise OperatorError(message if message.startswith("builtin:") else f"builtin:{spec}: {message}") from None


#: The operators that take their rank from what feeds them where ``rank=`` is not given.
FITTING = ("flatten", "softmax", "argmax", "topk")


def fitting(source: Any) -> Operator | None:
    """The operator that a stage's ``source`` builds when it takes its rank from what feeds
    it (an :class:`Operator` built without ``rank=``, or a ``builtin:`` string of one that
    gives none), else None. A string that builds nothing is left for the build to refuse."""
    if isinstance(source, Operator):
        return source if source.fit is not None else None
    if not (isinstance(source, str) and source.startswith("builtin:")):
        return None
    spec = source[len("builtin:") :]
    try:
        name, params = parse(spec)
        if name not in FITTING or "rank" in params:
            return None
        return from_string(spec)
    except OperatorError:
        return None


def refit(op: Operator, rank: int) -> Operator:
    """``op`` built again for inputs of ``rank`` axes, if it was built without ``rank=``
    (see :func:`fitting`); else ``op`` itself."""
    if op.fit is None or rank == len(op.inputs[0].shape):
        return op
    name, params = op.fit
    return build(name, **params, rank=rank)


def follows_opset(source: Any) -> bool:
    """Whether ``source`` is an operator built without ``opset=`` (an :class:`Operator`, or
    a ``builtin:NAME?...`` string of one): what :func:`at_opset` builds again. Models,
    shipped files and operators that name their opset are not."""
    if isinstance(source, Operator):
        return source.recipe is not None and source.recipe[2].get("opset") is None
    if not (isinstance(source, str) and source.startswith("builtin:")):
        return False
    from fastseq.ops import shipped

    spec = source[len("builtin:") :]
    name, mark, _ = spec.partition("?")
    if name.startswith(shipped.PREFIX) or (not mark and name in shipped.names()):
        return False  # a shipped file, converted like any model
    try:
        return parse(spec)[1].get("opset") is None
    except OperatorError:
        return False  # left for the build to refuse


def at_opset(source: Any, version: int) -> Any:
    """``source`` built again at default-domain opset ``version`` where it follows the
    pipeline's opset (:func:`follows_opset`): an :class:`Operator` again, a ``builtin:``
    string naming the opset; None for anything else. Raises the operator's
    :class:`OperatorError` where it cannot be built at ``version`` (``antialias=True`` needs
    opset 18). What a pipeline converted to one opset does with its operators: builds them
    at it, rather than converting them with onnx's version converter (which has no way down
    from most ops' current versions)."""
    if not follows_opset(source):
        return None
    if isinstance(source, Operator):
        assert source.recipe is not None
        name, args, params = source.recipe
        return build(name, *args, **{**params, "opset": version})
    name, params = parse(source[len("builtin:") :])
    try:  # refused here, naming the operator, where it cannot be built at version
        build(name, **{**params, "opset": version})
    except OperatorError as e:
        raise OperatorError(f"{source}: {e}") from None
    return f"builtin:{to_string(name, {**params, 'opset': version})}"


def _lookup(name: str, others: Sequence[str]) -> Callable[..., Any]:
    operators = _all()
    if name not in operators:
        known = sorted(set(operators) | set(others))
        from fastseq.ops._graph import near

        raise OperatorError(f"no built-in operator '{name}'{near(name, known)}; built-ins: {', '.join(known)}")
    return operators[name]


def _checked(name: str, params: dict[str, Any], args: tuple[Any, ...], spec: str | None = None) -> dict[str, Any]:
    """``params`` once every key is a parameter of the operator and every required one is
    there (a TypeError from the call itself would not name the operator)."""
    from fastseq.ops._graph import check_arguments

    where = f"builtin:{spec}" if spec is not None else name
    example = f"builtin:{name}?{{}}=..." if spec is not None else f"{name}({{}}=...)"
    check_arguments(_all()[name], args, params, where, example)
    return params


__all__ = [
    "DEFAULT_OPSET",
    "OPERATORS",
    "Operator",
    "OperatorError",
    "Tensor",
    "argmax",
    "at_opset",
    "build",
    "center_crop",
    "flatten",
    "follows_opset",
    "from_string",
    "grayscale",
    "layout",
    "letterbox",
    "names",
    "nms",
    "normalize",
    "parse",
    "resize",
    "rgb_to_bgr",
    "shipped",
    "softmax",
    "to_float",
    "topk",
]


def __dir__() -> list[str]:
    # The operators and public names, not the typing helpers imported above.
    return sorted(__all__)
