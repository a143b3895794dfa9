"""The session cache on real folders, real sessions and the CLI as a subprocess: it deletes
only its own, runs only what it stored (links, pipes, other users' files, files swapped during
loads), never fails a start (full disk), says what it holds and stays under its limit.

The tests run as root: "another user's" folder is one chowned to another uid."""

from __future__ import annotations

import fcntl
import json
import os
import pickle
import stat
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest

import fastseq
from conftest import fill, scale_model, tmpfs

TAG = "CACHEDIR.TAG"
X = np.linspace(-1, 1, 3 * 512, dtype=np.float32).reshape(3, 512)
OTHER_UID = 12345


def model_file(folder: Path, scale: float, name: str | None = None) -> str:
    """y = relu(x * scale) on [N, 512]: 2 KB of weights, so that the entry has a model.data."""
    path = folder / (name or f"scale{scale:g}.onnx")
    if not path.exists():
        onnx.save(scale_model(scale, shape=("N", 512)), str(path))
    return str(path)


def expected(scale: float) -> np.ndarray:
    return np.maximum(X * scale, 0)


def start(source, cache, **kwargs) -> fastseq.ONNXSequential:
    return fastseq.ONNXSequential(source, session_cache=cache, **kwargs)


def stored(tmp_path: Path, cache: Path, scale: float = 2.0) -> tuple[str, Path]:
    source = model_file(tmp_path, scale)
    pipe = start(source, cache)
    assert pipe.session_info["cache"] == "stored"
    return source, Path(pipe.session_info["entry"])


def uncached(source, cache, match: str) -> fastseq.ONNXSequential:
    """A start that must warn (``match``), not use the cache and still compute right."""
    with pytest.warns(RuntimeWarning, match=match):
        pipe = start(source, cache)
    assert pipe.session_info["cache"] is None
    return pipe


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fastseq", *args], capture_output=True, text=True, timeout=120, env=env
    )


