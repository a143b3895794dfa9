"""Files that change under fastseq: sources rewritten in place after a pipeline was built,
exports racing each other or killed midway, external data that does not hold its tensor."""

from __future__ import annotations

import os
import pickle
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import fastseq
from conftest import TESTS, scale_model
from fastseq import _core

N = 1 << 16  # 64K floats: 256 KB of weights per row


def save_external(model: onnx.ModelProto, path: Path, location: str) -> None:
    onnx.save(model, str(path), save_as_external_data=True, location=location, size_threshold=0)


def run_file(path: Path, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def rewrite_in_place(path: Path, data: bytes) -> None:
    """What ``onnx.save`` does to an existing file: truncate it and write anew, same inode."""
    inode = path.stat().st_ino
    with open(path, "wb") as f:
        f.write(data)
    assert path.stat().st_ino == inode


REWRITES = {
    "smaller": lambda: scale_model(5.0).SerializeToString(),
    "same size": lambda: scale_model(7.0, shape=(2, N)).SerializeToString(),
    "larger": lambda: scale_model(9.0, shape=(2, 2 * N)).SerializeToString(),
    "emptied": lambda: b"",
}


@pytest.mark.parametrize("rewrite", list(REWRITES))
def test_a_source_rewritten_in_place_changes_nothing_in_a_built_pipeline(tmp_path, rewrite):
    """The issue's SIGBUS: the pipeline keeps the model it was built from, in every form."""
    src = tmp_path / "a.onnx"
    onnx.save(scale_model(2.0, shape=(2, N)), src)
    pipe = fastseq.ONNXSequential(src, scale_model(3.0, shape=(2, N)))
    x = np.random.default_rng(0).standard_normal((2, N)).astype(np.float32)
    (expected,) = pipe(x)
    before = pipe.model_bytes
    rewrite_in_place(src, REWRITES[rewrite]())

    assert pipe.model_bytes == before
    np.testing.assert_array_equal(pipe(x)[0], expected)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(pipe))(x)[0], expected)
    pipe.export(tmp_path / "inline.onnx")  # streamed: the same fields, in another order
    written = onnx.load(tmp_path / "inline.onnx")
    assert written.metadata_props[-1].key == "fastseq.stages"  # a file also says which stage each node is
    del written.metadata_props[-1]
    assert written.SerializeToString() == onnx.ModelProto.FromString(before).SerializeToString()
    pipe.export(tmp_path / "ext.onnx", external_data=True)
    np.testing.assert_array_equal(run_file(tmp_path / "ext.onnx", x), expected)
    pipe.engine.composed.check_sources()  # nothing it reads can change


@pytest.mark.parametrize("rewrite", ["emptied", "same size"])
def test_external_data_rewritten_in_place_changes_nothing_in_a_built_pipeline(tmp_path, rewrite):
    src = tmp_path / "a.onnx"
    save_external(scale_model(2.0, shape=(2, N)), src, "a.bin")
    pipe = fastseq.ONNXSequential(src)
    x = np.ones((2, N), np.float32)
    before = pipe.model_bytes
    data = (tmp_path / "a.bin").read_bytes()
    rewrite_in_place(tmp_path / "a.bin", b"" if rewrite == "emptied" else np.full(N, 7.0, np.float32).tobytes())
    assert len(data) == N * 4
    assert pipe.model_bytes == before
    np.testing.assert_array_equal(pipe(x)[0], np.full((2, N), 2.0, np.float32))
    pipe.export(tmp_path / "out.onnx", external_data=True)
    np.testing.assert_array_equal(run_file(tmp_path / "out.onnx", x), np.full((2, N), 2.0, np.float32))


