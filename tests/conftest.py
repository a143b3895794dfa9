"""Shared helpers: real ONNX Runtime sessions, the onnx package's test data, small models."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

#: this folder (the test helpers' home, on the path of every test and subprocess) and the
#: repository's root
TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
FIXTURES = Path(__file__).parent / "fixtures"
ONNX_DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"


@pytest.fixture(autouse=True)
def _a_program_without_kornia(request, monkeypatch):
    """The default run describes fastseq in a program that has not imported kornia, also
    where kornia is installed (test_kornia_compat*.py import it when they are collected):
    fastseq reads kornia_config and stamps kornia's metadata only in a program that did. The
    ``torch`` group, which runs beside the real kornia, keeps it."""
    if request.node.get_closest_marker("torch") is None:
        for name in ("kornia", "kornia.config"):
            monkeypatch.delitem(sys.modules, name, raising=False)


def session(model: onnx.ModelProto | bytes | str | Path) -> ort.InferenceSession:
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(
        model if isinstance(model, bytes) else str(model), options, providers=["CPUExecutionProvider"]
    )


def run(model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    s = session(model)
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(names, feeds)))


def run_chain(models, first_feeds: dict[str, np.ndarray], io_maps=None) -> dict[str, np.ndarray]:
    """The reference: each stage in its own session, outputs handed on by the io_map."""
    outputs = run(models[0], first_feeds)
    for j, model in enumerate(models[1:]):
        s = session(model)
        if io_maps is None:
            ins = [i.name for i in s.get_inputs()]
            feeds = dict(zip(ins, outputs.values()))
        else:
            feeds = {i: outputs[o] for o, i in io_maps[j]}
        outputs = run(model, feeds)
    return outputs


def pytorch_converted(name: str) -> onnx.ModelProto:
    return onnx.load(str(ONNX_DATA / "pytorch-converted" / name / "model.onnx"))


def input_pb(name: str, kind: str = "pytorch-converted") -> np.ndarray:
    tensor = onnx.load_tensor(str(ONNX_DATA / kind / name / "test_data_set_0" / "input_0.pb"))
    return numpy_helper.to_array(tensor)


def varint(n: int) -> bytes:
    """Protobuf base-128 varint, for models and messages written byte by byte (a negative
    int64 as its 64-bit two's complement, ten bytes, as protobuf writes it)."""
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(tag: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return varint(tag << 3 | 2) + varint(len(payload)) + payload


def scale_model(
    scale: float,
    inp: str = "x",
    out: str = "y",
    shape=(2, 4),
    opset: int = 17,
    ir: int = 8,
    dtype=TensorProto.FLOAT,
    name: str = "scale",
) -> onnx.ModelProto:
    """y = relu(x * c) with an initializer 'c' and an internal tensor 't' (names that clash)."""
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    c = numpy_helper.from_array(np.full(shape[-1:], scale, np_dtype), "c")
    nodes = [
        helper.make_node("Mul", [inp, "c"], ["t"], name="mul"),
        helper.make_node("Relu", ["t"], [out], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(inp, dtype, list(shape))],
        [helper.make_tensor_value_info(out, dtype, list(shape))],
        [c],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir)


def if_model_reading_outer_initializer(shadow: bool = False) -> onnx.ModelProto:
    """y = x * c if sum(x) > 0 else x - c, where both branches read the outer initializer
    'c' (the case onnx.compose.add_prefix breaks). With ``shadow`` the else branch defines
    its own 't', shadowing the outer 't' (ONNX Runtime runs it; onnx.checker refuses it)."""
    local = "t" if shadow else "diff"
    c = numpy_helper.from_array(np.array([2.0, 3.0, 4.0, 5.0], np.float32), "c")
    then_g = helper.make_graph(
        [helper.make_node("Mul", ["x", "c"], ["then_out"])],
        "then",
        [],
        [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, [2, 4])],
    )
    else_g = helper.make_graph(
        [helper.make_node("Sub", ["x", "c"], [local]), helper.make_node("Identity", [local], ["else_out"])],
        "else",
        [],
        [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, [2, 4])],
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["t"], keepdims=0),
        helper.make_node("Greater", ["t", "zero"], ["cond"]),
        helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g),
    ]
    graph = helper.make_graph(
        nodes,
        "cond_scale",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [c, numpy_helper.from_array(np.array(0.0, np.float32), "zero")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def loop_model_reading_outer_initializer() -> onnx.ModelProto:
    """y = x + 3 * c: a Loop of 3 iterations whose body adds the outer initializer 'c'."""
    c = numpy_helper.from_array(np.array([1.0, 2.0, 3.0, 4.0], np.float32), "c")
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["acc_in", "c"], ["acc_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [2, 4]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [2, 4]),
        ],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)],
        "loop",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [c, numpy_helper.from_array(np.array(3, np.int64), "n")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def save_external(path: Path, location: str) -> Path:
    """scale_model(2.0) on [2, 512] saved at ``path`` (its folder made), its weights (2 KB)
    in the external data file ``location`` beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(scale_model(2.0, shape=(2, 512)), path, save_as_external_data=True, location=location, size_threshold=0)
    return path


def set_external_location(path, location: str) -> None:
    """Points the first initializer of the external-data model at ``path`` to ``location``."""
    model = onnx.load(str(path), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = location
    onnx.save(model, str(path))


def all_at_once(commands: list[list[str]], timeout: float, cwd: Path | None = None) -> None:
    """Starts every command at once and waits for them all: each must exit 0 (its stderr
    says why where one does not)."""
    procs = [
        subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for command in commands
    ]
    for p in procs:
        _, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err


@pytest.fixture
def x24() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)


@contextmanager
def tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` mounted at ``mount`` (a full disk, or one remounted read-only).
    Needs the right to mount (root here and in CI); skips the test otherwise."""
    mount.mkdir(exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        # A mapping still open (a session freed later) makes it busy: detach it lazily then,
        # so that no mount outlives the test.
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(mount: Path) -> Path:
    """Fills the file system at ``mount`` to its last block (a full disk); the filler file."""
    filler = mount / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError:
            pass
    return filler


# --- loopback servers and folders, for the loaders' tests --------------------------------------
@pytest.fixture
def www(tmp_path):
    """A plain HTTP server on 127.0.0.1 serving one model, ``a.onnx``: (server, its folder)."""
    from servers import serve_files

    root = tmp_path / "www"
    root.mkdir()
    onnx.save(scale_model(2.0), root / "a.onnx")
    server = serve_files(root)
    yield server, root
    server.close()


def files_under(folder: Path) -> list[str]:
    """Every file under ``folder``, relative, sorted: what a download or a cache left there."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
