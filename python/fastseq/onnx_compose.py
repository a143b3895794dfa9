"""``onnx.compose``, function for function, on fastseq's core.

``import fastseq.onnx_compose as compose`` in a build script that used ``onnx.compose``:
every function takes and returns the same protos, with the same signature and, wherever
onnx.compose's own result is valid, the same result (``inplace=True`` edits the given proto).
The renaming runs in the core's one name walker, the merging in the core's plan under
onnx.compose's rules (see :func:`fastseq.merge_models` for where the results differ: only
where onnx.compose fails or returns a broken model). Errors that onnx.compose raises as
``ValueError`` raise :class:`fastseq.CompositionError`, a subclass of ``ValueError``.

What :func:`merge_models` and :func:`expand_out_dim` return passes
``onnx.checker.check_model(full_check=True)``; where it would not, they raise
:class:`fastseq.InvalidModelError` (an ``onnx.checker.ValidationError``, what onnx.compose
raises) or :class:`fastseq.InvalidShapesError` (an ``onnx.shape_inference.InferenceError``,
what that full check raises). The check costs no second pass over the result: renaming and
merging change names, never operators or types, so a model built from models that pass the
checker passes it if the core finds none of the naming rules broken and nothing else it
cannot vouch for (a joint whose two sides disagree, differing IR versions). Each source
model is checked once (the bytes of models that passed, the results included, are
remembered), so a chain of merges checks every model once; onnx's checker runs on the result
only where the core cannot vouch for it.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from fastseq import _core
from fastseq.errors import CompositionError, FastseqError
from fastseq.facades import compose as _compose
from fastseq.graph.build import build
from fastseq.graph.parts import Stage

if TYPE_CHECKING:
    import onnx

__all__ = [
    "add_prefix",
    "add_prefix_graph",
    "check_overlapping_names",
    "expand_out_dim",
    "expand_out_dim_graph",
    "merge_graphs",
    "merge_models",
]


def _model(m: object, what: str) -> onnx.ModelProto:
    import onnx

    if not isinstance(m, onnx.ModelProto):
        raise TypeError(f"{what} argument is not an ONNX model")
    return m


def _graph(g: object, what: str) -> onnx.GraphProto:
    import onnx

    if not isinstance(g, onnx.GraphProto):
        raise TypeError(f"{what} argument is not an ONNX graph")
    return g


def _held_graph(g: onnx.GraphProto, label: str) -> _core.Composed:
    return _core.decode(g.SerializeToString(), label, graph=True)


# --- validity: what passed onnx.checker.check_model(full_check=True), by its bytes ----------

#: digests of serialized models known to pass the full check (inputs that were checked,
#: results built from such), newest last; bounded, so a long-running program stays small
_VALID: OrderedDict[bytes, None] = OrderedDict()
_VALID_MAX = 512
_VALID_LOCK = threading.Lock()


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def _known_valid(key: bytes) -> bool:
    with _VALID_LOCK:
        if key in _VALID:
            _VALID.move_to_end(key)
            return True
    return False


def _remember_valid(key: bytes) -> None:
    with _VALID_LOCK:
        _VALID[key] = None
        _VALID.move_to_end(key)
        while len(_VALID) > _VALID_MAX:
            _VALID.popitem(last=False)


def _checker_error(model: onnx.ModelProto, plain_first: bool = False) -> Exception | None:
    """What ``check_model(full_check=True)`` raises for ``model``, or None. ``plain_first``:
    the plain check first, as onnx.compose runs it, so that what it finds is the
    ``ValidationError`` onnx.compose raises rather than the full check's first finding."""
    import onnx
    from onnx.shape_inference import InferenceError

    try:
        if plain_first:
            onnx.checker.check_model(model)
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, InferenceError, ValueError) as e:  # ValueError: "Invalid tensor data type"
        return e
    return None


