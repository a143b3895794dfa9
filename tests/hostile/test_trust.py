"""Trust boundaries (issue 18): nothing fastseq does computes a silently wrong result or
fails with an untyped error. Binding refuses what it cannot bind in place; downloads are
decoded before they are kept; hf:// ids are checked before any request; Hub listings fail
fast; pipeline files and operator parameters give typed errors; runtime errors name the
stage, whatever the node names, without ONNX Runtime's own copy of them on stderr."""

from __future__ import annotations

import pickle
import re
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import fastseq
from conftest import scale_model
from fastseq.sources import resolve as loader
from servers import HangUp, serve_files, serve_hub

X = np.linspace(-1, 1, 32, dtype=np.float32).reshape(8, 4)


@pytest.fixture
def pipe():
    return fastseq.ONNXSequential(scale_model(2.0, shape=("N", 4)))


# --- binding ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make",
    [lambda x: x[::2], lambda x: np.asfortranarray(x[:2]), lambda x: x[:, ::-1]],
    ids=["strided", "fortran", "reversed"],
)
def test_binding_refuses_an_array_it_cannot_bind_in_place(pipe, make):
    x = X.copy()
    view = make(x)
    with pytest.raises(fastseq.InputError, match=r"input 'x': .*not C-contiguous.*np\.ascontiguousarray\(x\)"):
        pipe.bind(view)
    b = pipe.bind(x[:2])  # a binding exists: binding a view again is refused just the same
    with pytest.raises(fastseq.InputError, match="np.ascontiguousarray"):
        b(view)


def test_the_fix_the_error_names_binds_in_place(pipe):
    x = np.ascontiguousarray(X[::2])
    b = pipe.bind(x)
    x[:] = 5.0  # written in place, as the README describes: the next call sees it
    np.testing.assert_allclose(b()[0], np.full((4, 4), 10.0))


