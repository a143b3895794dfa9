"""fastseq.onnx_compose side by side with onnx.compose: every documented scenario (onnx's own
compose tests and the cases of issue 20) through both, the resulting protos compared field by
field wherever onnx.compose succeeds, and ``onnx.checker`` run on every model fastseq
returns. Where onnx.compose fails or returns a broken model, the test says how, and checks
that fastseq's model is valid and computes what the models compute one after the other."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnx.compose as onnx_compose
import pytest
from onnx import GraphProto, ModelProto, TensorProto, helper, numpy_helper, parser

import fastseq
import fastseq.onnx_compose as compose
from conftest import run, run_chain

# --- onnx's own models (onnx/test/compose_test.py) -----------------------------------------

M1_DEF = """
    <ir_version: 7, opset_import: [ "": 10, "com.microsoft": 1]>
    agraph (float[N, M] A0, float[N, M] A1, float[N, M] _A) => (float[N, M] B00, float[N, M] B10, float[N, M] B20)
    {
        B00 = Add(A0, A1)
        B10 = Sub(A0, A1)
        B20 = Mul(A0, A1)
    }
    """

M2_DEF = """
    <ir_version: 7, opset_import: [ "": 10, "com.microsoft": 1]>
    agraph (float[N, M] B01, float[N, M] B11, float[N, M] B21) => (float[N, M] D0)
    {
        C0 = Add(B01, B11)
        C1 = Sub(B11, B21)
        D0 = Mul(C0, C1)
    }
    """

SAME_NAME_1 = """
    <ir_version: 7, opset_import: [ "": 10]>
    agraph (float[N, M] A) => (float[N, M] B) { B = Add(A, A) }
    """
SAME_NAME_2 = """
    <ir_version: 7, opset_import: [ "": 10]>
    agraph (float[N, M] B) => (float[N, M] C) { C = Add(B, B) }
    """

DROP_1 = """
    <ir_version: 7, opset_import: [ "": 10]>
    agraph (float[N] A0, float[N] B0) => (float[N] A1, float[N] B1)
    {
        A1 = Add(A0, A0)
        B1 = Sub(B0, B0)
    }
    """
DROP_2 = """
    <ir_version: 7, opset_import: [ "": 10]>
    agraph (float[N] A2, float[N] B2) => (float[N] A3, float[N] B3)
    {
        A3 = Add(A2, A2)
        B3 = Sub(B2, B2)
    }
    """

COLLIDE = """
    <ir_version: 7, opset_import: [ "": 10]>
    agraph (float[N] A, float[N] B) => (float[N] C) { C = Add(A, B) }
    """

# A first model with an input only a dead node reads, node names, value_info and doc strings.
DEAD = """
    <ir_version: 8, opset_import: [ "": 17]>
    first (float[2, 3] x, float[2, 3] unused) => (float[2, 3] y, float[2, 3] side)
    <float[2, 3] t, float[2, 3] dead>
    {
        t = Relu(x)
        y = Neg(t)
        side = Abs(x)
        dead = Sigmoid(unused)
    }
    """
TAIL = """
    <ir_version: 8, opset_import: [ "": 17]>
    second (float[2, 3] u, float[2, 3] v) => (float[2, 3] z, float[2, 3] w)
    <float[2, 3] u, float[2, 3] s>
    {
        s = Sin(u)
        z = Add(s, v)
        w = Cos(v)
    }
    """

# Uses, at its top level, the names of DEAD's dead part ('unused', 'dead').
SHARES_DEAD_NAMES = """
    <ir_version: 8, opset_import: [ "": 17]>
    third (float[2, 3] u) => (float[2, 3] z)
    {
        unused = Sin(u)
        dead = Cos(unused)
        z = Add(unused, dead)
    }
    """


def load(text: str) -> ModelProto:
    m = parser.parse_model(text)
    onnx.checker.check_model(m)
    return m


def named(m: ModelProto, tag: str = "") -> ModelProto:
    """``m`` with node names ({tag or graph name}_n0, ...) and a doc string."""
    for k, n in enumerate(m.graph.node):
        n.name = f"{tag or m.graph.name}_n{k}"
    m.graph.doc_string = f"the {tag or m.graph.name} graph"
    return m


# --- comparing protos field by field -------------------------------------------------------


def plain(msg):
    """A message as nested dicts and lists, fields holding their default value left out:
    onnx.compose sets an empty node name as present where fastseq leaves it absent."""
    out = {}
    for field, value in msg.ListFields():
        if field.is_repeated:
            value = [plain(v) if field.message_type else v for v in value]
        elif field.message_type:
            value = plain(value)
        if value not in ("", 0, [], {}, b"", False):
            out[field.name] = value
    return out


def _names(items) -> list[str]:
    return [i.name for i in items]


def assert_same_graph(ours: GraphProto, ref: GraphProto, where: str = "graph") -> None:
    assert ours.name == ref.name, f"{where}.name"
    assert ours.doc_string == ref.doc_string, f"{where}.doc_string"
    for field in ("input", "output", "value_info"):
        assert _names(getattr(ours, field)) == _names(getattr(ref, field)), f"{where}.{field} names"
        assert list(getattr(ours, field)) == list(getattr(ref, field)), f"{where}.{field} types"
    assert _names(ours.initializer) == _names(ref.initializer), f"{where}.initializer names"
    assert list(ours.initializer) == list(ref.initializer), f"{where}.initializer values"
    sparse = lambda g: [(s.values.name, s.indices.name) for s in g.sparse_initializer]  # noqa: E731
    assert sparse(ours) == sparse(ref), f"{where}.sparse_initializer names"
    assert list(ours.sparse_initializer) == list(ref.sparse_initializer), f"{where}.sparse_initializer"
    summary = lambda g: [(n.name, n.op_type, n.domain, list(n.input), list(n.output)) for n in g.node]  # noqa: E731
    assert summary(ours) == summary(ref), f"{where}.node (name, op_type, domain, inputs, outputs)"
    for k, (a, b) in enumerate(zip(ours.node, ref.node)):
        assert [x.name for x in a.attribute] == [x.name for x in b.attribute], f"{where}.node[{k}] attributes"
        for x, y in zip(a.attribute, b.attribute):
            if x.type == onnx.AttributeProto.GRAPH:
                assert_same_graph(x.g, y.g, f"{where}.node[{k}].{x.name}")
            elif x.type == onnx.AttributeProto.GRAPHS:
                for j, (gx, gy) in enumerate(zip(x.graphs, y.graphs)):
                    assert_same_graph(gx, gy, f"{where}.node[{k}].{x.name}[{j}]")
            else:
                assert plain(x) == plain(y), f"{where}.node[{k}].{x.name}"
    assert list(ours.quantization_annotation) == list(ref.quantization_annotation), f"{where}.quantization_annotation"
    assert list(ours.metadata_props) == list(ref.metadata_props), f"{where}.metadata_props"
    assert plain(ours) == plain(ref), f"{where}: every field"


def assert_same_model(ours: ModelProto, ref: ModelProto) -> None:
    onnx.checker.check_model(ours)
    for field in ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string"):
        assert getattr(ours, field) == getattr(ref, field), field
    opsets = lambda m: [(o.domain, o.version) for o in m.opset_import]  # noqa: E731
    assert opsets(ours) == opsets(ref), "opset_import"
    props = lambda m: [(p.key, p.value) for p in m.metadata_props]  # noqa: E731
    assert props(ours) == props(ref), "metadata_props"
    assert [(f.domain, f.name) for f in ours.functions] == [(f.domain, f.name) for f in ref.functions]
    assert [plain(f) for f in ours.functions] == [plain(f) for f in ref.functions], "functions"
    assert [plain(t) for t in ours.training_info] == [plain(t) for t in ref.training_info], "training_info"
    assert_same_graph(ours.graph, ref.graph)
    assert plain(ours) == plain(ref), "every field"


def both_merge(m1, m2, **kwargs) -> ModelProto:
    """merge_models and merge_graphs through onnx.compose and fastseq (both entry points),
    compared; returns fastseq's model."""
    ref = onnx_compose.merge_models(m1, m2, **kwargs)
    ours = compose.merge_models(m1, m2, **kwargs)
    assert_same_model(ours, ref)
    assert_same_model(fastseq.merge_models(m1, m2, **kwargs), ref)
    graph_kwargs = {
        k: v for k, v in kwargs.items() if k not in ("producer_name", "producer_version", "domain", "model_version")
    }
    ref_g = onnx_compose.merge_graphs(m1.graph, m2.graph, **graph_kwargs)
    ours_g = compose.merge_graphs(m1.graph, m2.graph, **graph_kwargs)
    assert_same_graph(ours_g, ref_g)
    return ours


