"""External data: read in place, written beside, linked with "reuse", and untrusted."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

import fastseq
from conftest import scale_model, set_external_location

N = 1024  # initializer of N float32: 4 KB, over the external-data threshold


def save_external(model: onnx.ModelProto, path, location: str) -> None:
    onnx.save(model, str(path), save_as_external_data=True, location=location, size_threshold=0)


def run_file(path, x):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.fixture
def two_external(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    save_external(scale_model(2.0, shape=(2, N)), src / "a.onnx", "a.bin")
    save_external(scale_model(3.0, shape=(2, N)), src / "b.onnx", "b.bin")
    return src


def test_external_inputs_are_read_in_place_and_written_inline_or_beside(two_external, tmp_path):
    x = np.ones((2, N), np.float32)
    merged = fastseq.compose([two_external / "a.onnx", two_external / "b.onnx"])
    assert all(t.data_location == TensorProto.DEFAULT and t.raw_data for t in merged.graph.initializer)
    out = fastseq.compose_to_file(
        [two_external / "a.onnx", two_external / "b.onnx"], tmp_path / "m.onnx", external_data=True
    )
    np.testing.assert_allclose(run_file(out, x), 6.0)


def test_reuse_links_the_source_data_files_instead_of_copying(two_external, tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = fastseq.compose_to_file(
        [two_external / "a.onnx", two_external / "b.onnx"], out_dir / "m.onnx", external_data="reuse"
    )
    model = onnx.load(str(out), load_external_data=False)
    locations = sorted({e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"})
    assert len(locations) == 2 and all(loc.startswith("m.onnx.") for loc in locations)
    # Hard links: the same inodes as the sources, no bytes copied. (onnx.checker refuses
    # hard-linked data as a potential attack; ONNX Runtime loads it.)
    assert {os.stat(out_dir / loc).st_ino for loc in locations} == {
        os.stat(two_external / "a.bin").st_ino,
        os.stat(two_external / "b.bin").st_ino,
    }
    np.testing.assert_allclose(run_file(out, np.ones((2, N), np.float32)), 6.0)


@pytest.mark.parametrize("location", ["/etc/passwd", "../secret.bin", "sub/../../secret.bin", ""])
def test_locations_outside_the_model_folder_are_refused(tmp_path, location):
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "secret.bin").write_bytes(b"\0" * 4 * N)
    save_external(scale_model(2.0, shape=(2, N)), folder / "m.onnx", "m.bin")
    set_external_location(folder / "m.onnx", location)
    with pytest.raises(fastseq.LoadError, match="external data location .* is refused|has no location"):
        fastseq.compose([folder / "m.onnx"])


def test_symlink_escaping_the_folder_is_refused(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    save_external(scale_model(2.0, shape=(2, N)), folder / "m.onnx", "m.bin")
    (tmp_path / "outside.bin").write_bytes((folder / "m.bin").read_bytes())
    (folder / "m.bin").unlink()
    (folder / "m.bin").symlink_to(tmp_path / "outside.bin")
    with pytest.raises(fastseq.LoadError, match="resolves outside the model's folder"):
        fastseq.compose([folder / "m.onnx"])
    # A link that stays inside the folder is fine.
    (folder / "real.bin").write_bytes((tmp_path / "outside.bin").read_bytes())
    (folder / "m.bin").unlink()
    (folder / "m.bin").symlink_to(folder / "real.bin")
    fastseq.compose([folder / "m.onnx"])


@pytest.mark.parametrize("offset,length", [(0, 10 * N), (8 * N, 4), (2**63, 4), ("x", 4)])
def test_offsets_and_lengths_past_the_file_are_refused(tmp_path, offset, length):
    save_external(scale_model(2.0, shape=(2, N)), tmp_path / "m.onnx", "m.bin")
    model = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    t = model.graph.initializer[0]
    del t.external_data[:]
    for k, v in [("location", "m.bin"), ("offset", str(offset)), ("length", str(length))]:
        t.external_data.add(key=k, value=v)
    onnx.save(model, str(tmp_path / "m.onnx"))
    with pytest.raises(fastseq.LoadError, match="past the end|not a number"):
        fastseq.compose([tmp_path / "m.onnx"])
    with pytest.raises(fastseq.LoadError, match="past the end|not a number"):
        fastseq.compose_to_file([tmp_path / "m.onnx"], tmp_path / "o.onnx", external_data="reuse")


def test_external_model_given_as_bytes_says_to_pass_a_path(tmp_path):
    save_external(scale_model(2.0, shape=(2, N)), tmp_path / "m.onnx", "m.bin")
    with pytest.raises(fastseq.LoadError, match="pass it as a path"):
        fastseq.compose([(tmp_path / "m.onnx").read_bytes()])
