"""fastseq.onnx_compose against onnx.compose on seeded generated cases (tests/compose_fuzz.py;
``benches/fuzz_compose.py`` runs 20,000 of them), and the hostile inputs that such runs found,
each compared with onnx's own result: what fastseq returns passes
``onnx.checker.check_model(full_check=True)``, it is onnx's model byte for byte wherever
onnx's passes, and it raises onnx's class wherever onnx raises, except for the README's
deliberate differences."""

from __future__ import annotations

import onnx
import onnx.compose as onnx_compose
import pytest
from onnx import TensorProto, helper, parser

import compose_fuzz
import fastseq
import fastseq.onnx_compose as compose

#: what never happens, deliberate or not
NEVER = ("onnx_raises_fastseq_invalid", "fastseq_invalid")


@pytest.mark.parametrize("block", range(4))
def test_seeded_cases_agree_with_onnx_compose_or_differ_as_documented(block):
    undocumented = []
    for seed in range(block * 75, block * 75 + 75):
        case = compose_fuzz.make_case(seed)
        verdict = compose_fuzz.compare(case)
        assert verdict.category not in NEVER, (case.describe(), verdict)
        if verdict.category not in ("same", "both_raise") and compose_fuzz.deliberate(case, verdict) is None:
            undocumented.append((case.describe(), verdict))
    assert undocumented == []


def _model(text: str) -> onnx.ModelProto:
    return parser.parse_model(text)


A = """<ir_version: 8, opset_import: ["": 17]> a (float[2] x) => (float[2] y) { t = Relu(x)  y = Neg(t) }"""
B = """<ir_version: 8, opset_import: ["": 17]> b (float[2] u) => (float[2] z) { z = Abs(u) }"""


def _both(m1, m2, **kw):
    """(onnx's outcome, fastseq's): a model or the exception, onnx's result fully checked."""
    out = []
    for module in (onnx_compose, compose):
        try:
            m = module.merge_models(m1, m2, **kw)
        except Exception as e:  # noqa: BLE001  (the classes are compared)
            out.append(e)
            continue
        if module is onnx_compose:
            try:
                onnx.checker.check_model(m, full_check=True)
            except Exception as e:  # noqa: BLE001
                m = e
        out.append(m)
    return out


def _hostile(kind: str) -> onnx.ModelProto:
    m = _model(A)
    g = m.graph
    if kind == "duplicate initializer":
        w = helper.make_tensor("w", TensorProto.FLOAT, [2], [1, 2])
        g.initializer.extend([w, w])
        g.node[0].input.append("w")
        g.node[0].op_type = "Add"
    elif kind == "two nodes write one output":
        g.node[1].output[0] = "t"
        g.node.append(helper.make_node("Neg", ["t"], ["y"]))
    elif kind == "duplicate graph input":
        g.input.append(g.input[0])
    return m


@pytest.mark.parametrize("kind", ["duplicate initializer", "two nodes write one output", "duplicate graph input"])
@pytest.mark.parametrize("prefixes", [{}, {"prefix1": "p/", "prefix2": "q/"}])
def test_invalid_sources_raise_onnx_class_where_fastseq_returned_an_invalid_model(kind, prefixes):
    ref, ours = _both(_hostile(kind), _model(B), io_map=[("y", "u")], **prefixes)
    assert isinstance(ref, onnx.checker.ValidationError), ref
    assert isinstance(ours, onnx.checker.ValidationError) and isinstance(ours, fastseq.InvalidModelError), ours
    assert isinstance(ours.__cause__, onnx.checker.ValidationError)


@pytest.mark.parametrize("location", ["../x.bin", "/abs/x.bin", "/dev/zero"])
def test_external_data_outside_the_models_folder_is_refused_like_onnx_checker(location):
    m = _model("""<ir_version: 8, opset_import: ["": 17]> a (float[2] x) => (float[2] y) { y = Add(x, w) }""")
    w = helper.make_tensor("w", TensorProto.FLOAT, [2], [1, 2])
    w.ClearField("float_data")
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value=location)
    m.graph.initializer.append(w)
    ref, ours = _both(m, _model(B), io_map=[("y", "u")])
    assert isinstance(ref, onnx.checker.ValidationError), ref
    assert isinstance(ours, fastseq.InvalidModelError) and isinstance(ours, onnx.checker.ValidationError), ours