class StridedDLPack:
    """Something with only ``__dlpack__``: a strided view of a numpy array."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_binding_refuses_strided_dlpack_and_binds_contiguous_dlpack_in_place(pipe):
    x = X.copy()
    with pytest.raises(fastseq.InputError, match=r"StridedDLPack \(DLPack\) is not C-contiguous"):
        pipe.bind(StridedDLPack(x[::2]))
    b = pipe.bind(StridedDLPack(x))
    x[:] = 1.0
    np.testing.assert_allclose(b()[0], np.full((8, 4), 2.0))


def test_binding_refuses_a_non_contiguous_torch_tensor(pipe):
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(X.copy()).t().contiguous().t()  # column-major
    with pytest.raises(fastseq.InputError, match=r"torch tensor is not C-contiguous.*x\.contiguous\(\)"):
        pipe.bind(t)


@pytest.mark.parametrize("outputs", ["evil", "Numpy", 5, None])
def test_binding_outputs_kind_is_checked(pipe, outputs):
    with pytest.raises(fastseq.InputError, match=r"outputs must be one of 'numpy', 'torch', 'ortvalue'"):
        pipe.bind(X, outputs=outputs)


@pytest.mark.parametrize("timeout", [float("inf"), "1", 0, -1, float("nan"), True, 1e300])
def test_a_timeout_that_is_not_a_positive_finite_number_is_refused_before_any_thread(pipe, timeout):
    errors = []
    hook, threading.excepthook = threading.excepthook, errors.append  # a timer thread's failure lands here
    try:
        before = threading.active_count()
        with pytest.raises(
            fastseq.InputError, match="timeout must be (a positive, finite number of seconds or None|at most)"
        ):
            pipe.run({"x": X}, timeout=timeout)
        assert threading.active_count() == before and not errors
    finally:
        threading.excepthook = hook


@pytest.mark.parametrize("timeout", [float("inf"), "1", 0, float("nan")])
def test_run_async_checks_its_timeout_too(pipe, timeout):
    import asyncio

    with pytest.raises(fastseq.InputError, match="timeout must be a positive, finite number"):
        asyncio.run(pipe.run_async(X, timeout=timeout))


def test_valid_timeouts_and_log_levels_still_run(pipe):
    np.testing.assert_allclose(pipe.run({"x": X}, timeout=30)[0], np.maximum(2 * X, 0))
    np.testing.assert_allclose(pipe.run({"x": X}, timeout=0.5, log_level=3)[0], np.maximum(2 * X, 0))
    with pytest.raises(fastseq.InputError, match="log_level must be an int from 0"):
        pipe.run({"x": X}, log_level="loud")


# --- downloads --------------------------------------------------------------------------------
def files_in(folder) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir())


@pytest.fixture
def www(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    onnx.save(scale_model(2.0), root / "a.onnx")
    (root / "garbage.onnx").write_bytes(bytes(range(256)) * 8)
    server = serve_files(root)
    yield server
    server.close()


def test_a_url_whose_content_length_is_short_never_enters_the_cache(www, tmp_path):
    """http.client stops reading at the announced length: the body arrives cut, whole by
    its header. The core decodes it before it is kept."""
    www.short_length = True
    cache = tmp_path / "cache"
    with pytest.raises(
        fastseq.DownloadError, match=r"a\.onnx: the download is not a whole ONNX model, so it was not kept"
    ):
        fastseq.ONNXSequential(f"{www.url}/a.onnx", cache_dir=cache)
    assert not cache.exists() or files_in(cache) == []
    www.short_length = False
    np.testing.assert_allclose(
        fastseq.ONNXSequential(f"{www.url}/a.onnx", cache_dir=cache)(X[:2])[0], np.maximum(2 * X[:2], 0)
    )


def test_a_garbage_url_body_never_enters_the_cache(www, tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(fastseq.DownloadError, match="garbage.onnx: the download is not a whole ONNX model"):
        loader.resolve(f"{www.url}/garbage.onnx", 0, cache_dir=cache)
    assert not cache.exists() or files_in(cache) == []
    with pytest.raises(fastseq.DownloadError, match="not a whole ONNX model"):
        fastseq.ONNXLoader.load_model(f"{www.url}/garbage.onnx", cache_dir=cache)
    assert not cache.exists() or files_in(cache) == []
    # A file that is not a model (a JSON config) is downloaded as it is.
    (tmp_path / "www" / "config.json").write_text('{"size": 3}')
    assert fastseq.ONNXLoader.load_config(f"{www.url}/config.json", cache_dir=cache) == {"size": 3}


@pytest.fixture
def hub(tmp_path, monkeypatch):
    root = tmp_path / "hub"
    (root / "acme" / "models").mkdir(parents=True)
    onnx.save(scale_model(2.0), root / "acme" / "models" / "double.onnx")
    (root / "acme" / "models" / "junk.onnx").write_bytes(bytes(range(256)) * 8)
    (root / "kornia" / "ONNX_models" / "operators").mkdir(parents=True)
    onnx.save(scale_model(2.0), root / "kornia" / "ONNX_models" / "operators" / "double.onnx")
    server = serve_hub(root)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield server
    server.close()


@pytest.mark.parametrize("name", ["double", "junk"])
def test_a_cut_or_garbage_hub_file_never_stays_in_the_cache(hub, tmp_path, name):
    hub.short_length = name == "double"
    cache = tmp_path / "hf"
    with pytest.raises(fastseq.DownloadError, match=f"hf://acme/models/{name}.onnx: the download is not a whole ONNX"):
        fastseq.ONNXSequential(f"hf://acme/models/{name}.onnx", cache_dir=cache)
    assert not [f for f in files_in(cache) if "/blobs/" in f or "/snapshots/" in f]
    hub.short_length = False
    if name == "double":  # nothing damaged was left to be found: the next load fetches it whole
        np.testing.assert_allclose(
            fastseq.ONNXSequential("hf://acme/models/double.onnx", cache_dir=cache)(X[:2])[0], np.maximum(2 * X[:2], 0)
        )


@pytest.mark.parametrize(
    "ref",
    [
        "hf://org/repo/../../x.onnx",
        "hf://org/repo@../../evil/m.onnx",
        "hf://../../repo/m.onnx",
        "hf://org/repo//etc/passwd.onnx",
        "hf://org/repo@/m.onnx",
        "hf://operators/../../x",
        "hf://org/re\\po/m.onnx",
    ],
)
def test_hub_ids_with_dot_dot_absolute_or_empty_parts_are_refused_before_any_request(hub, tmp_path, ref):
    with pytest.raises(fastseq.DownloadError, match=r"has an empty, '\.' or '\.\.' part"):
        fastseq.ONNXSequential(ref, cache_dir=tmp_path / "hf")
    with pytest.raises(fastseq.DownloadError):
        fastseq.ONNXLoader.load_model(ref, cache_dir=tmp_path / "hf")
    assert hub.requests == []


def test_hub_listings_fail_at_once_offline(hub, monkeypatch, capsys):
    fastseq.ONNXLoader.list_operators()  # online: the listing
    assert capsys.readouterr().out.strip() == "['operators/double.onnx']"
    asked = len(hub.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for listing in (fastseq.ONNXLoader.list_operators, fastseq.ONNXLoader.list_models):
        with pytest.raises(fastseq.DownloadError, match="listing the Hub needs the network, and HF_HUB_OFFLINE is set"):
            listing()
    assert len(hub.requests) == asked  # offline means not asking


def test_hub_listings_ask_an_unreachable_hub_once(monkeypatch):
    """huggingface_hub retries a dropped connection five times with back-off (~23 s) and
    raises its HTTP client's own error; a listing asks once and raises a DownloadError."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    server = HangUp()
    try:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        with pytest.raises(
            fastseq.DownloadError,
            match=f"cannot list kornia/ONNX_models/models: the Hub at {server.url} is unreachable",
        ):
            fastseq.ONNXLoader.list_models()
        assert server.connections == 1
    finally:
        server.close()