def test_linked_external_data_rewritten_after_load_is_refused_by_name(tmp_path):
    """external_data='reuse' keeps pointing at the source files (not read): a changed one is
    a LoadError naming it, from check_sources() and from save(), which leaves nothing."""
    src = tmp_path / "src"
    src.mkdir()
    save_external(scale_model(2.0, shape=(2, N)), src / "a.onnx", "a.bin")
    out = tmp_path / "out"
    out.mkdir()
    x = np.ones((2, N), np.float32)

    composed = _core.compose([str(src / "a.onnx")], ["a.onnx"], link_external=True)
    composed.check_sources()
    composed.save(str(out / "m.onnx"))
    np.testing.assert_array_equal(run_file(out / "m.onnx", x), np.full((2, N), 2.0, np.float32))

    for change in ("same size", "shorter", "replaced"):
        composed = _core.compose([str(src / "a.onnx")], ["a.onnx"], link_external=True)
        data = (src / "a.bin").read_bytes()
        time.sleep(0.01)  # a later mtime even on coarse clocks
        if change == "same size":
            rewrite_in_place(src / "a.bin", np.full(N, 7.0, np.float32).tobytes())
        elif change == "shorter":
            rewrite_in_place(src / "a.bin", data[:100])
        else:
            (src / "new.bin").write_bytes(data)
            os.replace(src / "new.bin", src / "a.bin")
        with pytest.raises(fastseq.LoadError, match=r"a\.bin: the file changed since the model was loaded"):
            composed.check_sources()
        before = sorted(os.listdir(out))
        with pytest.raises(fastseq.LoadError, match=r"a\.bin: the file changed since the model was loaded"):
            composed.save(str(out / "m2.onnx"))
        assert sorted(os.listdir(out)) == before
        (src / "a.bin").write_bytes(data)


# --- concurrent and killed exports ----------------------------------------------------


