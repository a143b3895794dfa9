"""A session-cache hit of a pipeline that needs opset conversion converts nothing and never
imports onnx: converted stages are kept in the session cache under what the conversion read
(the stage without its large weights), what it did and the converter; a source changed
afterwards is a miss where the change reaches the conversion, and the session's own key
still covers the weights. Real files, real caches, fresh processes."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import fastseq
from conftest import all_at_once
from fastseq import ops
from fastseq.runtime.cache import SessionCache

START = """
import json, sys
import numpy as np
import fastseq
from fastseq import ops
model, cache, out = sys.argv[1:4]
pipe = fastseq.ONNXSequential(ops.resize(16, antialias=True), ops.normalize(), model,
                              auto_ir_version_conversion=True, session_cache=cache)
x = np.random.default_rng(0).random((2, 3, 24, 24), dtype=np.float32)
np.save(out, pipe(x)[0])
print(json.dumps({"cache": pipe.session_info["cache"], "onnx": "onnx" in sys.modules}))
"""


def conv_model(path: Path, scale: float = 1.0, bias: float = 0.0) -> Path:
    """A Conv at opset 17 (ops.resize with antialias needs 18: the pipeline converts it): its
    weight is 1,728 bytes (kept out of the conversion's copy), its bias 64 (kept in it)."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array((rng.standard_normal((16, 3, 3, 3)) * scale).astype(np.float32), "w")
    b = numpy_helper.from_array(np.full(16, bias, np.float32), "b")
    g = helper.make_graph(
        [helper.make_node("Conv", ["input", "w", "b"], ["features"], pads=[1, 1, 1, 1])],
        "conv",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 16, "H", "W"])],
        [w, b],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def start(model: Path, cache: Path, out: Path) -> dict:
    """The pipeline started in a fresh process: how it started, and whether onnx was loaded."""
    r = subprocess.run(
        [sys.executable, "-c", START, str(model), str(cache), str(out)], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


X = np.random.default_rng(0).random((2, 3, 24, 24), dtype=np.float32)  # START's input too


def build(model: Path, cache: Path | bool) -> fastseq.ONNXSequential:
    """START's pipeline, built in this process."""
    return fastseq.ONNXSequential(
        ops.resize(16, antialias=True),
        ops.normalize(),
        str(model),
        auto_ir_version_conversion=True,
        session_cache=cache,
    )


def warned(model: Path, cache: Path) -> tuple[fastseq.ONNXSequential, list[str]]:
    """START's pipeline built here, with the warnings its start gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pipe = build(model, cache)
    return pipe, [str(w.message) for w in caught]


def expected(model: Path) -> np.ndarray:
    """What the pipeline computes, built here without any cache."""
    return build(model, False)(X)[0]


def converted_entries(cache: Path) -> list[dict]:
    return [e for e in SessionCache(cache).entries() if e.get("kind") == "converted stage"]


def test_a_hit_converts_nothing_and_never_imports_onnx(tmp_path):
    model, cache = conv_model(tmp_path / "conv.onnx"), tmp_path / "cache"
    cold = start(model, cache, tmp_path / "cold.npy")
    assert cold == {"cache": "stored", "onnx": True}
    hit = start(model, cache, tmp_path / "hit.npy")
    assert hit == {"cache": "hit", "onnx": False}
    np.testing.assert_array_equal(np.load(tmp_path / "hit.npy"), np.load(tmp_path / "cold.npy"))
    np.testing.assert_allclose(np.load(tmp_path / "hit.npy"), expected(model), rtol=1e-5, atol=1e-5)
    # normalize (opset 17) and the Conv were converted; resize (18) was not. Listed as such.
    kept = converted_entries(cache)
    assert sorted(e["labels"][0] for e in kept) == [
        "conv.onnx (converted to ai.onnx 18)",
        "normalize (#1) (converted to ai.onnx 18)",
    ]
    assert not any(e["damaged"] for e in kept) and {e["onnx"] for e in kept} == {onnx.__version__}
    assert all(e["hits"] == 1 for e in kept)


def test_a_source_changed_afterwards_is_a_miss_and_runs_what_it_says(tmp_path):
    model, cache = conv_model(tmp_path / "conv.onnx"), tmp_path / "cache"
    start(model, cache, tmp_path / "first.npy")
    # A small tensor changed: the conversion's copy differs, so it converts again.
    conv_model(model, bias=0.5)
    changed = start(model, cache, tmp_path / "bias.npy")
    assert changed == {"cache": "stored", "onnx": True}
    np.testing.assert_allclose(np.load(tmp_path / "bias.npy"), expected(model), rtol=1e-5, atol=1e-5)
    # Only the large weight changed: the converted stage is reused (it never held the
    # weight), and the session's key, which covers the weights, misses.
    conv_model(model, scale=2.0, bias=0.5)
    weights = start(model, cache, tmp_path / "weights.npy")
    assert weights == {"cache": "stored", "onnx": False}
    np.testing.assert_allclose(np.load(tmp_path / "weights.npy"), expected(model), rtol=1e-5, atol=1e-5)
    assert not np.allclose(np.load(tmp_path / "weights.npy"), np.load(tmp_path / "bias.npy"))


def test_a_damaged_converted_stage_is_never_used_and_is_rebuilt(tmp_path):
    model, cache = conv_model(tmp_path / "conv.onnx"), tmp_path / "cache"
    start(model, cache, tmp_path / "first.npy")
    for entry in converted_entries(cache):
        path = cache / entry["key"] / "model.onnx"
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    again = start(model, cache, tmp_path / "again.npy")
    assert again["onnx"]  # converted again
    np.testing.assert_array_equal(np.load(tmp_path / "again.npy"), np.load(tmp_path / "first.npy"))
    assert len(converted_entries(cache)) == 2
    assert start(model, cache, tmp_path / "third.npy") == {"cache": "hit", "onnx": False}


def test_a_converted_stage_that_is_a_link_is_refused_and_the_stage_converted(tmp_path):
    model, cache = conv_model(tmp_path / "conv.onnx"), tmp_path / "cache"
    start(model, cache, tmp_path / "first.npy")
    entry = converted_entries(cache)[0]
    path = cache / entry["key"] / "model.onnx"
    (tmp_path / "elsewhere.onnx").write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere.onnx")
    pipe, said = warned(model, cache)
    assert any("not a regular file" in m for m in said), said
    np.testing.assert_array_equal(pipe(X)[0], np.load(tmp_path / "first.npy"))
    assert path.is_symlink()  # a foreign entry is left for its owner


def test_converted_stages_are_kept_only_with_a_session_cache_and_the_key_names_the_converter(tmp_path, monkeypatch):
    from fastseq.graph import convert

    model = conv_model(tmp_path / "conv.onnx")
    monkeypatch.delenv("FASTSEQ_SESSION_CACHE", raising=False)
    monkeypatch.setenv("FASTSEQ_CACHE", str(tmp_path / "home"))
    fastseq.ONNXSequential(ops.normalize(), str(model), ops.resize(16, antialias=True), auto_ir_version_conversion=True)
    assert not (tmp_path / "home").exists()
    parts = convert._converter()
    assert parts == {
        "onnx": onnx.__version__,
        "converter": __import__("hashlib").sha256(Path(convert.__file__).read_bytes()).hexdigest(),
    }
    # What the key's naming does: another converter's entries are not this one's.
    cache = tmp_path / "cache"
    build = lambda: fastseq.ONNXSequential(  # noqa: E731
        ops.normalize(),
        str(model),
        ops.resize(16, antialias=True),
        auto_ir_version_conversion=True,
        session_cache=cache,
    )
    build()
    kept = len(converted_entries(cache))
    build()
    assert kept and len(converted_entries(cache)) == kept  # the same converter: hits
    monkeypatch.setattr(convert, "_converter", lambda: {**parts, "converter": "another"})
    build()
    assert len(converted_entries(cache)) == 2 * kept  # another converter: converted again, kept apart


def test_cache_list_shows_converted_stages(tmp_path):
    model, cache = conv_model(tmp_path / "conv.onnx"), tmp_path / "cache"
    start(model, cache, tmp_path / "first.npy")
    r = subprocess.run(
        [sys.executable, "-m", "fastseq", "cache", "list", "--dir", str(cache)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "conv.onnx (converted to ai.onnx 18)" in r.stdout and "damaged" not in r.stdout


# --- hostile: a full disk, a read-only cache, two writers at once ------------------------------
def test_a_full_disk_keeps_no_converted_stage_and_leaves_nothing_behind(tmp_path):
    """Keeping a converted stage on a full disk is a warning, never a failed start or a wrong
    result, and leaves no temporary file. Needs root for the tmpfs."""
    from conftest import fill, tmpfs

    model = conv_model(tmp_path / "conv.onnx")
    with tmpfs(tmp_path / "full", "256k") as mount:
        cache = mount / "c"
        cache.mkdir(mode=0o700)
        fill(mount)
        pipe, said = warned(model, cache)
        assert any("session cache" in m for m in said), said
        np.testing.assert_array_equal(pipe(X)[0], expected(model))
        assert [p.relative_to(cache).as_posix() for p in cache.rglob("*")] == []  # nothing kept, nothing left


def test_a_read_only_cache_still_starts_right(tmp_path):
    """A cache remounted read-only after it kept the stages: the start computes what the
    pipeline computes, whether it reads the entries or converts again. Needs root."""
    from conftest import tmpfs

    model = conv_model(tmp_path / "conv.onnx")
    with tmpfs(tmp_path / "ro", "64m") as mount:
        cache = mount / "c"
        assert start(model, cache, tmp_path / "cold.npy")["cache"] == "stored"
        kept = sorted(p.name for p in cache.rglob("*"))
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        try:
            again = start(model, cache, tmp_path / "again.npy")
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(mount)], check=True)
        np.testing.assert_array_equal(np.load(tmp_path / "again.npy"), np.load(tmp_path / "cold.npy"))
        assert sorted(p.name for p in cache.rglob("*")) == kept
        assert again["cache"] in ("hit", None)


def test_two_processes_converting_at_once_keep_one_entry_per_stage(tmp_path):
    """Two fresh processes start the same pipeline on an empty cache at once: both compute
    the pipeline's result, each converted stage is kept once, and a third start is a hit
    that converts nothing."""
    model, cache = conv_model(tmp_path / "conv.onnx"), tmp_path / "cache"
    starts = [[sys.executable, "-c", START, str(model), str(cache), str(tmp_path / f"{k}.npy")] for k in range(2)]
    all_at_once(starts, timeout=300)
    want = expected(model)
    for k in range(2):
        np.testing.assert_allclose(np.load(tmp_path / f"{k}.npy"), want, rtol=1e-5, atol=1e-5)
    assert sorted(e["labels"][0] for e in converted_entries(cache)) == [
        "conv.onnx (converted to ai.onnx 18)",
        "normalize (#1) (converted to ai.onnx 18)",
    ]
    assert start(model, cache, tmp_path / "third.npy") == {"cache": "hit", "onnx": False}