def one_error_line(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastseq: error:"), out.stderr
    return lines[0]


def tree(folder: Path) -> dict[str, str]:
    """Every path under ``folder`` (links not followed) and what it is."""
    out = {}
    for p in sorted(folder.rglob("*")):
        kind = "link" if p.is_symlink() else "dir" if p.is_dir() else "file"
        out[str(p.relative_to(folder))] = kind + ("" if kind != "file" else f" {p.read_bytes()[:20]!r}")
    return out


# --- a cache that is private and marked --------------------------------------------------------
def test_a_new_cache_is_private_and_marked(tmp_path):
    cache = tmp_path / "cache"
    source, entry = stored(tmp_path, cache)
    assert start(source, cache).session_info["cache"] == "hit"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert "fastseq" in (cache / TAG).read_text() and (cache / TAG).read_text().startswith("Signature: 8a477f59")
    assert stat.S_IMODE(entry.stat().st_mode) == 0o700
    assert {p.name for p in entry.iterdir()} == {"model.onnx", "model.data", "manifest.json", "usage"}
    for p in entry.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    assert sorted(p.name for p in cache.iterdir()) == sorted([TAG, entry.name])  # no temporary folder left


def test_processes_making_the_cache_at_once_all_use_it(tmp_path):
    cache = tmp_path / "new" / "cache"
    code = textwrap.dedent(f"""
        import warnings, fastseq
        warnings.simplefilter("error")  # a start without the cache would warn
        pipe = fastseq.ONNXSequential({model_file(tmp_path, 2.0)!r}, session_cache={str(cache)!r})
        assert pipe.session_info["cache"] in ("stored", "hit")
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    assert "fastseq" in (cache / TAG).read_text()


def test_an_empty_folder_is_adopted_a_folder_of_other_files_is_not(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    source = model_file(tmp_path, 2.0)
    assert start(source, empty).session_info["cache"] == "stored"
    assert (empty / TAG).is_file()
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True, mode=0o700)
    project.chmod(0o700)
    (project / "src" / "main.py").write_text("print('mine')\n")
    pipe = uncached(source, project, "not a fastseq session cache")
    np.testing.assert_allclose(pipe(X)[0], expected(2.0))
    assert tree(project) == {"src": "dir", "src/main.py": "file b\"print('mine')\\n\""}


# --- clear deletes only its own -----------------------------------------------------------------
def test_clear_refuses_a_folder_that_is_not_a_cache(tmp_path):
    project = tmp_path / "project"
    for sub in ("src", "data"):
        (project / sub).mkdir(parents=True)
        (project / sub / "keep.txt").write_text(sub)
    before = tree(project)
    out = cli("cache", "clear", "--dir", str(project))
    assert "not a fastseq session cache" in one_error_line(out)
    assert tree(project) == before
    home = tmp_path / "home"
    (home / "Documents").mkdir(parents=True)
    (home / "Documents" / "thesis.tex").write_text("years of work")
    (home / "0123456789abcdef0123456789abcdef").mkdir()  # named like an entry, not one
    before = tree(home)
    for action in ("clear", "prune", "list"):
        out = cli("cache", action, env=dict(os.environ, FASTSEQ_SESSION_CACHE=str(home)))
        one_error_line(out)
    assert tree(home) == before


def test_clear_removes_only_what_fastseq_made_and_says_what(tmp_path):
    cache = tmp_path / "cache"
    _, entry = stored(tmp_path, cache)
    # Things in a real cache that fastseq did not make, or must not follow:
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("model.onnx", "model.data", "manifest.json"):
        (outside / name).write_text("the user's")
    (cache / "fedcba9876543210fedcba9876543210").symlink_to(outside, target_is_directory=True)
    mine = cache / "00000000000000000000000000000000"
    mine.mkdir()
    (mine / "manifest.json").write_text("{}")
    (mine / "notes.txt").write_text("an entry's name, not an entry's contents")
    (cache / "README").write_text("the user's")
    leftover = cache / ".tmp-999999-0123456789ab"  # what a killed store left
    leftover.mkdir(mode=0o700)
    (leftover / "model.data").write_bytes(b"\0" * 100)
    old = time.time() - 3600
    os.utime(leftover, (old, old))
    keep = {p: kind for p, kind in tree(cache).items() if not p.startswith((entry.name, leftover.name))}

    out = cli("cache", "clear", "--dir", str(cache), "--dry-run")
    assert out.returncode == 0, out.stderr
    assert f"would remove {entry}" in out.stdout and f"would remove {leftover}" in out.stdout
    assert "would remove 1 entry" in out.stdout and out.stdout.count("would remove ") == 3
    assert entry.exists() and leftover.exists()

    out = cli("cache", "clear", "--dir", str(cache))
    assert out.returncode == 0, out.stderr
    assert f"removed {entry}" in out.stdout and f"removed {leftover}" in out.stdout
    assert "removed 1 entry" in out.stdout and out.stdout.count("removed ") == 3
    assert tree(cache) == keep
    assert all((outside / n).read_text() == "the user's" for n in ("model.onnx", "model.data", "manifest.json"))


def test_cache_commands_never_follow_a_link_to_the_folder(tmp_path):
    cache = tmp_path / "cache"
    stored(tmp_path, cache)
    link = tmp_path / "link"
    link.symlink_to(cache, target_is_directory=True)
    before = tree(cache)
    for action in ("clear", "list"):
        assert "link" in one_error_line(cli("cache", action, "--dir", str(link)))
    assert tree(cache) == before
    pipe = uncached(model_file(tmp_path, 2.0), link, "not a folder")
    np.testing.assert_allclose(pipe(X)[0], expected(2.0))


def _killed_at(cache: Path, source: str, where: str, count: int) -> None:
    """``count`` real processes starting ``source`` at once, each killed with SIGKILL at
    ``where`` (``_seal``: a store, ONNX Runtime's files written; ``_Found.count_hit``: a
    hit, its links made and its session built)."""
    code = textwrap.dedent(f"""
        import os, signal, fastseq
        from fastseq.runtime import cache_entry
        owner, name = (cache_entry._Found, "count_hit") if {where!r} == "count_hit" else (cache_entry, "_seal")
        setattr(owner, name, lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL))
        fastseq.ONNXSequential({source!r}, session_cache={str(cache)!r})
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(count)]
    assert [p.wait(timeout=120) for p in procs] == [-9] * count