def test_a_model_without_a_graph_or_an_ir_version_is_handled_as_onnx_compose_does():
    empty = onnx.ModelProto(ir_version=8, opset_import=[helper.make_opsetid("", 17)])
    ref, ours = _both(empty, _model(B), io_map=[])
    assert isinstance(ref, onnx.ModelProto) and isinstance(ours, onnx.ModelProto)
    assert ours.SerializeToString() == ref.SerializeToString()
    no_ir = _model(A)
    no_ir.ClearField("ir_version")
    ref, ours = _both(no_ir, _model(B), io_map=[("y", "u")])
    assert type(ref) is ValueError and "IR version mismatch 0 != 8" in str(ref)
    assert isinstance(ours, ValueError) and "IR version mismatch 0 != 8" in str(ours)
    other = _model(B)
    other.ClearField("ir_version")
    ref, ours = _both(no_ir, other, io_map=[("y", "u")])
    assert isinstance(ref, onnx.checker.ValidationError) and isinstance(ours, onnx.checker.ValidationError)


def test_prefixed_unnamed_nodes_get_onnx_empty_name_byte_for_byte():
    m1, m2 = _model(A), _model(B)
    assert not any(n.HasField("name") for n in m1.graph.node)
    ref = onnx_compose.merge_models(m1, m2, io_map=[("y", "u")], prefix1="p/", prefix2="q/")
    ours = compose.merge_models(m1, m2, io_map=[("y", "u")], prefix1="p/", prefix2="q/")
    assert all(n.HasField("name") and n.name == "" for n in ours.graph.node)
    assert ours.SerializeToString() == ref.SerializeToString()
    ref = onnx_compose.add_prefix(m1, "p/")
    assert compose.add_prefix(m1, "p/").SerializeToString() == ref.SerializeToString()
    # Without rename_nodes, onnx leaves node names alone: so does fastseq.
    plain = compose.add_prefix(m1, "p/", rename_nodes=False)
    assert not any(n.HasField("name") for n in plain.graph.node)


def test_an_input_listed_twice_in_io_map_is_fed_by_the_last_pair_as_in_onnx_compose():
    two = _model("""<ir_version: 8, opset_import: ["": 17]> a (float[2] x) => (float[2] y, float[2] y2)
                    { y = Relu(x)  y2 = Neg(x) }""")
    kw = dict(io_map=[("y", "u"), ("y2", "u")])
    ref, ours = _both(two, _model(B), **kw)
    assert isinstance(ref, onnx.ModelProto) and isinstance(ours, onnx.ModelProto)
    assert ours.SerializeToString() == ref.SerializeToString()


def test_expand_out_dim_of_an_output_that_is_a_graph_input_is_refused_with_onnx_class():
    m = _model("""<ir_version: 8, opset_import: ["": 17]> a (float[2] x) => (float[2] y, float[2] x) { y = Relu(x) }""")
    onnx.checker.check_model(m, full_check=True)
    ref = onnx_compose.expand_out_dim(m, 0)
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(ref, full_check=True)
    before = m.SerializeToString()
    with pytest.raises(fastseq.InvalidModelError, match="output 'x' is not computed by a node") as e:
        compose.expand_out_dim(m, 0, inplace=True)
    assert isinstance(e.value, onnx.checker.ValidationError)
    assert m.SerializeToString() == before, "left as it was"


@pytest.mark.parametrize("dim_idx", [-1, -2, 0, 1])
def test_expand_out_dim_below_opset_11_writes_axes_unsqueeze_1_takes(dim_idx):
    m = _model("""<ir_version: 5, opset_import: ["": 10]> a (float[2, 3] x) => (float[2, 3] y) { y = Relu(x) }""")
    out = compose.expand_out_dim(m, dim_idx)
    onnx.checker.check_model(out, full_check=True)
    axes = [a.ints for n in out.graph.node if n.op_type == "Unsqueeze" for a in n.attribute]
    assert axes == [[dim_idx % 3]]
    with pytest.raises(fastseq.InvalidShapesError, match="out of range"):
        compose.expand_out_dim(m, 4)


