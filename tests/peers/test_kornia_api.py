"""kornia 0.9's whole ONNX API on fastseq: ONNXSequential.combine / add_metadata / export with
onnx.save's keywords / as_* with provider options, ONNXModule, ONNXLoader (against a Hub
stand-in on 127.0.0.1), and the small things a newcomer hit (io_maps shapes, provider typos,
summary conventions, the CLI's merge and run)."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import fastseq
from conftest import FIXTURES, run, run_chain, scale_model
from fastseq import cli
from fastseq.facades.onnx_loader import _umask
from servers import serve_files, serve_hub

X = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)


def add_model(inp="a", other="b", out="s"):
    """s = a + b: a second model with two inputs, to re-wire."""
    g = helper.make_graph(
        [helper.make_node("Add", [inp, other], [out])],
        "add",
        [
            helper.make_tensor_value_info(inp, TensorProto.FLOAT, [2, 4]),
            helper.make_tensor_value_info(other, TensorProto.FLOAT, [2, 4]),
        ],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, [2, 4])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def two_output_model():
    """p = relu(x * 2), q = x * 2 - 1: two outputs for combine() to choose between."""
    two = numpy_helper.from_array(np.full((4,), 2.0, np.float32), "two")
    one = numpy_helper.from_array(np.full((4,), 1.0, np.float32), "one")
    g = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "two"], ["m"]),
            helper.make_node("Relu", ["m"], ["p"]),
            helper.make_node("Sub", ["m", "one"], ["q"]),
        ],
        "split",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [
            helper.make_tensor_value_info("p", TensorProto.FLOAT, [2, 4]),
            helper.make_tensor_value_info("q", TensorProto.FLOAT, [2, 4]),
        ],
        [two, one],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def constant_model(n=512):
    """y = x + c where c is a Constant node's attribute tensor (not an initializer)."""
    c = numpy_helper.from_array(np.arange(n, dtype=np.float32), "cval")
    g = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=c), helper.make_node("Add", ["x", "c"], ["y"])],
        "const",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, n])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def outputs_of(model, feeds):
    return list(run(model, feeds).values())


# --- combine ---------------------------------------------------------------------------


def test_combine_rewires_without_reading_the_sources_again(tmp_path):
    onnx.save(two_output_model(), tmp_path / "split.onnx")
    onnx.save(add_model(), tmp_path / "add.onnx")
    pipe = fastseq.ONNXSequential(tmp_path / "split.onnx", tmp_path / "add.onnx", io_maps=[[("p", "a"), ("q", "b")]])
    before = pipe.model_bytes
    # The files go away: combine() uses the models the pipeline holds.
    (tmp_path / "split.onnx").unlink()
    (tmp_path / "add.onnx").unlink()
    rewired = pipe.combine([[("q", "a"), ("q", "b")]])
    assert isinstance(rewired, onnx.ModelProto)
    onnx.checker.check_model(rewired)
    models = [two_output_model(), add_model()]
    want = run_chain(models, {"x": X}, io_maps=[[("q", "a"), ("q", "b")]])["s"]
    np.testing.assert_allclose(outputs_of(rewired, {"x": X})[0], want)
    np.testing.assert_allclose(want, 2 * (2 * X - 1))
    # The pipeline itself is unchanged, and combine() with its own io_maps gives its model.
    assert pipe.model_bytes == before
    same = pipe.combine([[("p", "a"), ("q", "b")]])
    assert same.SerializeToString() == before
    np.testing.assert_allclose(pipe(X)[0], np.maximum(2 * X, 0) + 2 * X - 1)


def test_combine_flat_and_default_io_maps_and_errors():
    pipe = fastseq.ONNXSequential(scale_model(2.0, out="h"), scale_model(3.0, inp="h"))
    by_position = pipe.combine()
    flat = pipe.combine([("h", "h")])
    assert by_position.SerializeToString() == flat.SerializeToString() == pipe.model_bytes
    with pytest.raises(fastseq.CompositionError, match=r"'nope' is not an output"):
        pipe.combine([[("nope", "h")]])
    clone = pickle.loads(pickle.dumps(pipe))
    with pytest.raises(fastseq.CompositionError, match="unpickled"):
        clone.combine()
    assert [m.graph.name for m in pipe.operators] == ["scale", "scale"]