# --- pipeline files ---------------------------------------------------------------------------
STAGES = '[stages]\na = "a.onnx"\n'
DEEP = "[" * 5000 + "]" * 5000

BAD_FILES = {
    "binary garbage": (bytes(range(256)), "not a pipeline file: not UTF-8 text (byte 128 is 0x80)"),
    "latin-1 text": ('[stages]\na = "café.onnx"\n'.encode("latin-1"), "not UTF-8 text"),
    "sha256 an int": (
        '[stages]\na = { source = "a.onnx", sha256 = 5 }\n',
        "stages.a.sha256: expected 64 hex digits, got int 5",
    ),
    "sha256 short": (
        '[stages]\na = { source = "a.onnx", sha256 = "abc" }\n',
        "stages.a.sha256: expected 64 hex digits",
    ),
    "edges an int": ("edges = 3\n" + STAGES, "edges: expected a list of strings"),
    "an edge a list": ('edges = [["a.y -> a.x"]]\n' + STAGES, "edges[0]: expected a string, got list"),
    "outputs an int": ("outputs = [5]\n" + STAGES, "outputs[0]: expected a string, got int 5"),
    "providers a string": ('providers = "x"\n' + STAGES, "providers: expected a list of provider names"),
    "provider option a list": (
        'providers = [{ name = "CPUExecutionProvider", arena = [1] }]\n' + STAGES,
        "providers[0].arena: expected a string, number or boolean",
    ),
    "inputs an int": (STAGES + "[inputs]\nimage = 5\n", "inputs.image: expected 'stage.input' or a list of them"),
    "metadata a table": (STAGES + "[metadata]\ndoc_string = { a = 1 }\n", "metadata.doc_string: expected a string"),
    "session option a list": (
        STAGES + "[session_options]\nintra_op_num_threads = [2]\n",
        "session_options.intra_op_num_threads: expected a string, number or boolean",
    ),
    "model_version too big": (
        "model_version = 99999999999999999999999\n" + STAGES,
        "model_version: expected an integer",
    ),
    "opset negative": ("opset = -5\n" + STAGES, "opset: expected an integer from 1"),
    "external_data a list": ("external_data = [1]\n" + STAGES, "external_data: expected true, false"),
    "adapt a float": ("adapt = [1.5]\n" + STAGES, "adapt[0]: expected an edge index or an edge string, got float 1.5"),
    "5,000 deep array": ("edges = " + DEEP + "\n" + STAGES, "edges: nested deeper than any pipeline file"),
    "5,000 deep in a stage": (
        '[stages]\na = { source = "a.onnx", sha256 = ' + DEEP + " }\n",
        "stages.a: nested deeper than any pipeline file",
    ),
    "3,000 deep tables": (
        '[stages]\na = { source = "a.onnx", sha256 = ' + "{a=" * 3000 + "1" + "}" * 3000 + " }\n",
        "stages.a: nested deeper",
    ),
    "200 deep (parseable)": (
        STAGES + "[metadata]\ndoc_string = " + "[" * 200 + "]" * 200 + "\n",
        "metadata.doc_string: nested deeper than any pipeline file (at most 8 levels)",
    ),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_a_bad_pipeline_file_is_a_pipeline_file_error_naming_the_file_and_key(tmp_path, case):
    from fastseq.graph import pipefile

    text, says = BAD_FILES[case]
    onnx.save(scale_model(2.0), tmp_path / "a.onnx")
    path = tmp_path / "bad.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(fastseq.PipelineFileError) as info:
        pipefile.read(path)
    assert str(info.value).startswith(f"{path}: ") and says in str(info.value)
    with pytest.raises(fastseq.PipelineFileError):
        fastseq.Pipeline.from_file(path)


def test_pipeline_file_error_is_a_public_load_error():
    assert issubclass(fastseq.PipelineFileError, fastseq.LoadError) and "PipelineFileError" in fastseq.__all__


def test_a_folder_as_a_pipeline_file_is_a_pipeline_file_error(tmp_path):
    from fastseq.graph import pipefile

    (tmp_path / "p.toml").mkdir()
    with pytest.raises(fastseq.PipelineFileError, match="p.toml: cannot be read"):
        pipefile.read(tmp_path / "p.toml")


def test_a_source_path_no_system_can_open_is_a_load_error(tmp_path):
    with pytest.raises(fastseq.LoadError, match="cannot be read"):
        fastseq.ONNXSequential(str(tmp_path / ("x" * 5000 + ".onnx")))
    with pytest.raises(fastseq.LoadError, match="sha256 must be 64 hex digits"):
        fastseq.Pipeline({"a": {"source": scale_model(2.0), "sha256": 5}})


# --- operator parameters ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec, says",
    [
        ("nms?max_boxes=99999999999999999999", "max_boxes must be at most 9223372036854775807"),
        ("nms?max_boxes=-99999999999999999999", "max_boxes must be at least 1"),
        ("topk?k=" + "9" * 400, "k must be at most"),
        ("resize?size=99999999999999999999", "size must be at most"),
        ("to_float?rank=10000000000", "rank must be at most 32"),
        ("to_float?scale=1e39", "scale must be a finite number within float32's range"),
        ("normalize?mean=1" + "0" * 400, "mean must be a finite number within float32's range"),
        ("nms?iou=1" + "0" * 400, "iou must be a finite number"),
    ],
)
def test_operator_parameters_out_of_range_are_operator_errors(spec, says):
    from fastseq.ops import OperatorError

    with pytest.raises(OperatorError, match=says):
        fastseq.ONNXSequential(f"builtin:{spec}")
    with pytest.raises(OperatorError, match=says):
        fastseq.ops.from_string(spec)