def test_a_chain_checks_each_source_once_and_never_its_growing_result(monkeypatch):
    """The check costs one look at each source: a result built from models that passed is
    remembered, so merging it again checks only the new model."""
    checked = []
    real = onnx.checker.check_model

    def counting(model, *a, **kw):
        checked.append(model.graph.name)
        return real(model, *a, **kw)

    monkeypatch.setattr(onnx.checker, "check_model", counting)
    compose._VALID.clear()
    stages = [_model(A.replace("a (", f"s{k} (")) for k in range(5)]
    merged = compose.add_prefix(stages[0], "s0/")
    for k in range(1, 5):
        merged = compose.merge_models(
            merged, compose.add_prefix(stages[k], f"s{k}/"), io_map=[(f"s{k - 1}/y", f"s{k}/x")]
        )
    assert checked == [f"s{k}" for k in range(5)], checked
    real(merged, full_check=True)


def test_checker_errors_are_fastseq_classes_that_pickle():
    import pickle

    for cls, base in (
        (fastseq.InvalidModelError, onnx.checker.ValidationError),
        (fastseq.InvalidShapesError, onnx.shape_inference.InferenceError),
    ):
        assert issubclass(cls, fastseq.FastseqError) and issubclass(cls, base) and not issubclass(cls, ValueError)
        back = pickle.loads(pickle.dumps(cls("m: bad")))
        assert type(back) is cls and str(back) == "m: bad"


def _with_unknown_fields(m: onnx.ModelProto) -> onnx.ModelProto:
    """``m`` with field 999 (which no ONNX message has) in each kind of message that
    merge_models carries over: a node, a graph input and output, an initializer, an opset
    import, a dim."""
    m = onnx.ModelProto.FromString(m.SerializeToString())
    g = m.graph
    for msg in (
        g.node[0],
        g.input[0],
        g.output[0],
        g.initializer[0],
        m.opset_import[0],
        g.input[0].type.tensor_type.shape.dim[0],
    ):
        msg.MergeFromString(compose_fuzz.UNKNOWN_FIELD)
    return m


W = """<ir_version: 8, opset_import: ["": 17]> a (float[2] x) => (float[2] y) <float[2] w = {1, 2}> { y = Add(x, w) }"""


@pytest.mark.parametrize("prefixes", [{}, {"prefix1": "p/", "prefix2": "q/"}])
def test_unknown_fields_are_carried_through_as_onnx_compose_carries_them(prefixes):
    m1 = _with_unknown_fields(_model(W))
    ref = onnx_compose.merge_models(m1, _model(B), io_map=[("y", "u")], **prefixes)
    ours = compose.merge_models(m1, _model(B), io_map=[("y", "u")], **prefixes)
    assert compose_fuzz.UNKNOWN_FIELD in ours.SerializeToString()
    assert ours.SerializeToString() == ref.SerializeToString()
    assert compose.add_prefix(m1, "p/").SerializeToString() == onnx_compose.add_prefix(m1, "p/").SerializeToString()


def _odd(m: onnx.ModelProto, placeholder: bytes, odd: bytes) -> onnx.ModelProto:
    assert len(placeholder) == len(odd)
    return onnx.ModelProto.FromString(m.SerializeToString().replace(placeholder, odd))


@pytest.mark.parametrize("where", ["dim_param", "domain"])
def test_strings_of_any_bytes_are_kept_as_protobuf_and_onnx_keep_them(where):
    if where == "dim_param":
        m1 = _odd(_model(A.replace("float[2] x", "float[ODDDIM] x")), b"ODDDIM", b"\xff\xfeDDIM")
    else:
        m1 = _model("""<ir_version: 8, opset_import: ["": 17, "odd.dom": 1]> a (float[2] x) => (float[2] y)
                       { t = odd.dom.Custom(x)  y = Neg(x) }""")
        m1 = _odd(m1, b"odd.dom", b"\xffdd.dom")
    onnx.checker.check_model(m1, full_check=True)  # protobuf and onnx take them
    for kw in ({}, {"prefix1": "p/", "prefix2": "q/"}):
        ref = onnx_compose.merge_models(m1, _model(B), io_map=[("y", "u")], **kw)
        ours = compose.merge_models(m1, _model(B), io_map=[("y", "u")], **kw)
        assert ours.SerializeToString() == ref.SerializeToString()
    out = compose.expand_out_dim(m1, 0)
    onnx.checker.check_model(out, full_check=True)