def test_combine_matches_kornia_on_three_models():
    """kornia's combine returns the merged ModelProto; fastseq's computes the same outputs
    with the user's names (kornia prefixes them K00-, K01-...)."""
    models = [scale_model(2.0, out="h"), scale_model(3.0, inp="h", out="k"), scale_model(0.5, inp="k")]
    pipe = fastseq.ONNXSequential(*models)
    combined = pipe.combine([[("h", "h")], [("k", "k")]])
    assert [i.name for i in combined.graph.input] == ["x"] and [o.name for o in combined.graph.output] == ["y"]
    want = run_chain(models, {"x": X}, io_maps=[[("h", "h")], [("k", "k")]])["y"]
    np.testing.assert_allclose(outputs_of(combined, {"x": X})[0], want)


# --- io_maps shapes ----------------------------------------------------------------------


def test_io_maps_flat_form_and_kornia_dict_are_accepted_for_what_they_mean():
    a, b = scale_model(2.0, out="h"), scale_model(3.0, inp="in")
    want = np.maximum(np.maximum(2 * X, 0) * 3, 0)
    for io_maps in ([("h", "in")], [["h", "in"]], {0: [("h", "in")]}, [[("h", "in")]], [zip(["h"], ["in"])]):
        np.testing.assert_allclose(fastseq.ONNXSequential(a, b, io_maps=io_maps)(X)[0], want)


@pytest.mark.parametrize(
    "io_maps,match",
    [
        ({"h": "in"}, r"io_maps is a dict; pass io_maps=\[\[\('h', 'in'\)\]\]"),
        ([("h", "in"), ("k", "x")], r"flat list of pairs, which only describes one joint; 3 models have 2 joints"),
        ("h:in", r"io_maps must be a list, got str"),
        ([[("h", "in")], ("k", "x")], r"io_maps\[1\] must be a list of \(output, input\) name pairs.*for one pair"),
        ({0: [("h", "in")]}, r"no entry for joint 1"),
    ],
)
def test_io_maps_of_another_shape_is_a_typed_error_showing_the_nested_form(io_maps, match):
    models = [scale_model(2.0, out="h"), scale_model(3.0, inp="in", out="k"), scale_model(1.0)]
    if isinstance(io_maps, dict) and "h" in io_maps:
        models = models[:2]
    with pytest.raises(fastseq.CompositionError, match=match) as e:
        fastseq.ONNXSequential(*models, io_maps=io_maps)
    assert "[[(" in str(e.value)


# --- add_metadata ------------------------------------------------------------------------


def test_add_metadata_one_entry_per_key_kept_through_export_model_and_pickling(tmp_path):
    model = scale_model(2.0)
    helper.set_model_props(model, {"author": "me", "version": "7"})
    pipe = fastseq.ONNXSequential(model, scale_model(3.0))
    returned = pipe.add_metadata([("date", "20240909"), ("author", "you"), ("n", 3)])
    assert isinstance(returned, onnx.ModelProto)
    # kornia's rules: source and version always written; a key keeps its first place and
    # takes the last value; values become strings.
    want = {"author": "you", "version": fastseq.__version__, "source": "fastseq", "date": "20240909", "n": "3"}
    assert {p.key: p.value for p in returned.metadata_props} == want
    assert [p.key for p in returned.metadata_props] == ["author", "version", "source", "date", "n"]
    onnx.checker.check_model(returned)  # refuses repeated keys
    assert pipe.metadata == want
    out = pipe.export(tmp_path / "m.onnx")
    # A file also keeps which stage each node is (fastseq.stages, after the user's entries).
    written = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert list(written) == [*want, "fastseq.stages"]
    assert json.loads(written.pop("fastseq.stages"))["stages"] == [["scale (#0)", 0, 2, 0], ["scale (#1)", 2, 4, 0]]
    assert written == want
    s = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert {k: v for k, v in s.get_modelmeta().custom_metadata_map.items() if k != "fastseq.stages"} == want
    ext = pipe.export(tmp_path / "e.onnx", save_as_external_data=True, size_threshold=0)
    written = {p.key: p.value for p in onnx.load(str(ext)).metadata_props}
    assert written.pop("fastseq.stages") and written == want
    assert pickle.loads(pickle.dumps(pipe)).metadata == want
    np.testing.assert_allclose(pipe(X)[0], np.maximum(np.maximum(2 * X, 0) * 3, 0))
    with pytest.raises(TypeError, match="pairs"):
        pipe.add_metadata(["key"])
    with pytest.raises(TypeError, match="key must be a str"):
        pipe.add_metadata([(1, "x")])