@pytest.mark.parametrize(
    "spec, says",
    [
        ("normalize?std=1e-46", "std must not be zero: 1e-46 is 0 in float32"),
        ("normalize?std=1e-8&dtype=float16", "std must not be zero: 1e-08 is 0 in float16"),
        ("normalize?mean=1e5&dtype=float16", "mean must be within float16's range"),
        ("to_float?scale=1e-46", "scale must not be zero: 1e-46 is 0 in float32"),
        ("to_float?scale=1e5&to=float16", "scale must be within float16's range"),
    ],
)
def test_parameters_that_the_constants_dtype_cannot_hold_are_operator_errors(spec, says):
    """A std of 1e-46 is 0 in float32: the model divided by zero and output inf (issue 26,
    item 12). A value must keep its meaning in the dtype of the constant that holds it."""
    from fastseq.ops import OperatorError

    with pytest.raises(OperatorError, match=re.escape(says)):
        fastseq.ops.from_string(spec)
    with pytest.raises(OperatorError, match=re.escape(says)):
        fastseq.ONNXSequential(f"builtin:{spec}")


@pytest.mark.parametrize(
    "spec, says",
    [
        # 1e-45 is not 0 as a Python float: in float32 it is a subnormal whose reciprocal is inf.
        (
            "normalize?std=1e-45",
            "std must keep the model's values finite in float32: it computes (x - mean) / std, "
            "and 1 / 1e-45 is inf there",
        ),
        ("normalize?mean=0&std=1e-39", "1 / 1e-39 is inf there"),
        (
            "normalize?mean=1e30&std=1e-10",
            "std must keep the model's values finite in float32: it computes "
            "(x - mean) / std, and (0 - 1e+30) / 1e-10 is -inf there",
        ),
        ("normalize?mean=0.5,0.5,1e30&std=1e-10", "(0 - 1e+30) / 1e-10 is -inf there"),
        ("normalize?std=1e-5&dtype=float16", "1 / 1e-05 is inf there"),
        ("normalize?mean=100&std=1e-3&dtype=float16", "(0 - 100.0) / 0.001 is -inf there"),
        ("normalize?mean=0&std=5e-324&dtype=float64", "1 / 5e-324 is inf there"),
        # 1/5e-39 is finite, but a subnormal is 0 where subnormals are flushed: a division by zero.
        (
            "normalize?mean=0&std=5e-39",
            "std must be at least 1.175e-38 in magnitude in float32, got 5e-39: it is subnormal there",
        ),
        ("normalize?mean=0&std=1e-308&dtype=float64", "std must be at least 2.225e-308 in magnitude in float64"),
        (
            "to_float?scale=1e37",
            "scale must keep the model's values finite in float32: it computes "
            "float32(input) * scale, and 255 * 1e+37 is inf there",
        ),
        ("to_float?scale=300&to=float16", "255 * 300 is inf there"),
        ("to_float?scale=1e20&dtype=int64", "9223372036854775808 * 1e+20 is inf there"),
        ("to_float?scale=1e-40", "scale must be at least 1.175e-38 in magnitude in float32, got 1e-40"),
        ("to_float?scale=1e-5&to=float16", "scale must be at least 6.104e-05 in magnitude in float16"),
    ],
)
def test_parameters_that_make_the_model_compute_inf_are_operator_errors(spec, says):
    """The check is on what the model computes in its dtype, not on the Python float (issue 37,
    item 1): normalize(std=1e-45) was accepted and its model output inf."""
    from fastseq.ops import OperatorError

    with pytest.raises(OperatorError, match=re.escape(says)):
        fastseq.ops.from_string(spec)
    with pytest.raises(OperatorError, match=re.escape(says)):
        fastseq.ONNXSequential(f"builtin:{spec}")