# --- merge_models: onnx's scenarios, then variations ----------------------------------------

ONNX_SCENARIOS = {
    "connect_all_no_name_collision": (M1_DEF, M2_DEF, dict(io_map=[("B00", "B01"), ("B10", "B11"), ("B20", "B21")])),
    "connect_same_output_twice": (M1_DEF, M2_DEF, dict(io_map=[("B00", "B01"), ("B00", "B11"), ("B00", "B21")])),
    "connect_same_output_drop_outputs": (
        M1_DEF,
        M2_DEF,
        dict(io_map=[("B00", "B01"), ("B00", "B11"), ("B00", "B21")], outputs=["D0"]),
    ),
    "connect_same_input_output_name": (SAME_NAME_1, SAME_NAME_2, dict(io_map=[("B", "B")])),
    "drop_inputs_outputs": (DROP_1, DROP_2, dict(io_map=[("A1", "B2")], inputs=["A0"], outputs=["B3"])),
    "name_collision_prefix": (COLLIDE, COLLIDE, dict(io_map=[("C", "A")], prefix1="m1/", prefix2="m2/")),
    "connect_partially_no_name_collision": (M1_DEF, M2_DEF, dict(io_map=[("B00", "B01"), ("B10", "B11")])),
}

VARIATIONS = {
    # A consumed output kept as an output too; the unconsumed ones dropped.
    "consumed_output_kept": (
        M1_DEF,
        M2_DEF,
        dict(io_map=[("B00", "B01"), ("B10", "B11"), ("B20", "B21")], outputs=["B00", "D0"]),
    ),
    # The first model's unconsumed output kept, the rest left to the io_map.
    "first_output_kept": (
        M1_DEF,
        M2_DEF,
        dict(io_map=[("B00", "B01"), ("B00", "B11"), ("B00", "B21")], outputs=["B10", "D0"]),
    ),
    # inputs alone: the first model is cut down (its dead node goes), the second is not.
    "inputs_cut_dead_nodes": (DEAD, TAIL, dict(io_map=[("y", "u")], inputs=["x", "v"])),
    # outputs alone: value_info as the Extractor keeps it (inputs and outputs included).
    "outputs_cut_value_info": (DEAD, TAIL, dict(io_map=[("y", "u")], outputs=["z"])),
    "outputs_keep_side": (DEAD, TAIL, dict(io_map=[("y", "u")], outputs=["side", "w"])),
    "no_cut_keeps_dead_nodes": (DEAD, TAIL, dict(io_map=[("y", "u")])),
    # What the cut leaves out of the first model no longer clashes with the second's names.
    "cut_part_names_free": (DEAD, SHARES_DEAD_NAMES, dict(io_map=[("y", "u")], inputs=["x"])),
    "prefixes_and_cut": (
        DROP_1,
        DROP_2,
        dict(io_map=[("A1", "B2")], inputs=["a/A0"], outputs=["b/B3"], prefix1="a/", prefix2="b/"),
    ),
    "prefix_first_only": (DEAD, TAIL, dict(io_map=[("y", "u")], prefix1="p/")),
    "prefix_second_only": (DEAD, TAIL, dict(io_map=[("y", "u")], prefix2="q/", outputs=["q/z", "side"])),
    "explicit_fields": (
        M1_DEF,
        M2_DEF,
        dict(
            io_map=[("B00", "B01"), ("B10", "B11"), ("B20", "B21")],
            name="merged",
            doc_string="both",
            producer_name="me",
            producer_version="2.5",
            domain="ai.example",
            model_version=7,
        ),
    ),
}


@pytest.mark.parametrize("case", sorted(ONNX_SCENARIOS) + sorted(VARIATIONS))
def test_merge_models_gives_onnx_compose_result(case):
    first, second, kwargs = {**ONNX_SCENARIOS, **VARIATIONS}[case]
    m1, m2 = named(load(first), "a"), named(load(second), "b")
    both_merge(m1, m2, **kwargs)
    both_merge(load(first), load(second), **kwargs)  # empty node names and doc strings