def _source_error(model: onnx.ModelProto, data: bytes) -> Exception | None:
    """What the full check raises for a source model (serialized as ``data``), or None:
    remembered, or checked once."""
    key = _digest(data)  # once: a digest of a large model costs as much as a merge's renaming
    if _known_valid(key):
        return None
    error = _checker_error(model)
    if error is None:
        _remember_valid(key)
    return error


def _refuse(error: Exception, what: str) -> Exception:
    """fastseq's class for an error of onnx's checker: an ``InvalidModelError`` for a
    ``ValidationError``, an ``InvalidShapesError`` for an ``InferenceError``."""
    import onnx

    from fastseq import errors

    cls = errors.InvalidModelError if isinstance(error, onnx.checker.ValidationError) else errors.InvalidShapesError
    return cls(f"{what}: {str(error).strip()}")


def _vouched(
    result: onnx.ModelProto, data: bytes, sources: list[Exception | None], unproven: list[str], what: str
) -> None:
    """Raises unless ``result`` (serialized as ``data``) passes the full check: taken as given
    when its sources pass (``sources``: what the check raised for each) and the core vouches
    for the rest, checked otherwise. A source that fails the plain check makes the refusal a
    ``ValidationError``, as onnx.compose's plain check of its merged model finds it there."""
    import onnx

    if any(sources) or unproven:
        error = _checker_error(result, plain_first=True)
        if error is not None:
            if not isinstance(error, (onnx.checker.ValidationError, onnx.shape_inference.InferenceError)):
                raise error  # the checker's own ValueError (a type it does not know, a name not UTF-8), as onnx's
            plain = next((e for e in sources if isinstance(e, onnx.checker.ValidationError)), None)
            if plain is not None and not isinstance(error, onnx.checker.ValidationError):
                error = plain
            raise _refuse(error, f"{what}: the result fails onnx.checker") from error
    _remember_valid(_digest(data))


def _result(given: Any, data: bytes, inplace: bool | None) -> Any:
    """``data`` parsed into ``given`` itself (``inplace``) or into a new proto of its type."""
    if inplace:
        given.ParseFromString(data)
        return given
    return type(given).FromString(data)


def check_overlapping_names(
    g1: onnx.GraphProto, g2: onnx.GraphProto, io_map: list[tuple[str, str]] | None = None
) -> list[tuple[str, list[str]]]:
    """The names both graphs use, by kind: ``("edge", [...])`` (node inputs and outputs,
    the inputs ``io_map`` feeds left out), ``"value_info"``, ``"initializer"``,
    ``"sparse_initializer"``; kinds without a shared name are left out. Each list is in
    ``g1``'s order (onnx.compose's is a set's, in no set order)."""
    _graph(g1, "g1")
    _graph(g2, "g2")
    io_map_inputs = [_compose.name_of(i) for _, i in io_map or []]
    found = _core.overlapping_names(_held_graph(g1, "g1"), _held_graph(g2, "g2"), io_map_inputs)
    return [(kind, list(names)) for kind, names in found]


def merge_graphs(
    g1: onnx.GraphProto,
    g2: onnx.GraphProto,
    io_map: list[tuple[str, str]],
    inputs: list[str] | None = None,
    outputs: list[str] | None = None,
    prefix1: str | None = None,
    prefix2: str | None = None,
    name: str | None = None,
    doc_string: str | None = None,
) -> onnx.GraphProto:
    """``onnx.compose.merge_graphs``: the graph :func:`merge_models` would give (same
    arguments, same rules and differences)."""
    import onnx

    stages = [_held_graph(_graph(g1, "g1"), "g1"), _held_graph(_graph(g2, "g2"), "g2")]
    spec = _compose.merge_spec(stages[0], stages[1], io_map, inputs, outputs, prefix1, prefix2, name, doc_string)
    return onnx.GraphProto.FromString(build(spec).composed.graph_bytes())