def folder_matches_its_model(folder: Path, name: str, extra: set[str] = frozenset()) -> set[str]:
    """Asserts the folder holds the model and exactly the data files it references."""
    model = onnx.load(str(folder / name), load_external_data=False)
    referenced = {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
    assert set(os.listdir(folder)) == {name, *referenced, *extra}
    return referenced


def scales_of(path: Path, x: np.ndarray) -> float:
    return float(run_file(path, x)[0, 0])


def test_threads_exporting_to_one_path_leave_the_model_and_its_data_only(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    pipes = [fastseq.ONNXSequential(scale_model(1.0 + t, shape=(2, 1024))) for t in range(8)]
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for _ in range(25):
                pipes[t].export(out / "m.onnx", external_data=True)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    (data,) = folder_matches_its_model(out, "m.onnx")
    assert scales_of(out / "m.onnx", np.ones((2, 1024), np.float32)) in {1.0 + t for t in range(8)}
    assert data.startswith("m.onnx.")


EXPORT_LOOP = """
import sys, fastseq
from conftest import scale_model
pipe = fastseq.ONNXSequential(scale_model(float(sys.argv[1]), shape=(2, 1024)))
print("ready", flush=True)
for _ in range(int(sys.argv[3])):
    pipe.export(sys.argv[2], external_data=True)
    print("saved", flush=True)
"""


def export_loop(scale: float, target: Path, count: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen(
        [sys.executable, "-c", EXPORT_LOOP, str(scale), str(target), str(count)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_processes_exporting_to_one_path_leave_the_model_and_its_data_only(tmp_path):
    target = tmp_path / "m.onnx"
    procs = [export_loop(1.0 + k, target, 25) for k in range(4)]
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0 and out.count("saved") == 25
    folder_matches_its_model(tmp_path, "m.onnx")
    assert scales_of(target, np.ones((2, 1024), np.float32)) in {1.0, 2.0, 3.0, 4.0}


def test_killed_exports_leave_nothing_that_the_next_export_keeps(tmp_path):
    """SIGKILL at random points of exports racing each other; whatever they left, the next
    export leaves the folder with its model and exactly the data files it references."""
    target = tmp_path / "m.onnx"
    rng = random.Random(0)
    for _ in range(6):
        procs = [export_loop(1.0 + k, target, 1000) for k in range(2)]
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 0.4))
        for p in procs:
            p.send_signal(signal.SIGKILL)
        for p in procs:
            p.wait()
        if target.exists():  # a model left in place is whole, and its data is there
            folder_matches_its_model(tmp_path, "m.onnx", extra=set(os.listdir(tmp_path)) - {"m.onnx"})
            assert scales_of(target, np.ones((2, 1024), np.float32)) in {1.0, 2.0}
    fastseq.ONNXSequential(scale_model(5.0, shape=(2, 1024))).export(target, external_data=True)
    folder_matches_its_model(tmp_path, "m.onnx")
    assert scales_of(target, np.ones((2, 1024), np.float32)) == 5.0
    # An inline export over it removes the data files too.
    fastseq.ONNXSequential(scale_model(6.0, shape=(2, 1024))).export(target, external_data=False)
    assert os.listdir(tmp_path) == ["m.onnx"]


def test_exports_remove_only_files_that_exports_made(tmp_path):
    """Cleaning up is by an explicit name (`m.onnx.fastseq-<8 hex>.…`): a user's file that
    looks a bit like it, a date stamp say, is never taken for an orphan."""
    theirs = ["m.onnx.20261203.bak", "m.onnx.deadbeef.data", "m.onnx.fastseq-zzzzzzzz.data", "m.onnx.fastseq-1234.data"]
    for name in theirs:
        (tmp_path / name).write_bytes(b"user data")
    pipe = fastseq.ONNXSequential(scale_model(2.0, shape=(2, 1024)))
    for external in (True, True, False, True):
        pipe.export(tmp_path / "m.onnx", external_data=external)
        folder_matches_its_model(tmp_path, "m.onnx", extra=set(theirs))
    assert all((tmp_path / name).read_bytes() == b"user data" for name in theirs)


# --- external data that does not hold its tensor -------------------------------------


def with_entries(path: Path, **entries: str | None) -> None:
    """Sets (or with None removes) external_data entries of the model's first initializer."""
    model = onnx.load(str(path), load_external_data=False)
    t = model.graph.initializer[0]
    kept = {e.key: e.value for e in t.external_data}
    for k, v in entries.items():
        if v is None:
            kept.pop(k, None)
        else:
            kept[k] = v
    del t.external_data[:]
    for k, v in kept.items():
        t.external_data.add(key=k, value=v)
    onnx.save(model, str(path))


SHORT = {
    # case: (edit, bytes the file has there)
    "empty file": ("empty", 0),
    "offset at the end": ("offset", 0),
    "length smaller than the dims need": ("length", 8),
}


@pytest.mark.parametrize("case", list(SHORT))
def test_external_data_shorter_than_its_tensor_is_a_load_error(tmp_path, case):
    path = tmp_path / "m.onnx"
    save_external(scale_model(2.0, shape=(2, 256)), path, "m.bin")  # c: 256 floats, 1024 bytes
    edit, have = SHORT[case]
    if edit == "empty":
        (tmp_path / "m.bin").write_bytes(b"")
        with_entries(path, offset=None, length=None)
        pattern = (
            r"tensor 'c' \(float \[256\]\): external data of 1024 bytes at offset 0 lies past the end of 'm\.bin', "
            r"which has 0 bytes"
        )
    elif edit == "offset":
        with_entries(path, offset="1024", length=None)
        pattern = (
            r"tensor 'c' \(float \[256\]\): external data of 1024 bytes at offset 1024 lies past the end of "
            r"'m\.bin', which has 0 bytes there \(1024 bytes in all\)"
        )
    else:
        with_entries(path, offset="0", length=str(have))
        pattern = r"tensor 'c' \(float \[256\]\) needs 1024 bytes but its external data in 'm\.bin' has length 8"
    with pytest.raises(fastseq.LoadError, match=pattern):
        fastseq.compose([path])
    with pytest.raises(fastseq.LoadError, match=pattern):
        fastseq.ONNXSequential(path)
    with pytest.raises(fastseq.LoadError, match=pattern):
        fastseq.compose_to_file([path], tmp_path / "out.onnx", external_data="reuse")
    assert not (tmp_path / "out.onnx").exists()


def identity_model(tensor: onnx.TensorProto, opset: int = 21) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Identity", [tensor.name], ["y"])],
        "g",
        [],
        [helper.make_tensor_value_info("y", tensor.data_type, list(tensor.dims))],
        [tensor],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def packed(data_type: int, dims: list[int], raw: bytes) -> onnx.TensorProto:
    return onnx.TensorProto(name="q", data_type=data_type, dims=dims, raw_data=raw)


@pytest.mark.parametrize(
    "tensor,nbytes",
    [
        (packed(TensorProto.INT4, [5], b"\xe1\xc3\x05"), 3),  # 1, -2, 3, -4, 5: two a byte, rounded up
        (packed(TensorProto.UINT4, [2, 3], b"\x10\x32\xf4"), 3),
        (packed(TensorProto.FLOAT4E2M1, [3], b"\x21\x0c"), 2),  # 0.5, 1.0, -2.0
        (numpy_helper.from_array(np.zeros((0, 4), np.float32), "q"), 0),  # a zero-size dim
        (numpy_helper.from_array(np.arange(6, dtype=np.float16).reshape(2, 3), "q"), 12),
    ],
    ids=["int4", "uint4", "float4e2m1", "zero-size", "float16"],
)
def test_external_data_sizes_follow_dtype_and_dims(tmp_path, tensor, nbytes):
    path = tmp_path / "m.onnx"
    save_external(identity_model(tensor), path, "m.bin")
    assert (tmp_path / "m.bin").stat().st_size == nbytes
    reference = onnx.load(str(path))  # onnx's own loader, data read in
    merged = fastseq.compose([path])
    got, want = merged.graph.initializer[0], reference.graph.initializer[0]
    assert got.raw_data == want.raw_data
    np.testing.assert_array_equal(numpy_helper.to_array(got), numpy_helper.to_array(want))
    onnx.checker.check_model(merged)
    if nbytes:  # one byte less than the dims need is refused
        with_entries(path, length=str(nbytes - 1))
        with pytest.raises(
            fastseq.LoadError, match=f"needs {nbytes} bytes but its external data in 'm.bin' has length {nbytes - 1}"
        ):
            fastseq.compose([path])


def test_string_tensors_in_external_data_are_refused(tmp_path):
    path = tmp_path / "m.onnx"
    save_external(scale_model(2.0, shape=(2, 256)), path, "m.bin")
    model = onnx.load(str(path), load_external_data=False)
    model.graph.initializer[0].data_type = TensorProto.STRING
    onnx.save(model, str(path))
    with pytest.raises(fastseq.LoadError, match=r"tensor 'c' is a string tensor in external data 'm\.bin'"):
        fastseq.compose([path])


def test_inline_raw_data_of_the_wrong_size_is_a_load_error():
    """Found by fuzzing the export: such a tensor loaded, and exported with external data
    it gave a model that fastseq (and ONNX Runtime) then refused."""
    model = scale_model(2.0, shape=(2, 256))
    model.graph.initializer[0].raw_data = model.graph.initializer[0].raw_data[:8]
    with pytest.raises(
        fastseq.LoadError,
        match=r"tensor 'c' \(float \[256\]\) holds 8 bytes of raw_data but its type and dims need 1024",
    ):
        fastseq.compose([model])
    with pytest.raises(fastseq.LoadError, match="holds 8 bytes of raw_data"):
        fastseq.ONNXSequential(model.SerializeToString())


def test_a_tensor_both_inline_and_external_takes_its_file_in_every_mode(tmp_path):
    """Found by fuzzing: linked for `reuse`, such a tensor kept its inline bytes, and the
    export wrote those instead of linking its file."""
    save_external(scale_model(2.0, shape=(2, 256)), tmp_path / "m.onnx", "m.bin")
    model = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    model.graph.initializer[0].raw_data = np.full(256, 9.0, np.float32).tobytes()
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())  # onnx.save would move the bytes out
    x = np.ones((2, 256), np.float32)
    out = tmp_path / "out"
    out.mkdir()
    for mode in (True, "reuse"):
        fastseq.compose_to_file([tmp_path / "m.onnx"], out / "o.onnx", external_data=mode)
        np.testing.assert_array_equal(run_file(out / "o.onnx", x), np.full((2, 256), 2.0, np.float32))
    np.testing.assert_array_equal(fastseq.ONNXSequential(tmp_path / "m.onnx")(x)[0], np.full((2, 256), 2.0, np.float32))