def test_the_issue_cases_outputs_pruning_and_a_valid_model():
    m1, m2 = load(M1_DEF), load(M2_DEF)
    merged = compose.merge_models(m1, m2, io_map=[("B00", "B01"), ("B00", "B11"), ("B00", "B21")])
    assert _names(merged.graph.output) == ["B10", "B20", "D0"]
    merged = compose.merge_models(m1, m2, io_map=[("B00", "B01"), ("B10", "B11")])
    assert _names(merged.graph.input) == ["A0", "A1", "_A", "B21"]
    assert _names(merged.graph.output) == ["B20", "D0"]
    merged = compose.merge_models(m1, m2, io_map=[("B00", "B01"), ("B00", "B11"), ("B00", "B21")], outputs=["D0"])
    assert [n.op_type for n in merged.graph.node] == ["Add", "Add", "Sub", "Mul"]
    merged = compose.merge_models(load(DROP_1), load(DROP_2), io_map=[("A1", "B2")], inputs=["A0"], outputs=["B3"])
    onnx.checker.check_model(merged, full_check=True)
    assert [n.op_type for n in merged.graph.node] == ["Add", "Sub"]
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_allclose(run(merged, {"A0": x})["B3"], np.zeros(3, np.float32))


def test_pruned_stages_run_like_the_models_one_after_the_other():
    m1, m2 = load(DEAD), load(TAIL)
    merged = compose.merge_models(m1, m2, io_map=[("y", "u")], inputs=["x", "v"], outputs=["z", "side"])
    assert "Sigmoid" not in [n.op_type for n in merged.graph.node]
    x, v = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3), np.ones((2, 3), np.float32)
    first = run(m1, {"x": x, "unused": x})
    want = run(m2, {"u": first["y"], "v": v})
    got = run(merged, {"x": x, "v": v})
    np.testing.assert_allclose(got["z"], want["z"])
    np.testing.assert_allclose(got["side"], first["side"])


# --- metadata ---------------------------------------------------------------------------


def test_metadata_merged_with_onnx_compose_conflict_rule():
    m1, m2 = load(M1_DEF), load(M2_DEF)
    io_map = [("B00", "B01")]
    helper.set_model_props(m1, {"p1": "v1", "p2": "v2"})
    helper.set_model_props(m2, {"p3": "v3", "p4": "v4"})
    assert len(both_merge(m1, m2, io_map=io_map).metadata_props) == 4
    helper.set_model_props(m2, {"p1": "v1", "p4": "v4"})  # shared key, same value
    assert len(both_merge(m1, m2, io_map=io_map).metadata_props) == 3
    helper.set_model_props(m2, {"p1": "v5", "p4": "v4"})
    with pytest.raises(ValueError):
        onnx_compose.merge_models(m1, m2, io_map=io_map)
    with pytest.raises(ValueError, match="'p1' is 'v1' in .* but 'v5' in") as e:
        compose.merge_models(m1, m2, io_map=io_map)
    assert isinstance(e.value, fastseq.CompositionError)


# --- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "io_map",
    [
        [("wrong_outname", "B01"), ("B10", "B11"), ("B20", "B21")],
        [("B00", "wrong_input"), ("B10", "B11"), ("B20", "B21")],
    ],
)
def test_wrong_io_map_names_are_value_errors_in_both(io_map):
    m1, m2 = load(M1_DEF), load(M2_DEF)
    with pytest.raises(ValueError):
        onnx_compose.merge_models(m1, m2, io_map=io_map)
    with pytest.raises(ValueError, match="is not an (out|in)put of agraph .*; its (out|in)puts are") as e:
        compose.merge_models(m1, m2, io_map=io_map)
    assert isinstance(e.value, fastseq.CompositionError)


def test_opset_mismatch_is_a_value_error_in_both():
    m1, m2 = load(M1_DEF), load(M2_DEF)
    m1 = helper.make_model(m1.graph, producer_name="test", opset_imports=[helper.make_opsetid("", 10)])
    m2 = helper.make_model(m2.graph, producer_name="test", opset_imports=[helper.make_opsetid("", 15)])
    io_map = [("B00", "B01"), ("B10", "B11"), ("B20", "B21")]
    with pytest.raises(ValueError):
        onnx_compose.merge_models(m1, m2, io_map)
    with pytest.raises(fastseq.OpsetMismatchError) as e:
        compose.merge_models(m1, m2, io_map)
    assert isinstance(e.value, ValueError) and isinstance(e.value, fastseq.CompositionError)
    # Converted to the same opset, both merge, to the same model.
    both_merge(onnx.version_converter.convert_version(m1, 15), m2, io_map=io_map)


def test_wrong_argument_types_are_type_errors_like_onnx_compose():
    m1 = load(M1_DEF)
    for f, args in [
        (compose.merge_models, (m1.graph, m1, [])),
        (compose.merge_models, (m1, m1.graph, [])),
        (compose.merge_graphs, (m1, m1.graph, [])),
        (compose.add_prefix, (m1.graph, "p/")),
        (compose.add_prefix_graph, (m1, "p/")),
        (compose.expand_out_dim, (m1.graph, 0)),
        (compose.expand_out_dim_graph, (m1, 0)),
        (compose.check_overlapping_names, (m1, m1.graph)),
    ]:
        onnx_f = getattr(onnx_compose, f.__name__)
        with pytest.raises(TypeError) as want:
            onnx_f(*args)
        with pytest.raises(TypeError) as got:
            f(*args)
        assert str(got.value) == str(want.value)


# --- where onnx.compose fails or breaks the model ------------------------------------------


def test_different_ir_versions_merge_where_onnx_compose_refuses():
    m1 = load(
        '<ir_version: 7, opset_import: [ "": 13]> agraph (float[N, M] X0) => (float[N, M] Y0) { Y0 = Add(X0, X0) }'
    )
    m2 = load(
        '<ir_version: 6, opset_import: [ "": 13]> agraph (float[N, M] X1) => (float[N, M] Y1) { Y1 = Add(X1, X1) }'
    )
    with pytest.raises(ValueError, match="IR version mismatch"):
        onnx_compose.merge_models(m1, m2, io_map=[("Y0", "X1")])
    merged = compose.merge_models(m1, m2, io_map=[("Y0", "X1")])
    onnx.checker.check_model(merged)
    assert merged.ir_version == 7
    x = np.ones((2, 2), np.float32)
    np.testing.assert_allclose(run(merged, {"X0": x})["Y1"], 4 * x)