def test_a_joint_whose_sides_disagree_is_onnx_checkers_call_in_onnx_compose():
    """onnx.compose joins a float[2] output to a float[3] or double input as it is:
    fastseq.onnx_compose returns the same model where onnx's full check passes it and raises
    the check's class where it does not; fastseq.merge_models refuses both, naming the sides."""
    # The second model reads only the rank: the joint's [2] meets its [3] and every check passes.
    shape = _model("""<ir_version: 8, opset_import: ["": 17]> b (float[3] u) => (int64[1] z) { z = Shape(u) }""")
    ref, ours = _both(_model(A), shape, io_map=[("y", "u")])
    assert isinstance(ref, onnx.ModelProto) and ours.SerializeToString() == ref.SerializeToString()
    double = _model("""<ir_version: 8, opset_import: ["": 17]> b (double[2] u) => (double[2] z) { z = Abs(u) }""")
    ref, ours = _both(_model(A), double, io_map=[("y", "u")])
    assert isinstance(ref, onnx.shape_inference.InferenceError)
    assert isinstance(ours, fastseq.InvalidShapesError) and isinstance(ours, onnx.shape_inference.InferenceError)
    for second, what in ((shape, "shape mismatch"), (double, "element type mismatch")):
        with pytest.raises(fastseq.CompositionError, match=what):
            fastseq.merge_models(_model(A), second, io_map=[("y", "u")])


# --- what onnx's own harness (onnx/fuzz/fuzz_compose.py) found: tests/compose_harness.py -----------
#: categories where onnx's result or onnx's error is not what fastseq gives: never, in any input
NOT_ONNX = ("onnx_returns_fastseq_raises", "onnx_raises_fastseq_invalid", "fastseq_invalid")


@pytest.mark.parametrize("block", range(2))
def test_onnx_harness_inputs_get_onnx_result_or_an_error(block):
    """The harness's structured and raw (mutated bytes) inputs: where onnx.compose returns a
    model that passes the full check, fastseq returns one too; fastseq never returns a model
    that fails it. (``benches/fuzz_compose.py --harness --count 100000`` runs 100,000.)"""
    import compose_harness

    wrong = []
    for seed in range(block * 1500, block * 1500 + 1500):
        case = compose_harness.make_case(seed)
        if case is not None and (verdict := compose_fuzz.compare(case)).category in NOT_ONNX:
            wrong.append((seed, verdict))
    assert wrong == []


def test_a_known_field_with_another_wire_type_is_kept_as_protobuf_keeps_it():
    """protobuf keeps a known field that arrives with another wire type as an unknown field
    (a node's ``input``, a string, as a varint; a dim's ``dim_value``, an int64, as bytes);
    the merged model is onnx's, those bytes carried along."""
    m1 = _model(A)
    m1.graph.node[0].MergeFromString(b"\x08\x05")  # NodeProto.input (1) as a varint
    m1.graph.input[0].type.tensor_type.shape.dim[0].MergeFromString(b"\x0a\x01\x41")  # dim_value (1) as bytes
    assert list(m1.graph.node[0].input) == ["x"]  # protobuf did not read them as the fields
    for kw in ({}, {"prefix1": "p/", "prefix2": "q/"}):
        ref, ours = _both(m1, _model(B), io_map=[("y", "u")], **kw)
        assert isinstance(ref, onnx.ModelProto) and ours.SerializeToString() == ref.SerializeToString()
        assert b"\x08\x05" in ours.SerializeToString()


def test_a_checker_value_error_on_a_source_is_not_raised_when_the_result_passes():
    """onnx's checker raises a plain ValueError for a tensor type it does not know; where the
    io_map feeds that input, onnx.compose's result is valid and fastseq's is the same. A
    result that keeps it (onnx.compose's fails the full check so) is refused with that error."""
    b = _model(B)
    b.graph.input[0].type.tensor_type.elem_type = 65  # no such TensorProto.DataType
    with pytest.raises(ValueError, match="Invalid tensor data type 65"):
        onnx.checker.check_model(b, full_check=True)
    ref, ours = _both(_model(A), b, io_map=[("y", "u")])
    assert isinstance(ref, onnx.ModelProto) and ours.SerializeToString() == ref.SerializeToString()
    with pytest.raises(ValueError, match="Invalid tensor data type 65") as info:
        compose.merge_models(_model(A), b, io_map=[])  # 'u' stays an input of type 65
    ref, _ = _both(_model(A), b, io_map=[])
    assert type(ref) is type(info.value) and str(ref) == str(info.value)