def merge_models(
    m1: onnx.ModelProto,
    m2: onnx.ModelProto,
    io_map: list[tuple[str, str]],
    inputs: list[str] | None = None,
    outputs: list[str] | None = None,
    prefix1: str | None = None,
    prefix2: str | None = None,
    name: str | None = None,
    doc_string: str | None = None,
    producer_name: str | None = "onnx.compose.merge_models",
    producer_version: str | None = "1.0",
    domain: str | None = "",
    model_version: int | None = 1,
) -> onnx.ModelProto:
    """``onnx.compose.merge_models``: see :func:`fastseq.merge_models` (which also takes
    paths and bytes; this one, like onnx.compose's, only ``onnx.ModelProto``). The result
    passes ``onnx.checker.check_model(full_check=True)``, or this raises
    :class:`fastseq.InvalidModelError` (an ``onnx.checker.ValidationError``, as onnx.compose
    raises) or :class:`fastseq.InvalidShapesError`."""
    import onnx

    models = (_model(m1, "m1"), _model(m2, "m2"))
    irs = [m.ir_version for m in models]
    if min(irs) <= 0 and irs[0] != irs[1]:
        # onnx.compose's first check (fastseq merges other IR versions, never an unset one).
        raise CompositionError(f"IR version mismatch {irs[0]} != {irs[1]}. Both models should have the same IR version")
    # Both unset: merged as onnx.compose merges them (its ValueErrors first), then refused as
    # its checker refuses the result.
    unset = min(irs) <= 0
    data = [_decodable(m) for m in models]
    stages = [_held_model(d, m, k) for k, (d, m) in enumerate(zip(data, models))]
    spec = _compose.merge_spec(stages[0], stages[1], io_map, inputs, outputs, prefix1, prefix2, name, doc_string)
    composed = _compose.merged(spec, producer_name, producer_version, domain, model_version)
    _compose.check_fits_proto(composed)
    if unset:
        error = onnx.checker.ValidationError("The model does not have an ir_version set properly.")
        raise _refuse(error, "merge_models: the result fails onnx.checker")
    out = composed.to_bytes()
    result = onnx.ModelProto.FromString(out)
    sources = [_source_error(m, d) for m, d in zip(models, data)]
    unproven = list(composed.report()["unproven"])
    if any(_passes_through(m) for m in models):
        # What flows on is the input, whatever the output declares: the joint's declared
        # types prove nothing, so the checker decides.
        unproven.append("a graph output that is a graph input")
    _vouched(result, out, sources, unproven, "merge_models")
    return result


def _passes_through(m: onnx.ModelProto) -> bool:
    """Whether a graph output of ``m`` is one of its graph inputs."""
    g = m.graph
    return bool({o.name for o in g.output} & {i.name for i in g.input})


def _decodable(m: onnx.ModelProto) -> bytes:
    """``m``'s bytes as the core decodes them: with a graph and an IR version (onnx.compose
    renames in a model that has neither as well); :func:`_as_given` puts them back."""
    if m.HasField("graph") and m.ir_version > 0:
        return m.SerializeToString()
    copy = type(m)()
    copy.CopyFrom(m)
    copy.graph.SetInParent()
    if m.ir_version <= 0:
        copy.ir_version = _core.MAX_IR_VERSION
    return copy.SerializeToString()


def _as_given(given: onnx.ModelProto, out: onnx.ModelProto) -> onnx.ModelProto:
    """``out`` without what :func:`_decodable` added to ``given``."""
    if given is not out and not given.HasField("graph") and out.graph.ByteSize() == 0:
        out.ClearField("graph")
    if not given.HasField("ir_version"):
        out.ClearField("ir_version")
    elif given.ir_version <= 0:
        out.ir_version = given.ir_version
    return out


def _held_model(data: bytes, m: onnx.ModelProto, index: int) -> Stage:
    """A source of merge_models, decoded as it is (external data stays references, as
    onnx.compose keeps them)."""
    label = f"{m.graph.name or 'model'} (#{index})"
    return Stage(label, _core.decode(data, label))