def test_external_data_references_are_kept_as_onnx_compose_keeps_them(tmp_path, monkeypatch):
    from onnx import external_data_helper

    monkeypatch.chdir(tmp_path)  # onnx.compose's checker looks for the data file from here

    m2 = _big_weight_model()
    external_data_helper.convert_model_to_external_data(m2, location="w.bin", size_threshold=0)
    onnx.save(m2, str(tmp_path / "m2.onnx"))
    m2 = onnx.load(str(tmp_path / "m2.onnx"), load_external_data=False)
    assert m2.graph.initializer[0].data_location == TensorProto.EXTERNAL
    m1 = load("""<ir_version: 8, opset_import: ["": 17]> a (float[3] x) => (float[3] y, float[3] y2)
                 { y = Relu(x)  y2 = Neg(x) }""")
    merged = both_merge(m1, m2, io_map=[("y", "x")], prefix1="p/", prefix2="q/")
    onnx.save(merged, str(tmp_path / "merged.onnx"))  # beside w.bin, it runs
    x = np.linspace(-1, 1, 3, dtype=np.float32)
    first = run(m1, {"x": x})["y"]
    np.testing.assert_allclose(run(str(tmp_path / "merged.onnx"), {"p/x": x})["q/y"], first * [0, 1, 2])


def _big_weight_model() -> ModelProto:
    w = numpy_helper.from_array(np.arange(3, dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["y"], name="scale")],
        "weights",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_result_over_the_protobuf_limit_is_refused_with_the_way_out(monkeypatch):
    from fastseq import _core

    monkeypatch.setattr(_core, "PROTOBUF_LIMIT", 64)  # stands for 2 GB
    with pytest.raises(ValueError, match="more than an onnx.ModelProto can hold .*compose_to_file"):
        compose.merge_models(_big_weight_model(), _big_weight_model(), io_map=[("y", "x")], prefix2="b/")


def _ir3_pair():
    """IR 3 models, which list their initializers among the inputs."""
    w = numpy_helper.from_array(np.array([1.0, 2.0, 3.0], np.float32), "w")
    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [3])  # noqa: E731
    g1 = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"], name="add")], "first", [vi("x"), vi("w")], [vi("y")], [w]
    )
    g2 = helper.make_graph([helper.make_node("Relu", ["u"], ["z"], name="relu")], "second", [vi("u")], [vi("z")])
    return [helper.make_model(g, opset_imports=[helper.make_opsetid("", 8)], ir_version=3) for g in (g1, g2)]


def test_ir3_weights_listed_as_inputs_stay_inputs():
    m1, m2 = _ir3_pair()
    both_merge(m1, m2, io_map=[("y", "u")])
    # inputs= names the real inputs; onnx.compose drops the weight's input and fails its check.
    with pytest.raises(onnx.checker.ValidationError):
        onnx_compose.merge_models(m1, m2, io_map=[("y", "u")], inputs=["x"])
    merged = compose.merge_models(m1, m2, io_map=[("y", "u")], inputs=["x"])
    onnx.checker.check_model(merged)
    assert _names(merged.graph.input) == ["x", "w"]


def test_names_of_the_cut_part_clash_only_when_kept():
    m1, m2 = load(DEAD), load(SHARES_DEAD_NAMES)
    with pytest.raises(ValueError, match="overlapping names"):
        onnx_compose.merge_models(m1, m2, io_map=[("y", "u")])
    merged = compose.merge_models(m1, m2, io_map=[("y", "u")])
    onnx.checker.check_model(merged)
    assert [n.output[0] for n in merged.graph.node if n.op_type in ("Sin", "Cos")] == ["m1/unused", "m1/dead"]


def test_clashing_names_without_prefixes_merge_where_onnx_compose_refuses():
    m = load(COLLIDE)
    with pytest.raises(ValueError, match="overlapping names"):
        onnx_compose.merge_models(m, m, io_map=[("C", "A")])
    merged = compose.merge_models(m, m, io_map=[("C", "A")])
    onnx.checker.check_model(merged)
    # The second model's output keeps its name; the first's, now internal, gives way.
    assert (_names(merged.graph.input), _names(merged.graph.output)) == (["A", "B", "m1/B"], ["C"])
    a, b, b2 = (np.full(2, v, np.float32) for v in (1, 2, 5))
    np.testing.assert_allclose(run(merged, {"A": a, "B": b, "m1/B": b2})["C"], a + b + b2)


def test_node_names_both_graphs_use_are_renamed_where_onnx_compose_keeps_them_twice():
    m1, m2 = named(load(SAME_NAME_1)), named(load(SAME_NAME_2))  # both "agraph_n0"
    ref = onnx_compose.merge_models(m1, m2, io_map=[("B", "B")])
    assert [n.name for n in ref.graph.node] == ["agraph_n0", "agraph_n0"]
    with pytest.raises(Exception, match="two nodes with same node name"):
        run(ref, {"A": np.ones((1, 1), np.float32)})
    ours = compose.merge_models(m1, m2, io_map=[("B", "B")])
    onnx.checker.check_model(ours)
    assert [n.name for n in ours.graph.node] == ["agraph_n0", "m1/agraph_n0"]
    np.testing.assert_allclose(run(ours, {"A": np.ones((1, 1), np.float32)})["C"], [[4.0]])


def test_left_out_input_that_a_kept_node_reads_is_refused():
    m1, m2 = load(DROP_1), load(DROP_2)
    # onnx.compose keeps the Sub reading B0 but drops the input B0.
    with pytest.raises(Exception):  # noqa: B017 - whatever onnx.compose's broken model makes onnx raise
        onnx_compose.merge_models(m1, m2, io_map=[("A1", "B2")], inputs=["A0"], outputs=["B1", "B3"])
    with pytest.raises(ValueError, match="input 'B0' of .* is left out by inputs, but the outputs kept need it"):
        compose.merge_models(m1, m2, io_map=[("A1", "B2")], inputs=["A0"], outputs=["B1", "B3"])


