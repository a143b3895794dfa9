"""What an operator builder returns: the model's serialized bytes and what it declares,
without onnx (importing it costs over a second; every fastseq entry point reads the bytes).

Where an ``onnx.ModelProto`` is wanted, :meth:`Operator.to_onnx` decodes one, and an
operator reads like one: ``op.graph.node``, ``op.opset_import``, ``op.doc_string`` and
``op.SerializeToString()`` work, so ``onnx.checker.check_model(op)`` and
``onnxruntime.InferenceSession(op.SerializeToString())`` take it as they take a model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import onnx


class Tensor(NamedTuple):
    """A declared input or output: its name, numpy dtype name and shape (an int per fixed
    axis, a name per symbolic one: the same name is the same size)."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]

    def __str__(self) -> str:
        return f"{self.name}: {self.dtype}[{', '.join(map(str, self.shape))}]"


class Operator:
    """A small ONNX model built by :mod:`fastseq.ops`: pass it wherever a model goes
    (``ONNXSequential``, ``Pipeline``, ``compose*``, ``merge_models``, ``ONNXModule``).

    ``name`` is the operator's (the model's graph name), ``call`` the call that built it
    (the model's doc_string), ``inputs`` and ``outputs`` the :class:`Tensor` s it declares.
    ``bytes(op)`` and ``op.SerializeToString()`` are the serialized model;
    :meth:`to_onnx` is an ``onnx.ModelProto`` of it. Other attributes (``graph``,
    ``opset_import``, ``ir_version`` ...) are read from a fresh ``ModelProto``: a read-only
    view (edit the result of :meth:`to_onnx` instead)."""

    __slots__ = ("name", "call", "inputs", "outputs", "_data", "fit", "recipe")

    def __init__(
        self,
        name: str,
        call: str,
        data: bytes,
        inputs: tuple[Tensor, ...],
        outputs: tuple[Tensor, ...],
        fit: tuple[str, dict[str, Any]] | None = None,
        recipe: tuple[str, tuple[Any, ...], dict[str, Any]] | None = None,
    ):
        self.name = name
        self.call = call
        self.inputs = inputs
        self.outputs = outputs
        self._data = data
        #: (operator, its other arguments) where the operator was built without ``rank=``:
        #: a pipeline builds it again for the rank of what feeds it (``fastseq.ops.refit``).
        self.fit = fit
        #: (operator, positional arguments, keyword arguments): the call that built it, which
        #: builds it again at another opset (``fastseq.ops.at_opset``).
        self.recipe = recipe

    def SerializeToString(self) -> bytes:  # ModelProto's spelling, which onnx and onnxruntime call
        """The serialized model, as ``onnx.ModelProto.SerializeToString`` gives it."""
        return self._data

    def __bytes__(self) -> bytes:
        return self._data

    def to_onnx(self) -> onnx.ModelProto:
        """The model as a fresh ``onnx.ModelProto`` (imports onnx)."""
        import onnx

        return onnx.ModelProto.FromString(self._data)

    def __getattr__(self, attr: str) -> Any:
        # Only ModelProto's public fields and methods: pickling and copying probe for
        # dunders on a half-built instance, which must not decode anything.
        if attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(self.to_onnx(), attr)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Operator) and other._data == self._data

    def __hash__(self) -> int:
        return hash(self._data)

    def __reduce__(self) -> tuple[Any, ...]:
        return Operator, (self.name, self.call, self._data, self.inputs, self.outputs, self.fit, self.recipe)

    def __repr__(self) -> str:
        ins = ", ".join(map(str, self.inputs))
        outs = ", ".join(map(str, self.outputs))
        return f"<Operator {self.call}: {ins} -> {outs}>"