def add_prefix_graph(
    graph: onnx.GraphProto,
    prefix: str,
    rename_nodes: bool | None = True,
    rename_edges: bool | None = True,
    rename_inputs: bool | None = True,
    rename_outputs: bool | None = True,
    rename_initializers: bool | None = True,
    rename_value_infos: bool | None = True,
    inplace: bool | None = False,
    name_map: dict[str, str] | None = None,
) -> onnx.GraphProto:
    """``onnx.compose.add_prefix_graph``: ``prefix`` before the names the flags select
    (edges: node outputs that are not graph outputs; initializers: sparse ones too; nodes:
    node names and every name inside subgraphs), each renamed wherever it is read, in every
    scope. Empty names stay empty. ``name_map``, when given, receives the value renames."""
    _graph(graph, "graph")
    prefixed, renamed = _held_graph(graph, "graph").with_prefix(
        prefix,
        nodes=bool(rename_nodes),
        edges=bool(rename_edges),
        inputs=bool(rename_inputs),
        outputs=bool(rename_outputs),
        initializers=bool(rename_initializers),
        value_infos=bool(rename_value_infos),
        functions=False,
    )
    if name_map is not None:
        name_map.update(renamed)
    return _result(graph, prefixed.graph_bytes(), inplace)


def add_prefix(
    model: onnx.ModelProto,
    prefix: str,
    rename_nodes: bool | None = True,
    rename_edges: bool | None = True,
    rename_inputs: bool | None = True,
    rename_outputs: bool | None = True,
    rename_initializers: bool | None = True,
    rename_value_infos: bool | None = True,
    rename_functions: bool | None = True,
    inplace: bool | None = False,
) -> onnx.ModelProto:
    """``onnx.compose.add_prefix``: :func:`add_prefix_graph` on the model's graph, and
    ``prefix`` before the local functions' names and their calls (calls of the function's
    own domain only, in subgraphs too). Unlike onnx.compose's, a body reading an outer
    initializer, quantization annotations and training graphs follow the renames."""
    _model(model, "model")
    prefixed, _ = _core.decode(_decodable(model), "model").with_prefix(
        prefix,
        nodes=bool(rename_nodes),
        edges=bool(rename_edges),
        inputs=bool(rename_inputs),
        outputs=bool(rename_outputs),
        initializers=bool(rename_initializers),
        value_infos=bool(rename_value_infos),
        functions=bool(rename_functions),
    )
    return _as_given(model, _result(model, prefixed.to_bytes(), inplace))


def expand_out_dim_graph(graph: onnx.GraphProto, dim_idx: int, inplace: bool | None = False) -> onnx.GraphProto:
    """``onnx.compose.expand_out_dim_graph``: an axis of extent 1 at ``dim_idx`` on every
    output (an ``Unsqueeze`` per output, its axes from one ``Constant`` node), the outputs
    keeping their names. Unlike onnx.compose's, subgraphs reading an output follow its
    rename, an output that is a graph input is unsqueezed as it is, the new shape keeps
    symbolic dims, and a negative ``dim_idx`` counts from the back of the new shape as the
    ``Unsqueeze`` does. Opset 13's form: :func:`expand_out_dim` picks the older one for a
    model importing an older opset."""
    return _expand(_graph(graph, "graph"), dim_idx, inplace, axes_as_input=True)


def expand_out_dim(model: onnx.ModelProto, dim_idx: int, inplace: bool | None = False) -> onnx.ModelProto:
    """``onnx.compose.expand_out_dim``: :func:`expand_out_dim_graph` on the model's graph;
    for a model importing ai.onnx older than 13 the ``Unsqueeze`` takes its axes as an
    attribute (onnx.compose's needs opset 13), and below 11 a negative ``dim_idx`` is
    counted from the back of the output's known rank (Unsqueeze-1 takes no negative axes).
    The result passes ``onnx.checker.check_model(full_check=True)``, or this raises
    :class:`fastseq.InvalidModelError` or :class:`fastseq.InvalidShapesError` and leaves
    ``model`` as it was."""
    import onnx

    _model(model, "model")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    data = model.SerializeToString()
    source = _source_error(model, data)
    out = onnx.ModelProto.FromString(data)
    try:
        _expand(out.graph, dim_idx, True, axes_as_input=opset >= 13, opset=opset)
    except FastseqError as e:
        # A source the plain check refuses is what onnx's checker reports first.
        if isinstance(source, onnx.checker.ValidationError):
            raise _refuse(source, "expand_out_dim: the model fails onnx.checker") from source
        raise e from None
    result = out.SerializeToString()
    problem = _core.decode(result, "model").naming_problem() if model.ir_version > 0 else "no IR version"
    _vouched(out, result, [source], [problem] if problem else [], "expand_out_dim")
    if inplace:
        model.CopyFrom(out)
        return model
    return out