def test_module_add_metadata_and_none():
    m = fastseq.ONNXModule(scale_model(2.0))
    m.add_metadata()
    assert m.metadata == {"source": "fastseq", "version": fastseq.__version__}


# --- export with onnx.save's keywords ------------------------------------------------------


def tensors(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


@pytest.fixture
def big_pipe():
    return fastseq.ONNXSequential(scale_model(2.0, shape=(2, 512)), scale_model(3.0, shape=(2, 512)))


def check_exported(path: Path, pipe) -> None:
    onnx.checker.check_model(str(path))
    x = np.ones((2, 512), np.float32)
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(s.run(None, {"x": x})[0], pipe(x)[0])


def test_export_save_as_external_data_and_size_threshold(big_pipe, tmp_path):
    before = big_pipe.model_bytes
    path = big_pipe.export(tmp_path / "m.onnx", save_as_external_data=True)
    header = onnx.load(str(path), load_external_data=False)
    assert all(t.data_location == TensorProto.EXTERNAL for t in header.graph.initializer)
    check_exported(path, big_pipe)
    # A threshold above every tensor keeps them inline, as onnx.save does.
    path = big_pipe.export(tmp_path / "t.onnx", save_as_external_data=True, size_threshold=1 << 20)
    header = onnx.load(str(path), load_external_data=False)
    assert all(t.data_location != TensorProto.EXTERNAL for t in header.graph.initializer)
    check_exported(path, big_pipe)
    assert big_pipe.model_bytes == before


def test_export_location_and_one_file_per_tensor_match_onnx_save(big_pipe, tmp_path):
    before = big_pipe.model_bytes
    reference_dir = tmp_path / "ref"
    reference_dir.mkdir()
    onnx.save(big_pipe.model, str(reference_dir / "m.onnx"), save_as_external_data=True, location="weights.bin")
    path = big_pipe.export(tmp_path / "m.onnx", save_as_external_data=True, location="weights.bin")
    assert (tmp_path / "weights.bin").read_bytes() == (reference_dir / "weights.bin").read_bytes()
    header = onnx.load(str(path), load_external_data=False)
    locations = {d.value for t in header.graph.initializer for d in t.external_data if d.key == "location"}
    assert locations == {"weights.bin"}
    check_exported(path, big_pipe)

    per = tmp_path / "per"
    per.mkdir()
    path = big_pipe.export(per / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=False)
    # onnx.save names each file after its tensor ('c'), or a uuid when the name is not a
    # valid file name ('m1/c').
    written = sorted(p.name for p in per.iterdir())
    assert len(written) == 3 and "c" in written and "m.onnx" in written
    got, want = tensors(onnx.load(str(path))), tensors(big_pipe.model)
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)
    check_exported(path, big_pipe)
    assert big_pipe.model_bytes == before
    assert not [p for p in tmp_path.rglob("*") if ".export" in p.name or p.name.endswith(".tmp")]