def _graph_model(nodes, inputs, outputs, name):
    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3])  # noqa: E731
    graph = helper.make_graph(nodes, name, [vi(i) for i in inputs], [vi(o) for o in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=8)


@pytest.mark.parametrize("reader", ["m2", "m1", "body"])
def test_a_name_a_model_reads_and_never_defines_binds_to_the_other_models_as_in_onnx_compose(reader):
    """onnx's harness, seed 36015: the second model reads 'cond' (its input of that name
    mutated away), which the first has as an input nothing there reads. onnx.compose
    concatenates the graphs, so the read binds to that input, and its result passes the full
    check; fastseq renamed the read as a clash ('m1/cond', defined nowhere) and refused its
    own result. Now it is onnx's model byte for byte, whichever model reads the name, a body
    reading it included; with prefixes both refuse the result alike."""
    unread = _graph_model([], ["b", "cond"], ["b"], "g")
    if reader == "body":
        body = helper.make_graph(
            [helper.make_node("Neg", ["cond"], ["o"])],
            "body",
            [],
            [helper.make_tensor_value_info("o", TensorProto.FLOAT, [2, 3])],
        )
        branch = helper.make_node("If", ["flag"], ["z"], then_branch=body, else_branch=body)
        reads = _graph_model([branch], ["flag"], ["z"], "h")
        reads.graph.input[0].type.tensor_type.elem_type = TensorProto.BOOL
        del reads.graph.input[0].type.tensor_type.shape.dim[:]  # a scalar condition
    else:
        reads = _graph_model([helper.make_node("Neg", ["cond"], ["z"])], ["t"], ["z"], "h")
    m1, m2 = (reads, unread) if reader == "m1" else (unread, reads)
    ref, ours = _both(m1, m2, io_map=[])
    assert isinstance(ref, onnx.ModelProto), ref
    assert ours.SerializeToString() == ref.SerializeToString()
    ref, ours = _both(m1, m2, io_map=[], prefix1="p/", prefix2="q/")
    assert isinstance(ref, onnx.checker.ValidationError) and isinstance(ours, onnx.checker.ValidationError)


def test_a_name_read_and_never_defined_binds_to_the_value_the_other_models_node_writes():
    """Where the first model's node writes the name the second reads without defining it,
    onnx.compose refuses the overlap (a ValueError); fastseq binds the read as onnx's merge
    binds it to an unread input, and the result passes the full check (renaming a read of
    nothing could only leave it reading nothing)."""
    writes = _graph_model([helper.make_node("Relu", ["b"], ["cond"])], ["b"], ["cond"], "g")
    reads = _graph_model([helper.make_node("Neg", ["cond"], ["z"])], ["t"], ["z"], "h")
    ref, ours = _both(writes, reads, io_map=[])
    assert isinstance(ref, ValueError) and "overlapping names" in str(ref)
    onnx.checker.check_model(ours, full_check=True)
    assert [(n.op_type, list(n.input)) for n in ours.graph.node] == [("Relu", ["b"]), ("Neg", ["cond"])]


@pytest.mark.parametrize(
    "seed",
    [
        2003,
        4284,
        996,
        1458,
        1547,
        2291,
        2747,
        3339,  # a known field, another wire type
        25986,
        48816,
        57003,
        72785,  # the checker's plain ValueError on a source
        9096,
        25169,
        92263,  # an io_map of names protobuf hands back as bytes
        36015,  # a name read and never defined, which the other model has as an unread input
    ],
)
def test_what_onnx_harness_found_is_onnx_result_byte_for_byte(seed):
    """The harness's inputs where onnx.compose returned a valid model and fastseq raised: each
    now gives onnx's model, byte for byte."""
    import compose_harness

    assert compose_fuzz.compare(compose_harness.make_case(seed)).category == "same"