def test_the_smallest_parameters_each_dtype_keeps_finite_are_kept():
    """The edges of those checks: the smallest normal std of each dtype divides to a finite
    value; a float16 scale times 255 just below float16's largest; a uint16 input to float16
    (65535 is inf there whatever the scale: the cast's doing, not the scale's) is left alone."""
    for dtype, tiny in (("float16", 2.0**-14), ("float32", 2.0**-126), ("float64", 2.0**-1022)):
        x = np.ones((1, 3, 1, 1), dtype)
        (y,) = fastseq.ONNXSequential(fastseq.ops.normalize(0.0, tiny, dtype=dtype), session_cache=False)(x)
        assert np.isfinite(y).all() and y.dtype == dtype
    (y,) = fastseq.ONNXSequential(fastseq.ops.to_float(256, to="float16"), session_cache=False)(
        np.full((1, 1, 1, 1), 255, np.uint8)
    )
    assert np.isfinite(y).all()
    fastseq.ops.to_float(2.0, dtype="uint16", to="float16")
    fastseq.ops.to_float(1e30, dtype="float32")


def test_a_tiny_std_that_float64_holds_is_kept():
    x = np.ones((1, 3, 2, 2))
    pipe = fastseq.ONNXSequential(fastseq.ops.normalize(mean=0.0, std=1e-300, dtype="float64"), session_cache=False)
    np.testing.assert_allclose(pipe(x)[0], x / 1e-300)


# --- runtime errors name the stage ------------------------------------------------------------
def reshaper(shape, node: str, x: str = "x", y: str = "y") -> onnx.ModelProto:
    """x -> Reshape(x, shape) in a node named ``node``: fails at run time when x does not fit."""
    s = numpy_helper.from_array(np.array(shape, np.int64), f"{node}_shape")
    g = helper.make_graph(
        [helper.make_node("Reshape", [x, f"{node}_shape"], [y], name=node)],
        node,
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, None)],
        [s],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def branching() -> onnx.ModelProto:
    """y = Reshape(x, [3, 3]) inside an If's branch (taken when sum(x) > 0), in a node 'inner'."""
    then_g = helper.make_graph(
        [helper.make_node("Reshape", ["x", "square"], ["t"], name="inner")],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)],
    )
    else_g = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e"], name="same")],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)],
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0, name="sum"),
        helper.make_node("Greater", ["total", "zero"], ["positive"], name="test"),
        helper.make_node("If", ["positive"], ["y"], then_branch=then_g, else_branch=else_g, name="branch"),
    ]
    g = helper.make_graph(
        nodes,
        "branching",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(np.array([3, 3], np.int64), "square"),
            numpy_helper.from_array(np.array(0, np.float32), "zero"),
        ],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def rectifier(node: str, x: str = "x", y: str = "y") -> onnx.ModelProto:
    """y = Relu(x) in a node named ``node`` (nothing ONNX Runtime fuses with a Reshape)."""
    g = helper.make_graph(
        [helper.make_node("Relu", [x], [y], name=node)],
        node,
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, ["n"])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def graph_pipeline() -> fastseq.Pipeline:
    # No name clashes between the stages: the core renames nothing.
    return fastseq.Pipeline(
        {"first": rectifier("act", y="h"), "second": reshaper([3, 3], "square", x="h")}, edges=["first.h -> second.h"]
    )