def test_unknown_names_in_inputs_outputs_and_fed_inputs_are_refused():
    m1, m2 = load(M1_DEF), load(M2_DEF)
    io_map = [("B00", "B01"), ("B10", "B11"), ("B20", "B21")]
    # onnx.compose drops an unknown output name silently.
    assert _names(onnx_compose.merge_models(m1, m2, io_map=io_map, outputs=["D0", "D1"]).graph.output) == ["D0"]
    with pytest.raises(ValueError, match="'D1' is not an output of any model \\(did you mean 'D0'"):
        compose.merge_models(m1, m2, io_map=io_map, outputs=["D0", "D1"])
    with pytest.raises(ValueError, match="'B01' is in inputs but an io_map pair feeds it"):
        compose.merge_models(m1, m2, io_map=io_map, inputs=["A0", "A1", "B01"])


def _if_model(name: str, reads: str, local: str, with_initializer: bool) -> ModelProto:
    """y = If(sum(x) > 0): x * r else x - r, where both bodies read ``reads`` from outside
    (the initializer 'c', or the edge 'r' = Abs(x)) and the else body has a value ``local``."""
    body = lambda op, out, extra: helper.make_graph(  # noqa: E731
        [helper.make_node(op, ["x", reads], [extra]), helper.make_node("Identity", [extra], [out])],
        f"{name}_{op}",
        [],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, [2, 4])],
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name=f"{name}_sum"),
        helper.make_node("Greater", ["s", "zero"], ["cond"], name=f"{name}_gt"),
        helper.make_node(
            "If",
            ["cond"],
            ["y"],
            name=f"{name}_if",
            then_branch=body("Mul", "then_out", f"{local}_t"),
            else_branch=body("Sub", "else_out", local),
        ),
    ]
    inits = [numpy_helper.from_array(np.array(0.0, np.float32), "zero")]
    if with_initializer:
        inits.append(numpy_helper.from_array(np.array([2.0, 3.0, 4.0, 5.0], np.float32), "c"))
    else:
        nodes.insert(0, helper.make_node("Abs", ["x"], ["r"], name=f"{name}_abs"))
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


X = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)


def test_subgraphs_reading_outer_edges_merge_like_onnx_compose():
    m1, m2 = _if_model("a", "r", "local", False), _if_model("b", "r", "local", False)
    merged = both_merge(m1, m2, io_map=[("y", "x")], prefix1="a/", prefix2="b/")
    for x in (X, X + 1):
        want = run_chain([m1, m2], {"x": x})["y"]
        np.testing.assert_allclose(run(merged, {"a/x": x})["b/y"], want)


def test_names_only_bodies_have_do_not_clash_across_models():
    # Top-level names differ; both else bodies define 'local' (sibling scopes in the merge).
    m1 = _if_model("a", "r", "local", False)
    m2 = compose.add_prefix(_if_model("b", "r", "local", False), "b/", rename_nodes=False)
    (else_body,) = [a.g for a in m2.graph.node[3].attribute if a.name == "else_branch"]
    assert [list(n.output) for n in else_body.node] == [["local"], ["else_out"]]
    merged = both_merge(m1, m2, io_map=[("y", "b/x")])
    want = run_chain([m1, m2], {"x": X}, io_maps=[[("y", "b/x")]])["b/y"]
    np.testing.assert_allclose(run(merged, {"x": X})["b/y"], want)


def test_bodies_reading_an_outer_initializer_stay_valid_where_onnx_compose_breaks_them():
    m1, m2 = _if_model("a", "c", "local", True), _if_model("b", "c", "local", True)
    with pytest.raises(onnx.checker.ValidationError, match="topologically sorted"):
        onnx_compose.merge_models(m1, m2, io_map=[("y", "x")], prefix1="a/", prefix2="b/")
    merged = compose.merge_models(m1, m2, io_map=[("y", "x")], prefix1="a/", prefix2="b/")
    onnx.checker.check_model(merged, full_check=True)
    for x in (X, X + 1):
        np.testing.assert_allclose(run(merged, {"a/x": x})["b/y"], run_chain([m1, m2], {"x": x})["y"])


# --- initializers, sparse initializers, value_info, functions ------------------------------


def _sparse(name: str) -> onnx.SparseTensorProto:
    values = helper.make_tensor(
        name + "_values", TensorProto.FLOAT, [3], np.array([1.7, 0.4, 0.9], np.float32), raw=False
    )
    indices = helper.make_tensor(name + "_idx", TensorProto.INT64, [3], np.array([2, 3, 5], np.int64), raw=False)
    return helper.make_sparse_tensor(values, indices, [3, 3])