def test_export_convert_attribute(tmp_path):
    pipe = fastseq.ONNXModule(constant_model())

    def constant_location(path):
        header = onnx.load(str(path), load_external_data=False)
        (node,) = [n for n in header.graph.node if n.op_type == "Constant"]
        return node.attribute[0].t.data_location

    inline = pipe.export(tmp_path / "inline.onnx", save_as_external_data=True, convert_attribute=False)
    assert constant_location(inline) != TensorProto.EXTERNAL
    moved = pipe.export(tmp_path / "moved.onnx", save_as_external_data=True, convert_attribute=True)
    assert constant_location(moved) == TensorProto.EXTERNAL
    x = np.zeros((2, 512), np.float32)
    for path in (inline, moved):
        got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_allclose(got, np.broadcast_to(np.arange(512, dtype=np.float32), (2, 512)))


def test_export_text_format_bad_keywords_and_missing_folder(big_pipe, tmp_path):
    path = big_pipe.export(tmp_path / "m.txtpb", format="textproto")
    written = onnx.load(str(path), format="textproto")
    assert [p.key for p in written.metadata_props] == ["fastseq.stages"]  # which stage each node is
    del written.metadata_props[:]
    assert written.SerializeToString() == big_pipe.model_bytes
    with pytest.raises(TypeError, match="unexpected keyword argument 'external'"):
        big_pipe.export(tmp_path / "x.onnx", external=True)
    with pytest.raises(TypeError, match="disagree"):
        big_pipe.export(tmp_path / "x.onnx", external_data=False, save_as_external_data=True)
    for kwargs in ({}, {"location": "w.bin", "save_as_external_data": True}):
        with pytest.raises(fastseq.ExportError, match=r"the folder .*missing does not exist"):
            big_pipe.export(tmp_path / "missing" / "m.onnx", **kwargs)
    # The loader's rule for a location is the export's: one rule, the core's.
    from fastseq import _core

    for location in ("../escape.bin", ".", "/abs/w.bin", "a/../../w.bin", "\\w.bin", "w\0.bin"):
        assert not _core.LAYOUT.allows_location(location)
        with pytest.raises(fastseq.ExportError, match="relative path"):
            big_pipe.export(tmp_path / "y.onnx", save_as_external_data=True, location=location)
    assert not (tmp_path / "missing").exists() and not (tmp_path / "x.onnx").exists()


# --- providers ---------------------------------------------------------------------------


