"""Every bad input: its error type and a message in the user's own names."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import fastseq
from conftest import field, scale_model, varint


def deeply_nested_model(depth: int) -> bytes:
    """A model whose If-like attribute graphs nest ``depth`` deep, written byte by byte
    (Python's protobuf refuses to build it)."""
    graph = b""
    for _ in range(depth):
        attribute = field(1, b"g") + varint(20 << 3) + varint(5) + field(6, graph)
        node = field(4, b"If") + field(5, attribute)
        graph = field(1, node)
    return varint(1 << 3) + varint(8) + field(7, graph)  # ir_version 8, graph


def test_unknown_io_map_names_suggest_the_near_miss():
    a, b = scale_model(2.0, out="logits"), scale_model(3.0, inp="features")
    with pytest.raises(fastseq.CompositionError) as e:
        fastseq.compose([a, b], io_maps=[[("logit", "features")]])
    assert "'logit' is not an output of scale (#0) (did you mean 'logits'?)" in str(e.value)
    with pytest.raises(
        fastseq.CompositionError, match=r"'feature' is not an input of scale \(#1\) \(did you mean 'features'\?\)"
    ):
        fastseq.compose([a, b], io_maps=[[("logits", "feature")]])


def test_errors_use_the_users_names_not_internal_prefixes():
    models = [scale_model(1.0), scale_model(2.0), scale_model(3.0)]
    with pytest.raises(fastseq.CompositionError) as e:
        fastseq.compose(models, io_maps=[[("y", "x")], [("yy", "x")]])
    msg = str(e.value)
    assert msg.startswith("joint 1 (scale (#1) -> scale (#2)): 'yy' is not an output")
    assert "m1/" not in msg and "K01" not in msg


def test_element_type_mismatch_is_an_error():
    a = scale_model(2.0, dtype=TensorProto.FLOAT)
    b = scale_model(2.0, dtype=TensorProto.DOUBLE)
    with pytest.raises(
        fastseq.CompositionError, match="element type mismatch: output 'y' is float but input 'x' expects double"
    ):
        fastseq.compose([a, b])


def test_static_shape_mismatch_is_an_error_and_symbolic_dims_are_not():
    a, b = scale_model(2.0, shape=(2, 4)), scale_model(2.0, shape=(3, 4))
    with pytest.raises(
        fastseq.CompositionError, match=r"shape mismatch: output 'y' has shape \[2, 4\] but input 'x' expects \[3, 4\]"
    ):
        fastseq.compose([a, b])
    rank = scale_model(2.0, shape=(1, 2, 4))
    with pytest.raises(fastseq.CompositionError, match="shape mismatch"):
        fastseq.compose([a, rank])
    dynamic = scale_model(2.0, shape=("batch", 4))
    fastseq.compose([a, dynamic])  # 'batch' matches anything


def test_duplicate_connections_are_errors():
    a, b = scale_model(2.0), scale_model(3.0)
    with pytest.raises(fastseq.CompositionError, match="the connection 'y' -> 'x' is listed twice"):
        fastseq.compose([a, b], io_maps=[[("y", "x"), ("y", "x")]])
    two = helper.make_model(
        helper.make_graph(
            [helper.make_node("Neg", ["x"], ["y"]), helper.make_node("Abs", ["x"], ["z"])],
            "two",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
            [
                helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4]),
                helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 4]),
            ],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=8,
    )
    with pytest.raises(fastseq.CompositionError, match="input 'x' of scale \\(#1\\) is fed twice, by 'y' and by 'z'"):
        fastseq.compose([two, b], io_maps=[[("y", "x"), ("z", "x")]])


def test_positional_joints_with_different_counts_list_both_sides():
    two_in = helper.make_model(
        helper.make_graph(
            [helper.make_node("Add", ["a", "b"], ["s"])],
            "add",
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 4]) for n in "ab"],
            [helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, 4])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=8,
    )
    with pytest.raises(fastseq.CompositionError) as e:
        fastseq.compose([scale_model(1.0), two_in])
    assert "has 1 output ('y') and add (#1) has 2 inputs ('a', 'b'); pass io_maps" in str(e.value)


def test_io_maps_of_the_wrong_length():
    with pytest.raises(fastseq.CompositionError, match="io_maps has 2 entries but 2 models have 1 joint"):
        fastseq.compose([scale_model(1.0), scale_model(2.0)], io_maps=[[("y", "x")], []])


def test_keep_outputs_names_must_exist():
    with pytest.raises(fastseq.CompositionError, match=r"'yy' is not an output of any model \(did you mean 'y'\?\)"):
        fastseq.compose([scale_model(1.0), scale_model(2.0)], keep_outputs=["yy"])
    with pytest.raises(fastseq.CompositionError, match="'y' is an output of several models"):
        fastseq.compose([scale_model(1.0), scale_model(2.0)], keep_outputs=["y"])