def test_temporary_folders_of_killed_writers_are_removed_by_later_writers(tmp_path):
    cache = tmp_path / "cache"
    source = model_file(tmp_path, 2.0)
    # A real writer killed after ONNX Runtime wrote the entry's files, before it was sealed.
    _killed_at(cache, source, "_seal", 1)
    (killed,) = [p for p in cache.iterdir() if p.name.startswith(".tmp-")]
    assert {p.name for p in killed.iterdir()} == {"model.onnx", "model.data"}
    old = time.time() - 3600
    fresh = cache / ".tmp-1-aaaaaaaaaaaa"  # a writer that has just started
    held = cache / ".tmp-2-bbbbbbbbbbbb"  # an old writer still at work: it holds its lock
    foreign = cache / ".tmp-someone-elses"  # not fastseq's pattern
    for folder in (fresh, held, foreign):
        folder.mkdir()
        (folder / "model.data").write_bytes(b"x")
    for folder in (killed, held, foreign):
        os.utime(folder, (old, old))
    lock = os.open(held, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        other = model_file(tmp_path, 3.0)
        assert start(other, cache).session_info["cache"] == "stored"  # a later writer sweeps
    finally:
        os.close(lock)
    assert not killed.exists()
    assert fresh.exists() and held.exists() and foreign.exists()


# --- a cache that runs only what it stored -----------------------------------------------------
@pytest.mark.parametrize("how", ["world-writable", "group-writable", "another user's"])
def test_a_root_that_is_not_private_is_not_used(tmp_path, how):
    cache = tmp_path / "cache"
    source, _ = stored(tmp_path, cache)
    if how == "another user's":
        os.chown(cache, OTHER_UID, -1)
    else:
        cache.chmod(0o777 if how == "world-writable" else 0o770)
    before = tree(cache)
    pipe = uncached(source, cache, "owned by another user" if how == "another user's" else "writable by")
    np.testing.assert_allclose(pipe(X)[0], expected(2.0))
    uncached(model_file(tmp_path, 3.0), cache, "not using it")  # nor is anything stored there
    assert tree(cache) == before


@pytest.mark.parametrize("what", ["entry", "model.onnx", "model.data"])
@pytest.mark.parametrize("how", ["writable by others", "another user's"])
def test_an_entry_that_is_not_private_is_not_used(tmp_path, what, how):
    cache = tmp_path / "cache"
    source, entry = stored(tmp_path, cache)
    target = entry if what == "entry" else entry / what
    if how == "another user's":
        os.chown(target, OTHER_UID, -1)
    else:
        target.chmod(0o777 if what == "entry" else 0o666)
    pipe = uncached(source, cache, "owned by another user" if how == "another user's" else "writable by")
    np.testing.assert_allclose(pipe(X)[0], expected(2.0))
    assert target.exists()  # not fastseq's to delete any more
    out = cli("cache", "list", "--dir", str(cache))
    assert "not used:" in out.stdout and ("owned by another user" in out.stdout or "writable by" in out.stdout)


@pytest.mark.parametrize("what", ["model.onnx", "model.data", "both", "entry"])
def test_links_in_an_entry_are_refused_never_followed(tmp_path, what):
    """An entry whose files are links to another model's entry ran the other model."""
    cache = tmp_path / "cache"
    source, entry = stored(tmp_path, cache, 2.0)
    _, other = stored(tmp_path, cache, 3.0)
    if what == "entry":
        for p in entry.iterdir():
            p.unlink()
        entry.rmdir()
        entry.symlink_to(other, target_is_directory=True)
    else:
        for name in ("model.onnx", "model.data") if what == "both" else (what,):
            (entry / name).unlink()
            (entry / name).symlink_to(other / name)
    pipe = uncached(source, cache, "link|not a regular file|not a folder")
    np.testing.assert_allclose(pipe(X)[0], expected(2.0))
    assert start(model_file(tmp_path, 3.0), cache).session_info["cache"] == "hit"  # the other is intact


def test_a_pipe_in_an_entry_does_not_hang_the_start(tmp_path):
    cache = tmp_path / "cache"
    source, entry = stored(tmp_path, cache)
    (entry / "model.data").unlink()
    os.mkfifo(entry / "model.data")
    code = textwrap.dedent(f"""
        import warnings, numpy as np, fastseq
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            pipe = fastseq.ONNXSequential({source!r}, session_cache={str(cache)!r})
        print(pipe.session_info["cache"], float(pipe(np.ones((3, 512), np.float32))[0].sum()))
        print(w[0].message)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    first, message = out.stdout.splitlines()
    assert first.split() == ["None", str(float(2 * 3 * 512))]
    assert "not a regular file" in message


@pytest.mark.parametrize("name", ["../../outside.onnx", "/etc/passwd", "sub/model.onnx", "notes.txt"])
def test_a_manifest_names_only_files_of_its_entry(tmp_path, name):
    cache = tmp_path / "cache"
    source, entry = stored(tmp_path, cache)
    outside = tmp_path / "outside.onnx"
    outside.write_bytes(b"not opened")
    manifest = json.loads((entry / "manifest.json").read_text())
    manifest["files"][name] = [10, "0" * 32]
    (entry / "manifest.json").write_text(json.dumps(manifest))
    pipe = uncached(source, cache, "names")
    np.testing.assert_allclose(pipe(X)[0], expected(2.0))
    assert outside.read_bytes() == b"not opened"


def test_weights_changed_in_an_entry_are_never_used(tmp_path):
    """One byte of the data file flipped, its size unchanged: ONNX Runtime may have loaded
    it while its digest was checked, but that session is dropped and the entry rebuilt."""
    cache = tmp_path / "cache"
    source, entry = stored(tmp_path, cache)
    raw = bytearray((entry / "model.data").read_bytes())
    raw[100] ^= 0x40
    (entry / "model.data").write_bytes(bytes(raw))
    pipe = start(source, cache)
    assert pipe.session_info["cache"] == "stored"
    np.testing.assert_allclose(pipe(X)[0], expected(2.0))
    assert start(source, cache).session_info["cache"] == "hit"


def test_a_hit_takes_its_own_copy_and_changed_sources_are_a_new_key(tmp_path):
    """A hit loads the entry while the pipeline's own copy of its weights is written beside
    it: once started, it no longer depends on its source file; a source rewritten with other
    weights of the same size is another key (a new entry), never the old entry's result."""
    cache, source, n = tmp_path / "cache", str(tmp_path / "wide.onnx"), 1 << 15  # 128 KB: left in the file
    x = np.linspace(-1, 1, 2 * n, dtype=np.float32).reshape(2, n)
    onnx.save(scale_model(2.0, shape=("N", n)), source)
    assert start(source, cache).session_info["cache"] == "stored"
    pipe = start(source, cache)
    assert pipe.session_info["cache"] == "hit" and pipe.session_info["copied"] == 4 * n
    before = pipe.model_bytes
    onnx.save(scale_model(3.0, shape=("N", n)), source)  # the same size, other weights
    np.testing.assert_allclose(pipe(x)[0], np.maximum(2 * x, 0))
    assert pipe.model_bytes == before
    np.testing.assert_allclose(pipe.as_cpu()(x)[0], np.maximum(2 * x, 0))  # a new session, from its copy
    assert pipe.session_info["cache"] == "hit"
    pipe.engine.composed.check_sources()  # it refers to no source file any more
    again = start(source, cache)
    assert again.session_info["cache"] == "stored"
    np.testing.assert_allclose(again(x)[0], np.maximum(3 * x, 0))


def second_digest_differs(monkeypatch):
    """``_core.model_digest`` as it is on its first call and different on later ones (a
    source rewritten between the key's read and the copy's): (the calls, the real one).
    Which call is first is decided when it is made: the key's digest and the copy's run on
    two threads, and the core releases the GIL while it reads, so counting the calls once
    the digest is back saw both as second now and then (both zeros: equal, and stored)."""
    import threading

    real, calls, lock = fastseq._core.model_digest, [], threading.Lock()

    def second_differs(model):
        with lock:
            calls.append(model)
            first = len(calls) == 1
        digest = real(model)
        return digest if first else "0" * len(digest)

    monkeypatch.setattr(fastseq._core, "model_digest", second_differs)
    return calls, real


def test_a_copy_that_differs_from_the_key_stores_nothing(tmp_path, monkeypatch):
    """The key and the copy read the sources apart; a source rewritten between the two in a
    way its identity check cannot see (the same size within one timestamp tick) would store
    the copy's weights under the old weights' key. The copy is read back against the key
    before an entry is stored: a difference fails the start and leaves no entry."""
    cache, source, n = tmp_path / "cache", str(tmp_path / "wide.onnx"), 1 << 15  # left in the file: mapped
    onnx.save(scale_model(2.0, shape=("N", n)), source)
    calls, real = second_digest_differs(monkeypatch)
    with pytest.raises(fastseq.LoadError, match="changed while the pipeline was built"):
        start(source, cache)
    assert len(calls) == 2
    assert not [p for p in cache.iterdir() if not p.name.startswith(".") and p.name != "CACHEDIR.TAG"]
    monkeypatch.setattr(fastseq._core, "model_digest", real)
    assert start(source, cache).session_info["cache"] == "stored"  # read back equal: stored


@pytest.mark.parametrize("hit", [True, False], ids=["hit", "miss"])
def test_a_copy_that_fails_fails_the_start(tmp_path, monkeypatch, hit):
    """The copy written beside a hit is the pipeline's: when it cannot be written the start
    fails with its error (no session over weights the pipeline does not hold; on a miss, no
    store's warning), and nothing is left in the temporary folder or the cache."""
    from fastseq.runtime import session

    cache = tmp_path / "cache"
    source, _ = stored(tmp_path, cache) if hit else (model_file(tmp_path, 2.0), None)
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(private))
    real = session.PrivateCopy.of

    def failing(models, *args, **kwargs):
        copy = real(models, *args, **kwargs)
        copy.__exit__()
        raise fastseq.LoadError("scale2.onnx: changed while it was copied")

    monkeypatch.setattr(session.PrivateCopy, "of", failing)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(fastseq.LoadError, match="scale2.onnx"):
            start(source, cache)
    assert os.listdir(private) == [] and not [p for p in cache.iterdir() if p.name.startswith(".")]
    monkeypatch.undo()
    assert start(source, cache).session_info["cache"] == ("hit" if hit else "stored")


def test_files_swapped_during_loads_never_change_what_runs(tmp_path):
    """A second process swaps the entry's data file for another model's (same size, renamed
    into place) and back, as fast as it can, while this one starts the pipeline again and
    again: what ONNX Runtime loads is always what was verified, so every start computes the
    pipeline's own result (before, 24 of 444 starts ran the swapped weights)."""
    cache = tmp_path / "cache"
    source, entry = stored(tmp_path, cache, 2.0)
    _, other = stored(tmp_path, cache, 3.0)
    stash = tmp_path / "stash"
    stash.mkdir()
    os.link(entry / "model.data", stash / "own.data")
    os.link(other / "model.data", stash / "swapped.data")
    stop = tmp_path / "stop"
    swapper = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import os
        entry, stash, stop = {str(entry)!r}, {str(stash)!r}, {str(stop)!r}
        n = 0
        while not os.path.exists(stop):
            for name in ("swapped.data", "own.data"):
                try:
                    os.link(os.path.join(stash, name), os.path.join(entry, ".swap"))
                    os.rename(os.path.join(entry, ".swap"), os.path.join(entry, "model.data"))
                    n += 1
                except OSError:
                    pass
        print(n)
    """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    how = {"hit": 0, "stored": 0, None: 0}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for _ in range(100):
                pipe = start(source, cache)
                how[pipe.session_info["cache"]] += 1
                np.testing.assert_allclose(pipe(X)[0], expected(2.0))
    finally:
        stop.touch()
        swaps = int(swapper.communicate(timeout=60)[0])
    assert swaps > 100 and how["hit"] > 10, (swaps, how)


def test_a_full_disk_is_a_warning_and_a_start_without_the_cache(tmp_path):
    with tmpfs(tmp_path / "small", "256k") as mount:
        cache = mount / "c"
        source = str(tmp_path / "big.onnx")
        onnx.save(scale_model(2.0, shape=("N", 131072)), source)  # 512 KB of weights: do not fit
        with pytest.warns(RuntimeWarning, match="could not store"):
            pipe = start(source, cache)
        assert pipe.session_info["cache"] is None
        x = np.ones((2, 131072), np.float32)
        np.testing.assert_allclose(pipe(x)[0], 2 * x)
        assert [p.name for p in cache.iterdir()] == [TAG]  # nothing half-written left


# --- a cache that says what it holds and stays bounded ------------------------------------------
def entry_bytes(entry: Path) -> int:
    return sum(p.stat().st_size for p in entry.iterdir())


def test_list_says_what_each_entry_is_for(tmp_path):
    cache = tmp_path / "cache"
    a, b = model_file(tmp_path, 2.0, "resize.onnx"), model_file(tmp_path, 3.0, "classify.onnx")
    fastseq.ONNXSequential(a, b, session_cache=cache)
    for _ in range(2):
        assert fastseq.ONNXSequential(a, b, session_cache=cache).session_info["cache"] == "hit"
    start(model_file(tmp_path, 5.0), cache)
    found = fastseq.SessionCache(cache).entries()
    assert [e["hits"] for e in found] == [2, 0]  # least recently used first
    chain = found[0]
    assert chain["labels"] == ["resize.onnx", "classify.onnx"] and chain["providers"] == ["CPUExecutionProvider"]
    assert chain["bytes"] == entry_bytes(cache / chain["key"]) and chain["created"] <= chain["used"] <= time.time()
    out = cli("cache", "list", "--dir", str(cache))
    assert out.returncode == 0, out.stderr
    assert "2 entries" in out.stdout and "limit 2.0 GB" in out.stdout
    lines = out.stdout.splitlines()
    at = next(k for k, ln in enumerate(lines) if chain["key"] in ln)
    line, stages = lines[at], lines[at + 1]
    assert "[CPU; onnxruntime" in line and "2 hits" in line and f"model {chain['model'][:12]}" in line
    assert "created 20" in line and "last used 20" in line
    assert stages.strip() == "resize.onnx -> classify.onnx", "the stages in full, on a line of their own"


def test_hits_are_counted_by_concurrent_processes(tmp_path):
    cache = tmp_path / "cache"
    source, entry = stored(tmp_path, cache)
    code = (
        f"import fastseq; assert fastseq.ONNXSequential({source!r}, session_cache={str(cache)!r})"
        ".session_info['cache'] == 'hit'"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    assert (entry / "usage").read_text().strip() == "4"


def test_least_recently_used_entries_are_evicted_to_fit_the_limit(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    a, entry_a = stored(tmp_path, cache, 2.0)
    size = entry_bytes(entry_a) + 40  # entries differ by a few bytes of manifest
    monkeypatch.setenv("FASTSEQ_SESSION_CACHE_MAX", str(int(2.5 * size)))
    _, entry_b = stored(tmp_path, cache, 3.0)
    time.sleep(0.05)  # "last used" is a file time
    assert start(a, cache).session_info["cache"] == "hit"  # a is now the more recently used
    _, entry_c = stored(tmp_path, cache, 4.0)
    assert entry_a.exists() and not entry_b.exists() and entry_c.exists()
    # The same through an argument, which wins over the variable.
    pipe = start(model_file(tmp_path, 5.0), fastseq.SessionCache(cache, max_size=int(1.5 * size)))
    assert [p.name for p in cache.iterdir() if p.name != TAG] == [Path(pipe.session_info["entry"]).name]


def test_an_entry_larger_than_the_limit_is_not_stored(tmp_path):
    cache = fastseq.SessionCache(tmp_path / "cache", max_size="1K")
    pipe = uncached(model_file(tmp_path, 2.0), cache, "larger than the cache's limit")
    np.testing.assert_allclose(pipe(X)[0], expected(2.0))
    assert [p.name for p in cache.path.iterdir()] == [TAG]


def test_an_entry_being_loaded_is_never_evicted(tmp_path):
    cache = tmp_path / "cache"
    _, entry = stored(tmp_path, cache, 2.0)
    reader = os.open(entry, os.O_RDONLY | os.O_DIRECTORY)  # what a loading process holds
    fcntl.flock(reader, fcntl.LOCK_SH)
    try:
        pipe = start(model_file(tmp_path, 3.0), fastseq.SessionCache(cache, max_size=entry_bytes(entry) + 100))
        assert pipe.session_info["cache"] == "stored" and entry.exists()
    finally:
        os.close(reader)
    pipe = start(model_file(tmp_path, 4.0), fastseq.SessionCache(cache, max_size=entry_bytes(entry) + 100))
    assert not entry.exists()


def test_concurrent_users_under_a_small_limit(tmp_path):
    """Three processes store five pipelines each into a cache that holds two, while a fourth
    starts one pipeline over and over: no start fails or computes wrong, the cache ends within
    its limit, and what is left is whole."""
    cache = tmp_path / "cache"
    source, entry = stored(tmp_path, cache, 1.0)
    limit = 2 * entry_bytes(entry) + 100
    for k in range(15):
        model_file(tmp_path, 10.0 + k)
    writer = textwrap.dedent(f"""
        import sys, warnings, numpy as np, fastseq
        warnings.simplefilter("error")  # no start may fall back to running uncached
        cache = fastseq.SessionCache({str(cache)!r}, max_size={limit})
        x = np.ones((3, 512), np.float32)
        for k in sys.argv[1:]:
            scale = float(k)
            pipe = fastseq.ONNXSequential({str(tmp_path)!r} + f"/scale{{scale:g}}.onnx", session_cache=cache)
            assert float(pipe(x)[0].sum()) == 3 * 512 * scale
    """)
    reader = textwrap.dedent(f"""
        import numpy as np, fastseq
        cache = fastseq.SessionCache({str(cache)!r}, max_size={limit})
        x = np.ones((3, 512), np.float32)
        for _ in range(15):
            assert float(fastseq.ONNXSequential({source!r}, session_cache=cache)(x)[0].sum()) == 3 * 512
    """)
    procs = [
        subprocess.Popen([sys.executable, "-c", writer, *(str(10 + k) for k in range(j, 15, 3))]) for j in range(3)
    ]
    procs.append(subprocess.Popen([sys.executable, "-c", reader]))
    assert [p.wait(timeout=300) for p in procs] == [0] * 4
    left = [p for p in cache.iterdir() if p.name != TAG]
    assert sum(entry_bytes(p) for p in left) <= limit
    for e in fastseq.SessionCache(cache).entries():
        assert not e["damaged"]


def test_prune_by_age_and_by_size(tmp_path):
    cache = tmp_path / "cache"
    _, old = stored(tmp_path, cache, 2.0)
    _, mid = stored(tmp_path, cache, 3.0)
    _, new = stored(tmp_path, cache, 4.0)
    for entry, days in ((old, 40), (mid, 10)):
        t = time.time() - days * 86400
        os.utime(entry / "manifest.json", (t, t))
    out = cli("cache", "prune", "--dir", str(cache), "--older-than", "30d", "--dry-run")
    assert out.returncode == 0 and f"would remove {old}" in out.stdout and old.exists()
    out = cli("cache", "prune", "--dir", str(cache), "--older-than", "30d")
    assert out.returncode == 0 and f"removed {old}" in out.stdout and "removed 1 entry" in out.stdout
    assert not old.exists() and mid.exists()
    out = cli("cache", "prune", "--dir", str(cache), "--max-size", str(entry_bytes(new) + 100))
    assert out.returncode == 0 and f"removed {mid}" in out.stdout
    assert not mid.exists() and new.exists()
    for bad in (["--max-size", "lots"], ["--older-than", "soon"]):
        assert "expected a" in one_error_line(cli("cache", "prune", "--dir", str(cache), *bad))
    assert "go with prune" in one_error_line(cli("cache", "clear", "--dir", str(cache), "--max-size", "1G"))
    assert new.exists()


def test_the_cache_and_its_limit_travel_with_a_pickled_pipeline(tmp_path):
    cache = fastseq.SessionCache(tmp_path / "cache", max_size="100M")
    pipe = start(model_file(tmp_path, 2.0), cache)
    clone = pickle.loads(pickle.dumps(pipe))
    assert clone.session_info["cache"] == "hit" and clone.portable()["session_cache"] == cache
    np.testing.assert_allclose(clone(X)[0], expected(2.0))
    assert repr(cache) == f"SessionCache({str(cache.path)!r}, max_size='100.0 MB')"
    with pytest.raises(fastseq.FastseqError, match="expected a size"):
        fastseq.SessionCache(tmp_path, max_size="huge")


def test_a_hit_whose_copy_differs_from_the_key_is_not_used(tmp_path, monkeypatch):
    """A hit is as safe as a store: the copy the pipeline keeps (``pipe.model``, exports) is
    read back against the key on a hit too. A copy that differs (a source rewritten between
    the key's read and the copy's, unseen by the identity checks) fails the start: no
    session over the entry's weights beside a pipeline that holds others."""
    cache, source, n = tmp_path / "cache", str(tmp_path / "wide.onnx"), 1 << 15  # left in the file: mapped
    onnx.save(scale_model(2.0, shape=("N", n)), source)
    assert start(source, cache).session_info["cache"] == "stored"
    calls, real = second_digest_differs(monkeypatch)
    with pytest.raises(fastseq.LoadError, match="changed while the pipeline was built"):
        start(source, cache)
    assert len(calls) == 2  # the key's read, and the copy's read back
    monkeypatch.setattr(fastseq._core, "model_digest", real)
    assert start(source, cache).session_info["cache"] == "hit"  # read back equal: used


def test_hits_run_what_the_pipeline_holds_while_a_source_changes_through_a_shared_mapping(tmp_path):
    """Another process rewrites a source's weights through a shared mapping as fast as it can
    (no size change; a page kept dirty gets no new mtime, so identity checks see nothing)
    while pipelines start from the cache: each start either fails with a LoadError or runs
    exactly what it holds (its result equals ONNX Runtime's on ``pipe.model``). Before, a
    hostile pass saw 21 of 23 hits run the entry's old weights beside a torn copy."""
    import onnxruntime as ort

    cache, n = tmp_path / "cache", 1 << 15
    source = tmp_path / "wide.onnx"
    onnx.save(scale_model(2.0, shape=("N", n)), str(source))
    assert start(str(source), cache).session_info["cache"] == "stored"
    two, three = np.full(n, 2.0, np.float32).tobytes(), np.full(n, 3.0, np.float32).tobytes()
    offset = source.read_bytes().find(two)
    assert offset > 0
    stop = tmp_path / "stop"
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import mmap, os
        fd = os.open({str(source)!r}, os.O_RDWR)
        m = mmap.mmap(fd, 0)
        two, three = {two[:4]!r} * {n}, {three[:4]!r} * {n}
        while not os.path.exists({str(stop)!r}):
            for k in range(0, {4 * n}, 4096):  # one page flipped and put back: mostly the stored weights
                m[{offset} + k:{offset} + k + 4096] = three[k:k + 4096]
                m[{offset} + k:{offset} + k + 4096] = two[k:k + 4096]
    """),
        ]
    )
    x = np.linspace(-1, 1, 2 * n, dtype=np.float32).reshape(2, n)
    results = {"hit": 0, "other": 0, "refused": 0}
    try:
        for _ in range(30):
            try:
                pipe = start(str(source), cache)
            except fastseq.LoadError as e:
                assert "changed" in str(e)
                results["refused"] += 1
                continue
            results["hit" if pipe.session_info["cache"] == "hit" else "other"] += 1
            held = ort.InferenceSession(pipe.model.SerializeToString(), providers=["CPUExecutionProvider"])
            np.testing.assert_array_equal(pipe(x)[0], held.run(None, {"x": x})[0])
    finally:
        stop.touch()
        writer.wait(timeout=30)
    assert sum(results.values()) == 30, results


# --- leftovers that no live process holds (issue 26, item 11) ----------------------------------
def test_a_disk_full_before_the_tag_leaves_no_temporary_file(tmp_path):
    """The tag is written to a temporary file and renamed into place: a full disk stopped
    that write and kept its `.tmp-<pid>-<hex>` file (two, with the second try to open the
    cache) for ever, since the sweep removed folders only. Now the failed write removes its
    file, and the sweep removes such a file that no live process holds. Needs root for the
    tmpfs."""
    source = model_file(tmp_path, 2.0)
    with tmpfs(tmp_path / "full", "64k") as mount:
        filler = fill(mount)
        cache = mount / "c"
        with pytest.warns(RuntimeWarning):
            pipe = start(source, cache)
        assert pipe.session_info["cache"] is None
        np.testing.assert_allclose(pipe(X)[0], expected(2.0))
        assert not cache.exists() or [p.name for p in cache.iterdir()] == [], "a temporary file was left"
        filler.unlink()
        # What an earlier version left: a tag's temporary file, its writer gone.
        old = time.time() - 3600
        cache.mkdir(mode=0o700, exist_ok=True)
        (cache / ".tmp-1-aaaaaaaaaaaa").write_bytes(b"Signature: 8a477f597d28d172789f0688")
        os.utime(cache / ".tmp-1-aaaaaaaaaaaa", (old, old))
        assert start(source, cache).session_info["cache"] == "stored"  # the cache is adopted, then swept
        assert sorted(p.name for p in cache.iterdir() if p.name.startswith(".")) == []


def test_a_killed_writers_folder_goes_as_soon_as_its_lock_is_free(tmp_path):
    """A killed store's folder stayed 10 minutes although its lock was free: the lock says
    whether its maker lives, and the age only covers the instant before the maker locks it.
    A folder half a minute old whose lock is free goes with the next store; one just made,
    or one still held, stays."""
    from fastseq.runtime import cachedir

    cache = tmp_path / "cache"
    source = model_file(tmp_path, 2.0)
    _killed_at(cache, source, "_seal", 1)
    (killed,) = [p for p in cache.iterdir() if p.name.startswith(".tmp-")]
    assert cachedir.STALE_S <= 10
    half_a_minute = time.time() - 30
    os.utime(killed, (half_a_minute, half_a_minute))
    held = cache / ".tmp-2-bbbbbbbbbbbb"
    held.mkdir()
    os.utime(held, (half_a_minute, half_a_minute))
    fresh = cache / f".tmp-{os.getpid()}-cccccccccccc"  # a live maker's: it may be about to lock it
    fresh.mkdir()
    lock = os.open(held, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        assert start(model_file(tmp_path, 3.0), cache).session_info["cache"] == "stored"
    finally:
        os.close(lock)
    assert not killed.exists() and held.exists() and fresh.exists()


def _temps(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if p.name.startswith((".tmp-", ".del-")))


def _runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_folders_of_killed_writers_and_readers_go_with_the_next_start(tmp_path):
    """Four writers killed mid-store, then two starts: their `.tmp-<pid>-<hex>` folders, a
    few seconds old, outlived the start that stored and the one that hit (issue 37, item 2):
    the sweep waited 10 s although their makers were dead, and a hit did not sweep. A
    temporary folder whose lock is free and whose maker no longer runs is garbage whatever
    its age; one whose lock is held stays whatever its name says, and so does one a live
    process has just made (it may be about to lock it)."""
    cache = tmp_path / "cache"
    source = model_file(tmp_path, 2.0)
    _killed_at(cache, source, "_seal", 4)
    killed = _temps(cache)  # (each writer's own store swept what those killed before it left)
    assert killed and not any(_runs(int(p.name.split("-")[1])) for p in killed)
    dead = killed[0].name.split("-")[1]
    held = cache / f".tmp-{dead}-bbbbbbbbbbbb"  # its maker's pid is gone, but someone holds the lock
    fresh = cache / f".tmp-{os.getpid()}-cccccccccccc"  # a live maker, about to lock it
    for folder in (held, fresh):
        folder.mkdir(mode=0o700)
        (folder / "model.data").write_bytes(b"x")
    lock = os.open(held, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        assert start(source, cache).session_info["cache"] == "stored"
        assert _temps(cache) == sorted([held, fresh])
        # Readers killed while they hold an entry's files linked into a folder of their own.
        _killed_at(cache, source, "count_hit", 2)
        assert len(_temps(cache)) > 2
        pipe = start(source, cache)
        assert pipe.session_info["cache"] == "hit"
        np.testing.assert_allclose(pipe(X)[0], expected(2.0))
        assert _temps(cache) == sorted([held, fresh])
    finally:
        os.close(lock)
    assert (held / "model.data").read_bytes() == b"x"


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_folder_swept_before_its_maker_locked_it_is_made_again(tmp_path, monkeypatch):
    """A sweep removes a free folder of a pid that does not run here at once, yet that pid may
    run in another pid namespace (a container sharing the folder), its maker between mkdir and
    flock: the maker finds its folder gone once locked and makes another, and a tag's
    temporary file swept so leaves the root marked by the sweeper, not a failed open."""
    from fastseq.runtime import cachedir

    cache = tmp_path / "cache"
    root = cachedir.Root.open(cache, create=True)
    real = cachedir.fcntl.flock
    swept = []

    def flock_after_a_sweep(fd, op):
        if not swept:  # the first lock taken comes after another process removed the folder
            name = os.readlink(f"/proc/self/fd/{fd}").rsplit("/", 1)[1].removesuffix(" (deleted)")
            swept.append(name)
            os.rmdir(cache / name)
        return real(fd, op)

    monkeypatch.setattr(cachedir.fcntl, "flock", flock_after_a_sweep)
    with root, root.temp() as temp:
        assert swept and temp.path.name != swept[0] and temp.path.is_dir()
        (Path(temp.name("model.onnx"))).write_bytes(b"x")  # usable: not a removed folder
    assert _temps(cache) == []

    other = tmp_path / "other"
    other.mkdir(mode=0o700)

    def tag_swept(fd, op):
        if not swept[1:]:  # the sweeper (which had opened the marked root) took the file
            name = os.readlink(f"/proc/self/fd/{fd}").rsplit("/", 1)[1]
            swept.append(name)
            os.unlink(other / name)
            (other / TAG).write_text(cachedir.TAG_TEXT)
        return real(fd, op)

    monkeypatch.setattr(cachedir.fcntl, "flock", tag_swept)
    with cachedir.Root.open(other, create=True):
        pass
    assert swept[1:] and sorted(p.name for p in other.iterdir()) == [TAG]


def test_a_sweep_never_empties_a_folder_sealed_while_it_looked(tmp_path, monkeypatch):
    """A maker seals its folder (renames it to the entry's name) and lets go of its lock
    between the sweep's open and its lock: the sweep held the entry then, and emptied it. The
    name must still be the folder's once locked."""
    from fastseq.runtime import cachedir

    cache = tmp_path / "cache"
    folder = cache / f".tmp-{_dead_pid()}-dddddddddddd"
    entry = cache / ("e" * 32)
    with cachedir.Root.open(cache, create=True) as root:
        folder.mkdir(mode=0o700)
        for name in ("model.onnx", "manifest.json"):
            (folder / name).write_bytes(b"x")
        old = time.time() - 3600
        os.utime(folder, (old, old))
        real = cachedir.try_lock

        def sealed_first(fd, shared=False):
            if folder.exists():
                folder.rename(entry)
            return real(fd, shared)

        monkeypatch.setattr(cachedir, "try_lock", sealed_first)
        assert root.sweep() == []
    assert sorted(p.name for p in entry.iterdir()) == ["manifest.json", "model.onnx"]
