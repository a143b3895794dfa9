"""A session through the session cache (fastseq.runtime.cache_entry), from ONNXSequential:
stored, then hit in a fresh process; a miss on every part of the key; damaged entries
rebuilt, never loaded; concurrent writers; a read-only cache; the cache from the
environment and the CLI; a pickled pipeline keeping its cache. What the cache trusts, says
and evicts is test_cache.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import fastseq
from conftest import scale_model, tmpfs
from runtime.models import X, chain, reference


# --- the session cache ------------------------------------------------------------------------
def test_cache_stores_then_hits_in_a_fresh_process(tmp_path):
    paths = chain(tmp_path)
    cache = tmp_path / "cache"
    pipe = fastseq.ONNXSequential(*paths, session_cache=cache)
    assert pipe.session_info["cache"] == "stored"
    entry = Path(pipe.session_info["entry"])
    assert {p.name for p in entry.iterdir()} >= {"model.onnx", "manifest.json"}
    code = textwrap.dedent(f"""
        import numpy as np, fastseq
        pipe = fastseq.ONNXSequential(*{paths!r}, session_cache={str(cache)!r})
        print(pipe.session_info["cache"], float(pipe(np.ones((3, 4), np.float32))[0].sum()))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "hit" and float(out[1]) == pytest.approx(reference(np.ones((3, 4))).sum())
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]


def test_cache_misses_on_every_key_part(tmp_path, monkeypatch):
    paths = chain(tmp_path)
    cache = tmp_path / "cache"
    fastseq.ONNXSequential(*paths, session_cache=cache)
    other_model = [paths[0], str(tmp_path / "m0.onnx")]
    assert fastseq.ONNXSequential(*other_model, session_cache=cache).session_info["cache"] == "stored"
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert (
        fastseq.ONNXSequential(*paths, session_cache=cache, session_options=options).session_info["cache"] == "stored"
    )
    with_opts = [("CPUExecutionProvider", {"arena_extend_strategy": "kSameAsRequested"})]
    assert fastseq.ONNXSequential(*paths, session_cache=cache, providers=with_opts).session_info["cache"] == "stored"
    monkeypatch.setattr(ort, "__version__", "0.0.1")
    assert fastseq.ONNXSequential(*paths, session_cache=cache).session_info["cache"] == "stored"
    monkeypatch.undo()
    assert fastseq.ONNXSequential(*paths, session_cache=cache).session_info["cache"] == "hit"
    assert len([p for p in cache.iterdir() if p.name != "CACHEDIR.TAG"]) == 5


@pytest.mark.parametrize("damage", ["truncate-data", "flip-model", "foreign", "no-manifest-files"])
def test_damaged_entries_are_rebuilt_never_loaded(tmp_path, damage):
    big = scale_model(2.0, shape=("N", 512))  # 2 KB of weights: in model.data
    cache = tmp_path / "cache"
    pipe = fastseq.ONNXSequential(big, session_cache=cache)
    entry = Path(pipe.session_info["entry"])
    manifest = json.loads((entry / "manifest.json").read_text())
    if damage == "truncate-data":
        data = entry / "model.data"
        assert data.exists()
        data.write_bytes(data.read_bytes()[:100])
    elif damage == "flip-model":
        raw = bytearray((entry / "model.onnx").read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        (entry / "model.onnx").write_bytes(bytes(raw))
    elif damage == "foreign":
        manifest["key"]["model"] = "0" * 32
        (entry / "manifest.json").write_text(json.dumps(manifest))
    else:
        (entry / "manifest.json").write_text("{")
    again = fastseq.ONNXSequential(big, session_cache=cache)
    assert again.session_info["cache"] == "stored"
    x = np.ones((3, 512), np.float32)
    np.testing.assert_allclose(again(x)[0], np.full((3, 512), 2.0))
    assert fastseq.ONNXSequential(big, session_cache=cache).session_info["cache"] == "hit"


def test_concurrent_writers_leave_one_whole_entry(tmp_path):
    paths = chain(tmp_path)
    cache = tmp_path / "cache"
    code = textwrap.dedent(f"""
        import numpy as np, fastseq
        pipe = fastseq.ONNXSequential(*{paths!r}, session_cache={str(cache)!r})
        print(pipe.session_info["cache"], float(pipe(np.ones((3, 4), np.float32))[0].sum()))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [p.communicate()[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert {o[0] for o in outs} <= {"stored", "hit"}
    assert all(float(o[1]) == pytest.approx(reference(np.ones((3, 4))).sum()) for o in outs)
    entries = [p.name for p in cache.iterdir() if p.name != "CACHEDIR.TAG"]
    assert len(entries) == 1 and len(entries[0]) == 32
    assert fastseq.ONNXSequential(*paths, session_cache=cache).session_info["cache"] == "hit"


def test_read_only_cache_folder(tmp_path):
    with tmpfs(tmp_path / "ro", "4m") as mount:
        paths = chain(tmp_path)
        other = [str(tmp_path / "m1.onnx")]
        cache = mount / "c"  # a tmpfs's own root is writable by all (1777): not a cache fastseq uses
        fastseq.ONNXSequential(*paths, session_cache=cache)
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        # Entries already there are used; new ones cannot be stored: a warning, and a session.
        assert fastseq.ONNXSequential(*paths, session_cache=cache).session_info["cache"] == "hit"
        with pytest.warns(RuntimeWarning, match="not writable|could not store"):
            pipe = fastseq.ONNXSequential(*other, session_cache=cache)
        assert pipe.session_info["cache"] is None
        np.testing.assert_allclose(pipe(X)[0], np.maximum(3 * X, 0))


def test_cache_from_the_environment_and_the_cli(tmp_path, monkeypatch):
    paths = chain(tmp_path)
    cache = tmp_path / "envcache"
    monkeypatch.setenv("FASTSEQ_SESSION_CACHE", str(cache))
    assert fastseq.ONNXSequential(*paths).session_info["cache"] == "stored"
    assert fastseq.ONNXSequential(*paths, session_cache=False).session_info.get("cache") is None
    env = dict(os.environ, FASTSEQ_SESSION_CACHE=str(cache))
    out = subprocess.run([sys.executable, "-m", "fastseq", "cache", "list"], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and "1 entr" in out.stdout, out.stdout + out.stderr
    out = subprocess.run([sys.executable, "-m", "fastseq", "cache", "clear"], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and "removed 1" in out.stdout
    assert [p.name for p in cache.iterdir()] == ["CACHEDIR.TAG"]  # the mark stays: it is still a cache


def test_pickled_pipeline_keeps_its_cache(tmp_path):
    import pickle

    pipe = fastseq.ONNXSequential(*chain(tmp_path), session_cache=tmp_path / "c")
    clone = pickle.loads(pickle.dumps(pipe))
    assert clone.session_info["cache"] == "hit"
    np.testing.assert_allclose(clone(X)[0], reference(X))
