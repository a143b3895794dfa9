"""Names and scopes: the cases where onnx.compose is wrong or refuses, and routing."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.compose
import pytest
from onnx import TensorProto, helper, numpy_helper

import fastseq
from conftest import (
    if_model_reading_outer_initializer,
    loop_model_reading_outer_initializer,
    run,
    run_chain,
    scale_model,
)


def onnx_compose_fails(m1, m2, io_map) -> bool:
    try:
        merged = onnx.compose.merge_models(m1, m2, io_map=io_map, prefix1="a/", prefix2="b/")
        run(merged, {"a/x": np.ones((2, 4), np.float32)})
    except Exception:  # noqa: BLE001 - any failure is onnx.compose's failing
        return True
    return False


@pytest.mark.parametrize("make", [if_model_reading_outer_initializer, loop_model_reading_outer_initializer])
def test_subgraphs_reading_outer_initializers(make, x24):
    m = make()
    assert onnx_compose_fails(m, m, [("y", "x")]), "onnx.compose got better: keep this test honest"
    merged = fastseq.compose([m, m])
    onnx.checker.check_model(merged, full_check=True)
    for sign in (1, -1):
        x = np.abs(x24) * sign
        np.testing.assert_allclose(run(merged, {"x": x})["y"], run_chain([m, m], {"x": x})["y"], rtol=1e-6)


def test_subgraph_shadowing_follows_its_own_definition():
    """The else branch defines its own 't', shadowing the outer 't'. In the second copy the
    outer 't' and the branch's 't' are renamed consistently, never crossed."""
    m = if_model_reading_outer_initializer(shadow=True)
    merged = fastseq.compose([m, m])
    second_if = [n for n in merged.graph.node if n.op_type == "If"][1]
    else_branch = next(a.g for a in second_if.attribute if a.name == "else_branch")
    sub, ident = else_branch.node
    assert sub.output[0] == ident.input[0] == "m1/t"
    assert sub.input[1] == "m1/c"  # the outer initializer, renamed with its model
    # Copy 2 reads copy 1's output, renamed because copy 2's own output keeps "y".
    assert sub.input[0] == "m0/y"
    # ONNX Runtime and onnx.checker refuse shadowing, so this is checked on the structure:
    # the first copy is left exactly as it was.
    first_if = [n for n in merged.graph.node if n.op_type == "If"][0]
    assert first_if.attribute == [n for n in m.graph.node if n.op_type == "If"][0].attribute


def _custom_relu_function(body_op: str) -> onnx.FunctionProto:
    return helper.make_function(
        "custom",
        "Relu",
        ["X"],
        ["Y"],
        [helper.make_node(body_op, ["X"], ["Y"])],
        [helper.make_opsetid("", 17)],
    )


def _model_with_function(body_op: str) -> onnx.ModelProto:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),  # the standard Relu, domain ""
        helper.make_node("Relu", ["a"], ["y"], domain="custom"),  # the local function
    ]
    g = helper.make_graph(
        nodes,
        "f",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
    )
    return helper.make_model(
        g,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
        functions=[_custom_relu_function(body_op)],
        ir_version=8,
    )


def test_function_callers_renamed_only_in_their_domain(x24):
    a, b = _model_with_function("Neg"), _model_with_function("Abs")
    merged = fastseq.compose([a, b])
    onnx.checker.check_model(merged, full_check=True)
    assert sorted(f.name for f in merged.functions) == ["Relu", "Relu__m1"]
    standard = [n for n in merged.graph.node if n.domain == ""]
    assert [n.op_type for n in standard] == ["Relu", "Relu"]  # untouched
    custom = [n.op_type for n in merged.graph.node if n.domain == "custom"]
    assert custom == ["Relu", "Relu__m1"]
    np.testing.assert_allclose(run(merged, {"x": x24})["y"], run_chain([a, b], {"x": x24})["y"])


def test_sparse_initializers_annotations_value_info_and_training_bindings_follow_renames(x24):
    def model():
        m = scale_model(2.0)
        dense = m.graph.initializer.pop()
        values = numpy_helper.from_array(numpy_helper.to_array(dense), "c")
        indices = numpy_helper.from_array(np.arange(4, dtype=np.int64), "c_indices")
        m.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [4]))
        m.graph.value_info.append(helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 4]))
        ann = onnx.TensorAnnotation(tensor_name="t")
        ann.quant_parameter_tensor_names.add(key="SCALE_TENSOR", value="c")
        m.graph.quantization_annotation.append(ann)
        ti = m.training_info.add()
        ti.update_binding.add(key="c", value="t")
        return m

    a, b = model(), model()
    merged = fastseq.compose([a, b])
    g = merged.graph
    assert [s.values.name for s in g.sparse_initializer] == ["c", "m1/c"]
    assert [v.name for v in g.value_info if v.name.endswith("t")][:2] == ["t", "m1/t"]
    assert [(q.tensor_name, q.quant_parameter_tensor_names[0].value) for q in g.quantization_annotation] == [
        ("t", "c"),
        ("m1/t", "m1/c"),
    ]
    assert [(b.key, b.value) for t in merged.training_info for b in t.update_binding] == [("c", "t"), ("m1/c", "m1/t")]
    assert g.node[2].input == ["m0/y", "m1/c"]  # the exposed output of copy 2 keeps "y"
    merged.ClearField("training_info")  # ONNX Runtime's inference session does not take it
    np.testing.assert_allclose(run(merged, {"x": x24})["y"], np.maximum(np.maximum(x24 * 2, 0) * 2, 0))