def test_as_methods_pass_provider_options(monkeypatch):
    seen = []
    real = ort.InferenceSession

    class Recording(real):
        def __init__(self, *args, providers=None, **kwargs):
            seen.append(providers)
            super().__init__(*args, providers=providers, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", Recording)
    pipe = fastseq.ONNXSequential(scale_model(2.0))
    assert pipe.as_cpu(arena_extend_strategy="kSameAsRequested") is pipe
    assert seen[-1] == [("CPUExecutionProvider", {"arena_extend_strategy": "kSameAsRequested"})]
    with pytest.warns(RuntimeWarning) if "CUDAExecutionProvider" not in ort.get_available_providers() else _nothing():
        pipe.as_cuda(0, gpu_mem_limit=1 << 30)
    assert pipe.engine.requested_providers == [
        ("CUDAExecutionProvider", {"device_id": 0, "gpu_mem_limit": 1 << 30}),
        "CPUExecutionProvider",
    ]
    with (
        pytest.warns(RuntimeWarning) if "TensorrtExecutionProvider" not in ort.get_available_providers() else _nothing()
    ):
        pipe.as_tensorrt(1, trt_fp16_enable=True)
    assert pipe.engine.requested_providers[0] == (
        "TensorrtExecutionProvider",
        {"device_id": 1, "trt_fp16_enable": True},
    )
    with pytest.warns(RuntimeWarning):
        pipe.as_openvino("CPU", precision="FP32")
    assert pipe.engine.requested_providers[0] == (
        "OpenVINOExecutionProvider",
        {"device_type": "CPU", "precision": "FP32"},
    )
    np.testing.assert_allclose(pipe(X)[0], np.maximum(2 * X, 0))


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_provider_typo_is_an_error_with_did_you_mean_and_a_missing_one_a_warning():
    with pytest.raises(fastseq.ProviderError, match=r"did you mean 'CUDAExecutionProvider'"):
        fastseq.ONNXModule(scale_model(2.0), providers=["CUDAExecutionProvder"])
    with pytest.raises(fastseq.ProviderError, match=r"'CPUExecutionProviderr' \(did you mean 'CPUExecutionProvider'"):
        fastseq.ONNXSequential(scale_model(2.0), providers=[("CPUExecutionProviderr", {})])
    assert issubclass(fastseq.ProviderError, fastseq.FastseqError) and issubclass(fastseq.ProviderError, ValueError)


# --- summary and inspect conventions ---------------------------------------------------------


def test_summary_dims_are_ints_like_tensorinfo_and_dtypes_numpy_names():
    pipe = fastseq.ONNXSequential("builtin:shipped/to_float", "builtin:shipped/resize")
    info = pipe.summary()
    name, dtype, dims = info["inputs"][0]
    assert (name, dtype) == (pipe.inputs[0].name, str(pipe.inputs[0].dtype)) == ("input", "uint8")
    assert tuple(dims) == pipe.inputs[0].shape == ("N", "H", "W", 3)
    name, dtype, dims = info["outputs"][0]
    assert dtype == "float32" and tuple(dims) == pipe.outputs[0].shape == ("N", 3, 32, 32)
    assert all(isinstance(d, int) for d in dims[1:])


# --- ONNXModule --------------------------------------------------------------------------


def test_onnx_module_runs_one_model_like_onnxruntime(tmp_path):
    model = onnx.load(str(FIXTURES / "torch_cnn_backbone.onnx"))
    m = fastseq.ONNXModule(model, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    want = outputs_of(model, {m.inputs[0].name: x})
    got = m(x)
    assert isinstance(got, list) and len(got) == len(want)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    assert m.op.SerializeToString() == m.model_bytes and len(m) == 1
    model.graph.name = "edited"  # the module holds its own copy
    assert m.op.graph.name != "edited"
    out = m.export(tmp_path / "m.onnx")
    np.testing.assert_allclose(outputs_of(out, {m.inputs[0].name: x})[0], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pickle.loads(pickle.dumps(m))(x)[0], got[0])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    other = m.create_session(session_options=options)
    m.set_session(other)
    assert m.get_session() is other


def test_onnx_module_versions_and_load(tmp_path):
    m = fastseq.ONNXModule(scale_model(2.0, opset=13, ir=7), target_opset_version=17, target_ir_version=9)
    info = m.summary()
    assert info["ir_version"] == 9 and ("", 17) in [tuple(o) for o in info["opsets"]]
    np.testing.assert_allclose(m(X)[0], np.maximum(2 * X, 0))
    onnx.save(scale_model(3.0), tmp_path / "t.onnx")
    loaded = fastseq.load(str(tmp_path / "t.onnx"))
    assert isinstance(loaded, fastseq.ONNXModule)
    np.testing.assert_allclose(loaded(X)[0], np.maximum(3 * X, 0))


# --- ONNXLoader against a Hub stand-in ---------------------------------------------------


@pytest.fixture
def hub(tmp_path, monkeypatch):
    root = tmp_path / "hub"
    ops = root / "kornia" / "ONNX_models" / "operators"
    ops.mkdir(parents=True)
    onnx.save(scale_model(2.0), ops / "double.onnx")
    onnx.save(scale_model(3.0), ops / "triple.onnx")
    (root / "kornia" / "ONNX_models" / "models").mkdir()
    onnx.save(scale_model(5.0), root / "kornia" / "ONNX_models" / "models" / "five.onnx")
    server = serve_hub(root)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    yield server, root
    server.close()


def test_loader_load_model_from_the_hub_cache_and_download_false(hub, tmp_path):
    server, root = hub
    cache = tmp_path / "cache"
    with pytest.raises(fastseq.DownloadError, match="double.onnx not found; pass download=True"):
        fastseq.ONNXLoader.load_model("hf://operators/double", download=False, cache_dir=cache)
    model = fastseq.ONNXLoader.load_model("hf://operators/double", cache_dir=cache)
    assert model.SerializeToString() == (root / "kornia/ONNX_models/operators/double.onnx").read_bytes()
    # kornia's file, at kornia's path: under an explicit cache_dir, the path after the folder
    assert [p.relative_to(cache).as_posix() for p in cache.rglob("*")] == ["double.onnx"]
    gets = server.count("GET", "double.onnx")
    again = fastseq.ONNXLoader.load_model("hf://operators/double", download=False, cache_dir=cache)
    assert again.SerializeToString() == model.SerializeToString() and server.count("GET", "double.onnx") == gets
    fastseq.ONNXLoader.load_model("hf://operators/double", cache_dir=cache, force_download=True)
    assert server.count("GET", "double.onnx") == gets + 1
    # The loaded model composes as kornia's hf:// ids do.
    pipe = fastseq.ONNXSequential(model, "hf://operators/triple", cache_dir=cache)
    np.testing.assert_allclose(pipe(X)[0], np.maximum(np.maximum(2 * X, 0) * 3, 0))


def test_loader_lists_operators_and_models(hub, capsys):
    assert fastseq.ONNXLoader.list_files("operators") == ["operators/double.onnx", "operators/triple.onnx"]
    assert fastseq.ONNXLoader.list_operators() is None  # kornia prints the list
    assert capsys.readouterr().out.strip() == "['operators/double.onnx', 'operators/triple.onnx']"
    fastseq.ONNXLoader.list_models()
    assert capsys.readouterr().out.strip() == "['models/five.onnx']"
    with pytest.raises(fastseq.DownloadError, match="cannot list kornia/ONNX_models/nothing"):
        fastseq.ONNXLoader.list_files("nothing")


def test_loader_urls_with_data_configs_and_cache_layout(tmp_path):
    www = tmp_path / "www"
    www.mkdir()
    model = scale_model(2.0, shape=(2, 512))
    onnx.save(model, str(www / "big.onnx"), save_as_external_data=True, location="big.onnx_data", size_threshold=0)
    (www / "pre.json").write_text(json.dumps({"size": [224, 224], "mean": [0.5]}))
    server = serve_files(www)
    try:
        cache = tmp_path / "cache"
        with pytest.raises(fastseq.DownloadError, match="pass download=True"):
            fastseq.ONNXLoader.load_model(f"{server.url}/big.onnx", download=False, cache_dir=cache)
        loaded = fastseq.ONNXLoader.load_model(f"{server.url}/big.onnx", with_data=True, cache_dir=cache)
        # (onnx.save above moved the data of `model` out: compare with a fresh copy)
        assert tensors(loaded)["c"].tolist() == tensors(scale_model(2.0, shape=(2, 512)))["c"].tolist()
        host = f"127.0.0.1%3A{server.url.rsplit(':', 1)[1]}"
        assert (cache / "http" / host / "big.onnx").is_file() and (cache / "http" / host / "big.onnx_data").is_file()
        config = fastseq.ONNXLoader.load_config(f"{server.url}/pre.json", cache_dir=cache)
        assert config == {"size": [224, 224], "mean": [0.5]}
        assert (cache / "http" / host / "pre.json").is_file()
        assert fastseq.ONNXLoader.load_config(www / "pre.json") == config
        path = fastseq.ONNXLoader.download_to_cache(
            f"{server.url}/pre.json", "configs/pre", cache_dir=cache, suffix=".json"
        )
        assert path == str(cache / "configs" / "pre.json") and json.loads(Path(path).read_text()) == config
        target = tmp_path / "deep" / "er" / "file.json"
        fastseq.ONNXLoader.download(f"{server.url}/pre.json", str(target))
        assert json.loads(target.read_text()) == config
        umask = os.umask(0)
        os.umask(umask)
        assert _umask() == umask and target.stat().st_mode & 0o777 == 0o666 & ~umask  # not the scratch's 0600
        with pytest.raises(fastseq.DownloadError):
            fastseq.ONNXLoader.download(f"{server.url}/missing.json", str(tmp_path / "missing.json"))
        assert not (tmp_path / "missing.json").exists()
        assert not [p for p in tmp_path.rglob("*") if p.name.endswith((".download", ".part"))]
    finally:
        server.close()


def test_loader_argument_errors(tmp_path):
    with pytest.raises(TypeError, match="unexpected keyword argument 'cachedir'"):
        fastseq.ONNXLoader.load_model("x.onnx", cachedir=tmp_path)
    with pytest.raises(TypeError, match="onnx.load_model_from_string"):
        fastseq.ONNXLoader.load_model(b"\x08\x07")
    with pytest.raises(fastseq.LoadError, match="not found"):
        fastseq.ONNXLoader.load_model(tmp_path / "missing.onnx")
    with pytest.raises(fastseq.LoadError, match="relative path"):
        fastseq.ONNXLoader.download_to_cache("http://127.0.0.1:9/x", "../x", cache_dir=tmp_path)
    with pytest.raises(fastseq.LoadError, match="neither an http"):
        fastseq.ONNXLoader.load_config(str(tmp_path / "nope.json"))
    onnx.save(scale_model(2.0), tmp_path / "local.onnx")
    assert fastseq.ONNXLoader.load_model(str(tmp_path / "local.onnx")).graph.name == "scale"


# --- the command line --------------------------------------------------------------------


def test_merge_creates_missing_folders_and_reports_the_written_size(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    onnx.save(scale_model(2.0, shape=(2, 4096)), tmp_path / "a.onnx")
    onnx.save(scale_model(3.0, shape=(2, 4096)), tmp_path / "b.onnx")
    assert cli.main(["merge", "a.onnx", "b.onnx", "-o", "new/folder/out.onnx"]) == 0
    out = capsys.readouterr().out
    size = (tmp_path / "new" / "folder" / "out.onnx").stat().st_size
    assert f"({fastseq.errors.human_size(size)})" in out, out
    # The core's own writer names the missing folder, never a temporary file.
    pipe = fastseq.ONNXSequential(scale_model(2.0))
    for external in (False, True):
        with pytest.raises(fastseq.ExportError, match=r"the folder .*nowhere does not exist") as e:
            pipe.export(tmp_path / "nowhere" / "m.onnx", external_data=external)
        assert ".tmp" not in str(e.value) and ".data" not in str(e.value)


def test_written_size_is_exact_inline_and_with_external_data(tmp_path):
    from fastseq import _core

    pipe = fastseq.ONNXSequential(scale_model(2.0, shape=(2, 4096)), constant_model(4096))
    inline = pipe.engine.composed.save(str(tmp_path / "i.onnx"), external_data=False)
    # As written: with the stage map in its metadata.
    assert inline.model_bytes == (tmp_path / "i.onnx").stat().st_size == pipe.engine.composed.for_file().encoded_len()
    assert (inline.data_bytes, inline.data_files) == (0, [])
    ext = pipe.engine.composed.save(str(tmp_path / "e.onnx"), external_data=True)
    assert ext.model_bytes == (tmp_path / "e.onnx").stat().st_size
    assert ext.data_files == [_core.LAYOUT.data_file("e.onnx")] == ["e.onnx.data"]
    assert ext.data_bytes == (tmp_path / ext.data_files[0]).stat().st_size
    assert isinstance(_core.PROTOBUF_LIMIT, int)


def test_run_composes_several_models_and_explains_bad_inputs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    onnx.save(scale_model(2.0, out="h"), tmp_path / "a.onnx")
    onnx.save(scale_model(3.0, inp="in"), tmp_path / "b.onnx")
    np.save(tmp_path / "x.npy", X)
    assert cli.main(["run", "a.onnx", "b.onnx", "--io-map", "h:in", "--input", "x=x.npy", "-o", "o.npz"]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "o.npz")["y"], np.maximum(np.maximum(2 * X, 0) * 3, 0))
    np.savez(tmp_path / "x.npz", x=X)
    (tmp_path / "x.txt").write_text("1 2 3")
    for file, match in [
        ("x.npz", r"not a .npy file \(an .npz archive"),
        ("x.txt", "not a .npy file"),
        ("gone.npy", "no such file"),
    ]:
        with pytest.raises(SystemExit, match=match):
            cli.main(["run", "a.onnx", "b.onnx", "--io-map", "h:in", "--input", f"x={file}"])
    with pytest.raises(SystemExit, match="2 models have 1 joint"):
        cli.main(["run", "a.onnx", "b.onnx", "--io-map", "h:in", "--io-map", "y:x", "--input", "x=x.npy"])
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    assert "the .npy file (numpy.save) holding its array" in " ".join(capsys.readouterr().out.split())


# --- kornia.onnx's functions: add_metadata, io_name_conversion -----------------------------


def test_add_metadata_function_edits_the_model_in_place_like_kornia():
    model = scale_model(2.0)
    helper.set_model_props(model, {"version": "old", "k": "v"})
    assert fastseq.add_metadata(model, [("k", "w"), ("x", 1)]) is model
    assert [(p.key, p.value) for p in model.metadata_props] == [
        ("version", fastseq.__version__),
        ("k", "w"),
        ("source", "fastseq"),
        ("x", "1"),
    ]
    onnx.checker.check_model(model)


def test_io_name_conversion_renames_every_reference_including_subgraphs():
    from conftest import if_model_reading_outer_initializer

    shadowed = if_model_reading_outer_initializer(shadow=True)
    fastseq.io_name_conversion(shadowed, {"t": "total", "c": "weights"})
    (else_body,) = [a.g for a in shadowed.graph.node[2].attribute if a.name == "else_branch"]
    assert [list(n.input) for n in else_body.node] == [["x", "weights"], ["t"]]  # its own 't' stays
    assert list(shadowed.graph.node[1].input) == ["total", "zero"]
    model = if_model_reading_outer_initializer()
    feeds = [X, X + 1]  # both branches
    before = [outputs_of(model, {"x": x})[0] for x in feeds]
    # 'c' is read by both bodies from the outer scope; 't' is the outer ReduceSum.
    mapping = {"x": "input", "y": "output", "c": "weights", "t": "total"}
    assert fastseq.io_name_conversion(model, mapping) is model
    onnx.checker.check_model(model, full_check=True)
    assert model.graph.input[0].name == "input" and model.graph.output[0].name == "output"
    for x, want in zip(feeds, before):
        np.testing.assert_allclose(outputs_of(model, {"input": x})[0], want)
    # Now it joins kornia's default "output" -> "input" convention.
    pipe = fastseq.ONNXSequential(model, scale_model(1.0, inp="input", out="y"), io_maps=[[("output", "input")]])
    np.testing.assert_allclose(pipe(X + 1)[0], np.maximum(before[1], 0))
    with pytest.raises(fastseq.CompositionError, match="renaming 'x' to 't' clashes with the existing 't'$"):
        fastseq.io_name_conversion(scale_model(2.0), {"x": "t"})
    with pytest.raises(fastseq.CompositionError, match="renaming 'c' to 'w' clashes with 'x', which is also renamed"):
        fastseq.io_name_conversion(scale_model(2.0), {"x": "w", "c": "w"})
    swapped = fastseq.io_name_conversion(scale_model(2.0), {"x": "t", "t": "x"})  # a swap is fine
    assert list(swapped.graph.node[0].input) == ["t", "c"] and list(swapped.graph.node[0].output) == ["x"]
    with pytest.raises(fastseq.CompositionError, match="defines 'diff' itself"):
        fastseq.io_name_conversion(if_model_reading_outer_initializer(), {"c": "diff"})