def _identity_models():
    """onnx's test_merge_drop_unnecessary_initializers_and_value_info models."""
    ops = [helper.make_opsetid("", 10)]
    g = GraphProto()
    g.input.extend([helper.make_tensor_value_info("x", TensorProto.FLOAT, [])])
    g.output.extend([helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    g.node.extend([helper.make_node("Identity", inputs=["x"], outputs=["y"])])
    out = []
    for name, extra in [
        ("g1", None),
        ("g2", "initializer"),
        ("g3", "sparse_initializer"),
        ("g4", "value_info"),
    ]:
        gk = GraphProto()
        gk.CopyFrom(g)
        gk.name = name
        if extra == "initializer":
            gk.initializer.extend([helper.make_tensor(name="x", data_type=TensorProto.FLOAT, dims=(), vals=[0])])
        elif extra == "sparse_initializer":
            gk.sparse_initializer.extend([_sparse("x")])
        elif extra == "value_info":
            gk.value_info.extend([helper.make_tensor_value_info("x", TensorProto.FLOAT, [])])
        out.append(helper.make_model(gk, producer_name="test", opset_imports=ops))
    return out


@pytest.mark.parametrize("second", [1, 2, 3])
def test_initializers_sparse_initializers_and_value_info_of_fed_inputs_are_dropped(second):
    models = _identity_models()
    merged = both_merge(models[0], models[second], prefix1="m1/", io_map=[("y", "x")])
    assert len(merged.graph.initializer) == 0  # ('x_values', the sparse one's name, stays)
    assert _names(merged.graph.value_info) == ["m1/y"]  # the joint's type, not the input's


def _sparse_model(name: str) -> ModelProto:
    """y = x + the values of a sparse initializer, and y2 = -x."""
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", f"{name}_w_values"], ["y"], name=f"{name}_add"),
            helper.make_node("Neg", ["x"], ["y2"], name=f"{name}_neg"),
        ],
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("y2", TensorProto.FLOAT, [3]),
        ],
    )
    graph.sparse_initializer.extend([_sparse(f"{name}_w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_sparse_initializers_merge_and_are_cut_down_where_onnx_compose_refuses():
    m1, m2 = _sparse_model("a"), _sparse_model("b")
    kw = dict(io_map=[("y", "x")], prefix1="p/", prefix2="q/")
    # onnx's full check types a sparse initializer as a sparse tensor, which Add does not
    # take: onnx.compose returns the model, fastseq.onnx_compose refuses what fails the check.
    ref = onnx_compose.merge_models(m1, m2, **kw)
    with pytest.raises(onnx.shape_inference.InferenceError, match="sparse_tensor"):
        onnx.checker.check_model(ref, full_check=True)
    with pytest.raises(fastseq.InvalidShapesError, match="sparse_tensor") as e:
        compose.merge_models(m1, m2, **kw)
    assert isinstance(e.value, onnx.shape_inference.InferenceError) and isinstance(
        e.value.__cause__, type(e.value.__cause__)
    )
    assert_same_model(fastseq.merge_models(m1, m2, **kw), ref)  # fastseq's own merge_models returns it
    with pytest.raises(ValueError, match="len_sparse_initializer"):
        onnx_compose.merge_models(m1, m2, io_map=[("y", "x")], prefix1="p/", prefix2="q/", outputs=["q/y"])
    merged = fastseq.merge_models(m1, m2, io_map=[("y", "x")], prefix1="p/", prefix2="q/", outputs=["q/y"])
    onnx.checker.check_model(merged)
    assert [(s.values.name, s.indices.name) for s in merged.graph.sparse_initializer] == [
        ("p/a_w_values", "p/a_w_idx"),
        ("q/b_w_values", "q/b_w_idx"),
    ]


def _function(domain, name, inputs, outputs, nodes, ops):
    f = onnx.FunctionProto()
    f.domain, f.name = domain, name
    f.input.extend(inputs)
    f.output.extend(outputs)
    f.node.extend(nodes)
    f.opset_import.extend(ops)
    return f


def _function_models():
    """onnx's test_overlapping_function_names models: m1 and m2 call local.f1 (Add, Mul
    bodies), m3 calls local.f2, which calls local.f1."""
    ops = [helper.make_opsetid("", 10), helper.make_opsetid("local", 10)]
    g = GraphProto()
    g.input.extend(
        [
            helper.make_tensor_value_info("x0", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("x1", TensorProto.FLOAT, []),
        ]
    )
    g.output.extend([helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    g.node.extend([helper.make_node("f1", domain="local", inputs=["x0", "x1"], outputs=["y"])])
    models = []
    for name, op in [("g1", "Add"), ("g2", "Mul")]:
        gk = GraphProto()
        gk.CopyFrom(g)
        gk.name = name
        m = helper.make_model(gk, producer_name="test", opset_imports=ops)
        m.functions.extend(
            [_function("local", "f1", ["x0", "x1"], ["y"], [helper.make_node(op, ["x0", "x1"], ["y"])], ops)]
        )
        models.append(m)
    g3 = GraphProto()
    g3.CopyFrom(g)
    g3.name = "g3"
    g3.node[0].op_type = "f2"
    m3 = helper.make_model(g3, producer_name="test", opset_imports=ops)
    m3.functions.extend(
        [
            _function(
                "local",
                "f1",
                ["x0", "x1"],
                ["y"],
                [
                    helper.make_node("Add", ["x0", "x1"], ["y0"]),
                    helper.make_node("Mul", ["x0", "x1"], ["y1"]),
                    helper.make_node("Add", ["y0", "y1"], ["y"]),
                ],
                ops,
            ),
            _function(
                "local",
                "f2",
                ["x0", "x1"],
                ["y"],
                [
                    helper.make_node("f1", domain="local", inputs=["x0", "x1"], outputs=["y0"]),
                    helper.make_node("Mul", ["x0", "x1"], ["y1"]),
                    helper.make_node("Add", ["y0", "y1"], ["y"]),
                ],
                ops,
            ),
        ]
    )
    models.append(m3)
    return models


def test_local_functions_prefixed_like_onnx_compose():
    m1, m2, m3 = _function_models()
    merged = both_merge(m1, m2, io_map=[("y", "x0"), ("y", "x1")], prefix1="m1/", prefix2="m2/")
    assert [n.op_type for n in merged.graph.node] == ["m1/f1", "m2/f1"]
    merged = both_merge(m1, m3, io_map=[("y", "x0"), ("y", "x1")], prefix1="m1/", prefix2="m3/")
    assert [f.name for f in merged.functions] == ["m1/f1", "m3/f1", "m3/f2"]
    assert [n.op_type for n in merged.functions[2].node] == ["m3/f1", "Mul", "Add"]


def test_same_named_functions_without_prefixes_merge_where_onnx_compose_refuses():
    m1, m2, _ = _function_models()
    renamed_io = onnx_compose.add_prefix(m2, "b/", rename_functions=False)
    with pytest.raises(ValueError, match="overlapping local function names"):
        onnx_compose.merge_models(m1, renamed_io, io_map=[("y", "b/x0"), ("y", "b/x1")])
    merged = compose.merge_models(m1, renamed_io, io_map=[("y", "b/x0"), ("y", "b/x1")])
    onnx.checker.check_model(merged)
    feeds = {"x0": np.array(2.0, np.float32), "x1": np.array(3.0, np.float32)}
    assert run(merged, feeds)["b/y"] == 25.0  # (2 + 3) * (2 + 3): two bodies, two names


# --- add_prefix -----------------------------------------------------------------------------

FLAGS = ["rename_nodes", "rename_edges", "rename_inputs", "rename_outputs", "rename_initializers", "rename_value_infos"]


def _rich_model() -> ModelProto:
    """Initializers, a sparse initializer, value_info, node names, a local function and an
    If whose bodies read outer edges (not initializers: onnx.compose handles those)."""
    m = _if_model("rich", "r", "local", False)
    g = m.graph
    g.value_info.extend([helper.make_tensor_value_info("s", TensorProto.FLOAT, [])])
    g.sparse_initializer.extend([_sparse("sp")])
    g.node.append(helper.make_node("fn", ["y", "x"], ["z"], domain="local", name="call"))
    g.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 4]))
    m.opset_import.append(helper.make_opsetid("local", 1))
    m.functions.append(
        _function(
            "local",
            "fn",
            ["a", "b"],
            ["c"],
            [helper.make_node("Add", ["a", "b"], ["c"])],
            [helper.make_opsetid("", 17)],
        )
    )
    onnx.checker.check_model(m)
    return m


@pytest.mark.parametrize("flags", [(), *[(f,) for f in FLAGS], tuple(FLAGS)])
@pytest.mark.parametrize("source", ["M1", "rich"])
def test_add_prefix_gives_onnx_compose_result(flags, source):
    m = load(M1_DEF) if source == "M1" else _rich_model()
    kwargs = {f: f in flags for f in FLAGS}
    ref = onnx_compose.add_prefix(m, "pre/", **kwargs)
    ours = compose.add_prefix(m, "pre/", **kwargs)
    try:
        onnx.checker.check_model(ref)
    except onnx.checker.ValidationError:
        # onnx.compose leaves the bodies alone without rename_nodes: they still read the
        # outer names it renamed (edges, inputs). fastseq renames those reads.
        assert source == "rich" and "rename_nodes" not in flags
        onnx.checker.check_model(ours, full_check=True)
        feeds = {i.name: X for i in ours.graph.input}
        want = run(m, {"x": X})
        assert (
            sorted(run(ours, feeds).values(), key=lambda a: a.sum())[0].tolist()
            == sorted(want.values(), key=lambda a: a.sum())[0].tolist()
        )
        return
    assert_same_model(ours, ref)
    ref_g = onnx_compose.add_prefix_graph(m.graph, "pre/", **kwargs)
    ours_g = compose.add_prefix_graph(m.graph, "pre/", **kwargs)
    assert_same_graph(ours_g, ref_g)


def test_add_prefix_inplace_edits_the_given_proto():
    m = _rich_model()
    before = ModelProto()
    before.CopyFrom(m)
    ref = onnx_compose.add_prefix(before, "p.")
    assert compose.add_prefix(m, "p.", inplace=True) is m
    assert_same_model(m, ref)
    g = GraphProto()
    g.CopyFrom(before.graph)
    ref_map: dict[str, str] = {}
    ref_g = onnx_compose.add_prefix_graph(g, "q.", name_map=ref_map)
    ours_map: dict[str, str] = {}
    assert compose.add_prefix_graph(g, "q.", inplace=True, name_map=ours_map) is g
    assert_same_graph(g, ref_g)
    assert {k: v for k, v in ref_map.items() if k != v} == ours_map


def test_add_prefix_attribute_subgraph_like_onnx_compose():
    # onnx's test_add_prefix_attribute_subgraph graph: both bodies define 'Out', as the If does.
    C = helper.make_tensor_value_info("C", TensorProto.BOOL, [1])
    X, Y, Z, Out = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, 1]) for n in ("X", "Y", "Z", "Out"))
    add = helper.make_node("Add", inputs=["XY", "Z"], outputs=["Out"])
    sub = helper.make_node("Sub", inputs=["XY", "Z"], outputs=["Out"])
    cond = helper.make_node(
        "If",
        inputs=["C"],
        outputs=["Out"],
        then_branch=helper.make_graph([add], "then", [], [Out]),
        else_branch=helper.make_graph([sub], "else", [], [Out]),
    )
    graph = helper.make_graph([helper.make_node("Mul", ["X", "Y"], ["XY"]), cond], "graph", [C, X, Y, Z], [Out])
    ours = compose.add_prefix_graph(graph, "prefix.")
    onnx.checker.check_graph(ours)
    assert_same_graph(ours, onnx_compose.add_prefix_graph(graph, "prefix."))