def test_empty_names_of_absent_optional_inputs_are_never_renamed():
    m = loop_model_reading_outer_initializer()
    merged = fastseq.compose([m, m])
    loops = [n for n in merged.graph.node if n.op_type == "Loop"]
    assert [n.input[1] for n in loops] == ["", ""]


def test_mixed_opset_imports_are_an_error_naming_models_and_versions(tmp_path):
    a, b = scale_model(2.0, opset=13), scale_model(3.0, opset=17)
    onnx.save(a, tmp_path / "resize.onnx")
    onnx.save(b, tmp_path / "head.onnx")
    with pytest.raises(fastseq.OpsetMismatchError, match=r"'ai.onnx': 13 in resize.onnx; 17 in head.onnx"):
        fastseq.compose([tmp_path / "resize.onnx", tmp_path / "head.onnx"])
    assert issubclass(fastseq.OpsetMismatchError, fastseq.CompositionError)


def test_fifty_model_chain_matches_sequential_runs(x24):
    models = [scale_model(1.0 + (i % 5) / 10, name=f"s{i}") for i in range(50)]
    merged = fastseq.compose(models)
    onnx.checker.check_model(merged)
    assert len(merged.graph.node) == 100
    assert len({t.name for t in merged.graph.initializer}) == 50
    assert [i.name for i in merged.graph.input] == ["x"] and [o.name for o in merged.graph.output] == ["y"]
    x = np.abs(x24)
    np.testing.assert_allclose(run(merged, {"x": x})["y"], run_chain(models, {"x": x})["y"], rtol=1e-5)


def _two_output_model():
    g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["neg"]), helper.make_node("Abs", ["x"], ["abs"])],
        "split",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [
            helper.make_tensor_value_info("neg", TensorProto.FLOAT, [2, 4]),
            helper.make_tensor_value_info("abs", TensorProto.FLOAT, [2, 4]),
        ],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _add_model(a="a", b="b", out="sum"):
    g = helper.make_graph(
        [helper.make_node("Add", [a, b], [out])],
        "add",
        [
            helper.make_tensor_value_info(a, TensorProto.FLOAT, [2, 4]),
            helper.make_tensor_value_info(b, TensorProto.FLOAT, [2, 4]),
        ],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, [2, 4])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_routing_fan_out_unconnected_inputs_and_kept_outputs(x24):
    split, add = _two_output_model(), _add_model()
    # One output feeds both inputs.
    fan = fastseq.compose([split, add], io_maps=[[("abs", "a"), ("abs", "b")]])
    assert [o.name for o in fan.graph.output] == ["sum"]
    np.testing.assert_allclose(run(fan, {"x": x24})["sum"], 2 * np.abs(x24))
    # 'b' is left unconnected: it becomes a graph input; 'neg' is dropped by default.
    open_in = fastseq.compose([split, add], io_maps=[[("abs", "a")]])
    assert [i.name for i in open_in.graph.input] == ["x", "b"]
    assert [o.name for o in open_in.graph.output] == ["sum"]
    # keep_outputs=True keeps the unconsumed 'neg'; a list keeps what it names.
    kept = fastseq.compose([split, add], io_maps=[[("abs", "a")]], keep_outputs=True)
    assert [o.name for o in kept.graph.output] == ["neg", "sum"]
    named = fastseq.compose([split, add], io_maps=[[("abs", "a")]], keep_outputs=["abs"])
    assert [o.name for o in named.graph.output] == ["abs", "sum"]
    got = run(named, {"x": x24, "b": x24})
    np.testing.assert_allclose(got["abs"], np.abs(x24))
    np.testing.assert_allclose(got["sum"], np.abs(x24) + x24)