@pytest.mark.parametrize(
    "data,match",
    [
        (b"", "empty input"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "not a valid ONNX model"),
        (b"hello world, this is not a model", "not a valid ONNX model"),
        (b"\x08\x07", "not an ONNX model \\(no graph"),
        (onnx.numpy_helper.from_array(np.ones(3, np.float32)).SerializeToString(), "not"),
    ],
    ids=["empty", "png", "text", "no-graph", "tensor"],
)
def test_bad_bytes_are_load_errors_naming_the_source(data, match):
    with pytest.raises(fastseq.LoadError, match=match) as e:
        fastseq.compose([scale_model(1.0), data])
    assert str(e.value).startswith("model #1 (bytes)")


def test_truncated_model():
    m = scale_model(1.0, shape=(2, 4096))
    data = m.SerializeToString()
    with pytest.raises(fastseq.LoadError, match="not a valid ONNX model .*truncated"):
        fastseq.compose([data[: len(data) // 2]])


@pytest.mark.parametrize("depth", [40, 5000])
def test_recursion_too_deep_is_an_error_not_a_crash(depth):
    with pytest.raises(fastseq.LoadError, match="subgraphs nested more than 32 deep"):
        fastseq.compose([deeply_nested_model(depth)])


def test_nesting_within_the_limit_is_kept():
    merged = fastseq.compose([deeply_nested_model(30)])
    graph, depth = merged.graph, 0
    while graph.node:
        graph, depth = graph.node[0].attribute[0].g, depth + 1
    assert depth == 30


def test_newer_ir_version_is_refused():
    m = scale_model(1.0)
    m.ir_version = fastseq.MAX_IR_VERSION + 1
    with pytest.raises(fastseq.LoadError, match="IR version 15 is newer than this fastseq understands"):
        fastseq.compose([m])


def test_files_that_are_missing_empty_or_directories(tmp_path):
    with pytest.raises(fastseq.LoadError, match="no such file"):
        fastseq.compose([tmp_path / "missing.onnx"])
    with pytest.raises(fastseq.LoadError, match=r"a Hub id is written 'hf://operators/resize'"):
        fastseq.compose(["operators/resize"])
    (tmp_path / "empty.onnx").write_bytes(b"")
    with pytest.raises(fastseq.LoadError, match="empty.onnx: empty file"):
        fastseq.compose([tmp_path / "empty.onnx"])
    with pytest.raises(fastseq.LoadError, match="is a directory"):
        fastseq.compose([tmp_path])


def test_argument_errors():
    with pytest.raises(fastseq.CompositionError, match="no models"):
        fastseq.compose([])
    with pytest.raises(TypeError, match="sequence of models"):
        fastseq.compose(scale_model(1.0))
    with pytest.raises(TypeError, match="got int"):
        fastseq.compose([scale_model(1.0), 42])


def test_failed_write_leaves_no_file(tmp_path):
    target = tmp_path / "missing_dir" / "out.onnx"
    with pytest.raises(fastseq.ExportError, match="cannot write"):
        fastseq.compose_to_file([scale_model(1.0)], target)
    assert not target.parent.exists()
    existing = tmp_path / "keep.onnx"
    existing.write_bytes(b"old")
    with pytest.raises(fastseq.CompositionError):
        fastseq.compose_to_file([scale_model(1.0), scale_model(1.0, dtype=TensorProto.DOUBLE)], existing)
    assert existing.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.onnx"]


def test_node_names_that_are_not_utf8_are_kept_byte_for_byte():
    """Nodes are read as bytes and strings of any bytes are kept (codec::fidelity), as
    protobuf and onnx keep them: a name that is not UTF-8 is renamed like any other, its
    bytes intact, never refused and never replaced."""
    node = field(1, b"x") + field(2, b"\xff\xfe") + field(4, b"Relu")
    data = varint(1 << 3) + varint(8) + field(7, field(1, node))
    assert b"\xff\xfe" in fastseq.compose_bytes([data])
    twice = onnx.ModelProto.FromString(fastseq.compose_bytes([data, data]))
    outputs = [n.output[0] for n in twice.graph.node]
    assert len(set(outputs)) == 2 and fastseq.compose_bytes([data, data]).count(b"\xff\xfe") == 2


def test_unknown_node_fields_do_not_break_renaming():
    """A node field this schema does not know is kept (as onnx keeps it), renamed node or not,
    and the names still follow the merge."""
    m = scale_model(2.0)
    twice = fastseq.compose([m, m])
    nodes = b"".join(field(1, n.SerializeToString() + varint(99 << 3) + varint(7)) for n in m.graph.node)
    patched = onnx.ModelProto()
    patched.CopyFrom(m)
    patched.graph.ClearField("node")
    data = patched.SerializeToString() + field(7, nodes)  # a second graph field merges into the first
    merged = fastseq.compose([data, m])
    assert [(n.input, n.output, n.name) for n in merged.graph.node] == [
        (n.input, n.output, n.name) for n in twice.graph.node
    ]
    assert fastseq.compose_bytes([data, data]).count(b"\x98\x06\x07") == 4  # field 99 = 7, in every node