def calls(pipe):
    """Every way to call a pipeline, each failing on 8 values."""
    x = np.ones(8, np.float32)
    return {
        "call": lambda: pipe(x),
        "run": lambda: pipe.run({"x": x}),
        "run with a timeout": lambda: pipe.run({"x": x}, timeout=60, tag="t"),
        "binding": lambda: pipe.bind(x.copy())(),
    }


@pytest.mark.parametrize("how", ["call", "run", "run with a timeout", "binding"])
def test_a_failing_node_names_its_stage_when_no_names_clash(how, capfd):
    pipe = graph_pipeline()
    capfd.readouterr()
    with pytest.raises(fastseq.RunError, match=r"^stage second: .*Name:'square \(in second\)'") as info:
        calls(pipe)[how]()
    assert "the pipeline" not in str(info.value)
    assert "[E:onnxruntime:" not in capfd.readouterr().err  # fastseq's error is the only one


def test_the_stage_is_named_in_a_chain_after_pickling_and_for_the_first_stage_too():
    seq = fastseq.ONNXSequential(rectifier("act", y="h"), reshaper([3, 3], "square", x="h"))
    for pipe in (seq, pickle.loads(pickle.dumps(seq)), pickle.loads(pickle.dumps(graph_pipeline()))):
        with pytest.raises(fastseq.RunError, match=r"^stage (square \(#1\)|second): .*Name:'square \(in "):
            pipe(np.ones(8, np.float32))
    first = fastseq.Pipeline(
        {"first": reshaper([3, 3], "square", y="h"), "second": rectifier("act", x="h")}, edges=["first.h -> second.h"]
    )
    with pytest.raises(fastseq.RunError, match=r"^stage first: .*Name:'square \(in first\)'"):
        first(np.ones(8, np.float32))


def test_a_node_inside_a_subgraph_is_traced_to_its_stage():
    pipe = fastseq.Pipeline(
        {"pre": scale_model(1.0, inp="a", out="x", shape=(8,)), "cond": branching()}, edges=["pre.x -> cond.x"]
    )
    with pytest.raises(fastseq.RunError, match=r"^stage cond: .*Name:'inner \(in cond\)'"):
        pipe(np.ones(8, np.float32))


def test_onnx_runtime_warnings_still_show(capfd):
    """Only ONNX Runtime's errors are kept off stderr (fastseq raises them); its warnings,
    such as an output of another shape than the model declares, still show."""
    s = helper.make_tensor_value_info("s", TensorProto.INT64, [2])
    g = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape")],
        "declared",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"]), s],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
    )
    pipe = fastseq.ONNXSequential(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    capfd.readouterr()
    assert pipe(np.ones(8, np.float32), np.array([1, -1]))[0].shape == (1, 8)
    assert "VerifyOutputSizes" in capfd.readouterr().err


def test_portable_rebuilds_the_runtime_with_its_stage_names():
    """What Ray's actors build their runtime from: calls, checks and stage names as the
    original pipeline has them, with the providers and options the other side chose."""
    from fastseq.runtime.runnable import Runnable

    portable = graph_pipeline().portable()
    assert isinstance(portable["model"], bytes) and portable["labels"] == ["first", "second"]
    rebuilt = Runnable.from_portable(
        {**pickle.loads(pickle.dumps(portable)), "session_options": {"intra_op_num_threads": 1}}
    )
    assert rebuilt.get_session().get_session_options().intra_op_num_threads == 1
    np.testing.assert_allclose(rebuilt(np.ones(9, np.float32))[0], np.ones((3, 3)))
    with pytest.raises(fastseq.InputError, match="expects float32, got float64"):
        rebuilt(np.ones(9))
    with pytest.raises(fastseq.RunError, match=r"^stage second: "):
        rebuilt(np.ones(8, np.float32))