def test_add_prefix_keeps_bodies_reading_outer_initializers_valid():
    m = _if_model("a", "c", "local", True)
    broken = onnx_compose.add_prefix(m, "p/")
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(broken, full_check=True)
    ours = compose.add_prefix(m, "p/")
    onnx.checker.check_model(ours, full_check=True)
    for x in (X, X + 1):
        np.testing.assert_allclose(run(ours, {"p/x": x})["p/y"], run(m, {"x": x})["y"])


def test_add_prefix_renames_calls_of_the_functions_domain_only():
    m = _rich_model()
    # A standard node whose op_type happens to be a local function's name.
    m.functions[0].name = "Abs"
    for n in m.graph.node:
        if n.domain == "local":
            n.op_type = "Abs"
    onnx.checker.check_model(m)
    ref = onnx_compose.add_prefix(m, "p/")
    assert "p/Abs" in [n.op_type for n in ref.graph.node if n.domain == ""]  # onnx.compose's mistake
    ours = compose.add_prefix(m, "p/")
    onnx.checker.check_model(ours)
    assert [(n.domain, n.op_type) for n in ours.graph.node if "Abs" in n.op_type] == [("", "Abs"), ("local", "p/Abs")]


# --- expand_out_dim -----------------------------------------------------------------------


def _static(opset: int) -> ModelProto:
    m = load(M1_DEF.replace("N, M", "2, 3").replace('"": 10', f'"": {opset}'))
    return named(m)


@pytest.mark.parametrize("dim_idx", [0, 1, 2])
def test_expand_out_dim_gives_onnx_compose_result(dim_idx):
    m = _static(13)
    ref = onnx_compose.expand_out_dim(m, dim_idx)
    ours = compose.expand_out_dim(m, dim_idx)
    assert_same_model(ours, ref)
    assert_same_graph(
        compose.expand_out_dim_graph(m.graph, dim_idx), onnx_compose.expand_out_dim_graph(m.graph, dim_idx)
    )
    copy = ModelProto()
    copy.CopyFrom(m)
    assert compose.expand_out_dim(copy, dim_idx, inplace=True) is copy
    assert_same_model(copy, ref)
    a = np.ones((2, 3), np.float32)
    got = run(ours, {"A0": a, "A1": a, "_A": a})
    assert got["B00"].shape == tuple(np.expand_dims(a, dim_idx).shape)