def test_graph_inputs_and_outputs_keep_user_names_when_internal_names_clash(x24):
    # Model 0 has an internal 'sum'; model 1's output is 'sum': the output keeps it.
    first = scale_model(2.0, out="y")
    first.graph.node[0].output[0] = "sum"
    first.graph.node[1].input[0] = "sum"
    merged = fastseq.compose([first, _add_model()], io_maps=[[("y", "a")]])
    assert [i.name for i in merged.graph.input] == ["x", "b"]
    assert [o.name for o in merged.graph.output] == ["sum"]
    assert "m0/sum" in {n.output[0] for n in merged.graph.node}
    np.testing.assert_allclose(run(merged, {"x": x24, "b": x24})["sum"], np.maximum(2 * x24, 0) + x24)


def test_compose_accepts_paths_bytes_and_protos_and_writes_files(tmp_path, x24):
    a, b, c = scale_model(2.0), scale_model(3.0), scale_model(0.5)
    onnx.save(a, tmp_path / "a.onnx")
    out = fastseq.compose_to_file([str(tmp_path / "a.onnx"), b.SerializeToString(), c], tmp_path / "m.onnx")
    from_file = onnx.load(str(out))
    as_bytes = fastseq.compose_bytes([tmp_path / "a.onnx", b.SerializeToString(), c])
    # The streamed file and the in-memory encoding hold the same model; the file also says
    # which stage each node is (its stage map).
    assert [p.key for p in from_file.metadata_props] == ["fastseq.stages"]
    del from_file.metadata_props[:]
    assert onnx.ModelProto.FromString(as_bytes) == from_file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.onnx", "m.onnx"]  # no temporary left
    np.testing.assert_allclose(run(from_file, {"x": x24})["y"], np.maximum(x24 * 3, 0))


def _model_calling_through_subgraphs(body_op: str) -> onnx.ModelProto:
    """custom.Relu (body `body_op`) is called from an If branch of the main graph and from
    `Wrap`, a second local function whose body calls it; the main graph calls Wrap too."""
    relu = _custom_relu_function(body_op)
    wrap = helper.make_function(
        "custom",
        "Wrap",
        ["X"],
        ["Y"],
        [helper.make_node("Relu", ["X"], ["Y"], domain="custom")],
        [helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
    )
    then_g = helper.make_graph(
        [helper.make_node("Relu", ["a"], ["t"], domain="custom")],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 4])],
    )
    else_g = helper.make_graph(
        [helper.make_node("Identity", ["a"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 4])],
    )
    g = helper.make_graph(
        [
            helper.make_node("Wrap", ["x"], ["a"], domain="custom"),
            helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g),
        ],
        "f",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(np.array(True), "cond")],
    )
    return helper.make_model(
        g,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
        functions=[relu, wrap],
        ir_version=8,
    )


def test_function_calls_in_subgraphs_and_in_other_functions_follow_the_rename(x24):
    a, b = _model_calling_through_subgraphs("Neg"), _model_calling_through_subgraphs("Abs")
    merged = fastseq.compose([a, b])
    onnx.checker.check_model(merged, full_check=True)
    # Wrap's bodies are the same text but call different functions: both are kept.
    assert sorted(f.name for f in merged.functions) == ["Relu", "Relu__m1", "Wrap", "Wrap__m1"]
    wraps = {f.name: f.node[0].op_type for f in merged.functions if f.name.startswith("Wrap")}
    assert wraps == {"Wrap": "Relu", "Wrap__m1": "Relu__m1"}
    ifs = [n for n in merged.graph.node if n.op_type == "If"]
    then_calls = [next(a.g for a in n.attribute if a.name == "then_branch").node[0].op_type for n in ifs]
    assert then_calls == ["Relu", "Relu__m1"]
    np.testing.assert_allclose(run(merged, {"x": x24})["y"], run_chain([a, b], {"x": x24})["y"])
    # Identical models still share every function.
    same = fastseq.compose([a, a])
    assert sorted(f.name for f in same.functions) == ["Relu", "Wrap"]


def test_sharding_specs_and_metadata_of_nodes_follow_renames():
    """A node with device configurations is not 'plain' (its sharding specs name tensors):
    it is decoded, renamed and encoded again; node metadata is carried as it is."""

    def model():
        m = scale_model(2.0)
        mul = m.graph.node[0]
        dc = mul.device_configurations.add(configuration_id="mesh")
        dc.sharding_spec.add(tensor_name="t")
        mul.metadata_props.add(key="origin", value="layer1")
        m.graph.node[1].metadata_props.add(key="origin", value="layer2")
        return m

    merged = fastseq.compose([model(), model()])
    muls = [n for n in merged.graph.node if n.op_type == "Mul"]
    assert [n.output[0] for n in muls] == ["t", "m1/t"]
    assert [n.device_configurations[0].sharding_spec[0].tensor_name for n in muls] == ["t", "m1/t"]
    assert [p.value for n in merged.graph.node for p in n.metadata_props] == ["layer1", "layer2"] * 2