def _expand(
    graph: onnx.GraphProto, dim_idx: int, inplace: bool | None, axes_as_input: bool, opset: int = 13
) -> onnx.GraphProto:
    from onnx import TensorProto, helper

    from fastseq import errors

    suffix = f"_collapsed_dim_{dim_idx}"
    produced = {o for n in graph.node for o in n.output}
    for o in graph.output:
        if o.name not in produced:
            # onnx.compose renames the readers of the input and leaves the new name undefined.
            raise errors.InvalidModelError(
                f"expand_out_dim: output '{o.name}' is not computed by a node (it is a graph input or an "
                "initializer): the unsqueezed tensor cannot keep its name, a name is defined once"
            )
        tensor = o.type.tensor_type
        rank = len(tensor.shape.dim) if tensor.HasField("shape") else None
        if rank is not None and not -(rank + 1) <= dim_idx <= rank:
            raise errors.InvalidShapesError(
                f"expand_out_dim: dim_idx {dim_idx} is out of range for output '{o.name}' of rank {rank}"
            )
        if dim_idx < 0 and not axes_as_input and opset < 11 and rank is None:
            raise errors.InvalidModelError(
                f"expand_out_dim: output '{o.name}' has no declared rank, and Unsqueeze below opset 11 "
                f"takes no negative axes: pass dim_idx counted from the front instead of {dim_idx}"
            )
    outputs = [(o.name, o.name + suffix, o.type.tensor_type) for o in graph.output]
    renames = [(old, new) for old, new, _ in outputs if old != new]
    try:
        held = _held_graph(graph, "graph").with_renamed(renames)
    except CompositionError as e:
        raise CompositionError(f"expand_out_dim: {e}") from None
    g = _result(graph, held.graph_bytes(), inplace)
    axes = g.name + "_expand_out_dim_idx"
    if axes_as_input:
        value = helper.make_tensor(name=f"{axes}-value", data_type=TensorProto.INT64, dims=[1], vals=[dim_idx])
        g.node.append(helper.make_node("Constant", inputs=[], outputs=[axes], name=f"{axes}-constant", value=value))
    del g.output[:]
    for name, source, tensor in outputs:
        if axes_as_input:
            g.node.append(
                helper.make_node("Unsqueeze", inputs=[source, axes], outputs=[name], name=f"unsqueeze-{name}")
            )
        else:
            axis = dim_idx
            if axis < 0 and opset < 11:  # Unsqueeze-1 counts from the front only
                axis += len(tensor.shape.dim) + 1
            g.node.append(
                helper.make_node("Unsqueeze", inputs=[source], outputs=[name], name=f"unsqueeze-{name}", axes=[axis])
            )
        vi = helper.make_tensor_value_info(name, tensor.elem_type, None)
        if tensor.HasField("shape"):
            # The dims copied as they are (a dim_param of any bytes, as protobuf holds it),
            # the new one where Unsqueeze puts it: what make_tensor_value_info writes for them.
            dims = list(tensor.shape.dim)
            at = dim_idx if dim_idx >= 0 else len(dims) + 1 + dim_idx
            shape = vi.type.tensor_type.shape
            shape.SetInParent()
            for k in range(len(dims) + 1):
                if k == at:
                    shape.dim.add().dim_value = 1
                if k < len(dims):
                    shape.dim.add().CopyFrom(dims[k])
        g.output.append(vi)
    return g