@pytest.mark.parametrize("dim_idx", [-1, -3])
def test_expand_out_dim_negative_index_counts_from_the_back_of_the_new_shape(dim_idx):
    m = _static(13)
    ref = onnx_compose.expand_out_dim(m, dim_idx)
    ours = compose.expand_out_dim(m, dim_idx)
    assert [n.op_type for n in ours.graph.node] == [n.op_type for n in ref.graph.node]
    want = list(np.expand_dims(np.ones((2, 3)), dim_idx).shape)
    shape = [d.dim_value for d in ours.graph.output[0].type.tensor_type.shape.dim]
    assert shape == want
    a = np.ones((2, 3), np.float32)
    assert list(run(ours, {"A0": a, "A1": a, "_A": a})["B00"].shape) == want


def test_expand_out_dim_keeps_symbolic_dims_and_older_opsets_valid():
    m = load(M1_DEF)  # [N, M], opset 10: Unsqueeze takes its axes as an attribute
    ours = compose.expand_out_dim(m, 0)
    onnx.checker.check_model(ours, full_check=True)
    dims = [(d.dim_value, d.dim_param) for d in ours.graph.output[0].type.tensor_type.shape.dim]
    assert dims == [(1, ""), (0, "N"), (0, "M")]
    a = np.ones((2, 3), np.float32)
    assert run(ours, {"A0": a, "A1": a, "_A": a})["B00"].shape == (1, 2, 3)


# --- check_overlapping_names --------------------------------------------------------------


def _overlap_models(
    inputs0=("i0", "i1"),
    inputs1=("i2", "i3"),
    outputs0=("o0", "o1"),
    outputs1=("o2", "o3"),
    value_info0=("v0", "v1"),
    value_info1=("v2", "v3"),
    initializer0=("init0", "init1"),
    initializer1=("init2", "init3"),
    sparse0=("sparse_init0", "sparse_init1"),
    sparse1=("sparse_init2", "sparse_init3"),
):
    def model(name, ins, outs, vis, inits, sparse):
        g = helper.make_graph(
            [helper.make_node("Identity", [i], [o]) for i, o in zip(ins, outs)],
            name,
            [helper.make_tensor_value_info(i, TensorProto.FLOAT, []) for i in ins],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, []) for o in outs],
            initializer=[helper.make_tensor(n, TensorProto.INT64, (), [1]) for n in inits],
            value_info=[helper.make_tensor_value_info(v, TensorProto.FLOAT, []) for v in vis],
            sparse_initializer=[_sparse(s) for s in sparse],
        )
        return helper.make_model(g, producer_name="test", opset_imports=[helper.make_opsetid("", 10)])

    return (
        model("g0", inputs0, outputs0, value_info0, initializer0, sparse0),
        model("g1", inputs1, outputs1, value_info1, initializer1, sparse1),
    )


@pytest.mark.parametrize(
    "overlap",
    [
        {},
        dict(inputs0=["i0", "i1"], inputs1=["i1", "i2"]),
        dict(outputs0=["o0", "o1"], outputs1=["o1", "o2"]),
        dict(value_info0=["vi0", "vi1"], value_info1=["vi1", "vi2"]),
        dict(initializer0=["init0", "init1"], initializer1=["init1", "init2"]),
        dict(sparse0=["sparse_init0", "sparse_init1"], sparse1=["sparse_init1", "sparse_init2"]),
        dict(inputs0=["a", "b"], inputs1=["b", "a"], value_info0=["a", "v"], value_info1=["v", "a"]),
    ],
)
def test_check_overlapping_names_like_onnx_compose(overlap):
    m0, m1 = _overlap_models(**overlap)
    for io_map in (None, [("o0", "i2")], [("o1", "i1")]):
        ref = onnx_compose.check_overlapping_names(m0.graph, m1.graph, io_map)
        ours = compose.check_overlapping_names(m0.graph, m1.graph, io_map)
        # onnx.compose lists each kind's names in a set's order: compared as sets.
        assert [(kind, sorted(names)) for kind, names in ours] == [(kind, sorted(names)) for kind, names in ref]
    prefixed = compose.add_prefix(m0, "g0/")
    assert compose.check_overlapping_names(prefixed.graph, m1.graph) == []


# --- a build script, unchanged but for its import -----------------------------------------


def _build_script(c, parts):
    """What a script written for onnx.compose does: prefix every part, merge them pairwise,
    add a batch axis to the result."""
    merged = c.add_prefix(parts[0], "s0/")
    for j, part in enumerate(parts[1:], start=1):
        merged = c.merge_models(merged, c.add_prefix(part, f"s{j}/"), io_map=[(f"s{j - 1}/y", f"s{j}/x")])
    return c.expand_out_dim(merged, 0)


def test_a_build_script_gets_the_same_model_through_either_module():
    parts = [_if_model(f"p{k}", "r", "local", False) for k in range(4)]
    ref = _build_script(onnx_compose, parts)
    ours = _build_script(compose, parts)
    assert_same_model(ours, ref)
    np.testing.assert_allclose(run(ours, {"s0/x": X})["s3/y"], run(ref, {"s0/x": X})["s3/y"])


def test_the_public_module_exports_the_whole_of_onnx_compose():
    public = {n for n in dir(onnx_compose) if not n.startswith("_") and callable(getattr(onnx_compose, n))}
    public -= {"ModelProto", "GraphProto", "TensorProto", "AttributeProto", "TYPE_CHECKING"}
    assert public <= set(compose.__all__)
    import inspect

    for name in compose.__all__:
        ours, ref = inspect.signature(getattr(compose, name)), inspect.signature(getattr(onnx_compose, name))
        assert [(p.name, p.default) for p in ours.parameters.values()] == [
            (p.name, p.default) for p in ref.parameters.values()
        ], name


@pytest.mark.parametrize("combo", list(itertools.product([None, "a/"], [None, "b/"])))
def test_prefix_combinations_on_clashing_models(combo):
    prefix1, prefix2 = combo
    m = named(load(COLLIDE))
    kwargs = dict(io_map=[("C", "A")], prefix1=prefix1, prefix2=prefix2)
    if prefix1 or prefix2:
        both_merge(m, m, **kwargs)
    else:
        with pytest.raises(ValueError):
            onnx_compose.merge_models(m, m, **kwargs)
        onnx.checker.check_model(compose.merge_models(m, m, **kwargs))
