"""Pipeline.to_file (fastseq.graph.pipefile_write) through the core's writer: a user's file
beside it, a folder, links, threads, a full disk, a read-only target."""

from __future__ import annotations

import re
import subprocess
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest

import fastseq
import unprivileged
from conftest import scale_model, tmpfs
from fastseq import ops

X = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)


# --- Pipeline.to_file through the writer -----------------------------------------------------------------


def in_memory(folder: Path) -> fastseq.Pipeline:
    return fastseq.Pipeline({"a": onnx.load(folder / "a.onnx"), "sm": ops.softmax()}, edges=["a.y -> sm.input"])


def files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in path.iterdir() if p.is_file() and not p.is_symlink()}


def test_to_file_replaces_only_the_stage_files_it_wrote(folder):
    out = folder / "out"
    out.mkdir()
    pipe = in_memory(folder)
    pipe.to_file(out / "p.toml")
    first = files(out)
    assert sorted(first) == ["p.a.onnx", "p.toml"]  # the operator stays a builtin: string
    assert 'sm = "builtin:softmax?axis=-1&dtype=float32"' in first["p.toml"].decode()
    pipe.to_file(out / "p.toml")  # its own files, replaced
    assert files(out) == first
    np.testing.assert_allclose(fastseq.Pipeline.from_file(out / "p.toml")(X)[0], pipe(X)[0])
    (out / "q.a.onnx").write_bytes(b"the user's model")
    with pytest.raises(fastseq.ExportError) as info:
        pipe.to_file(out / "q.toml")
    assert str(info.value) == (
        f"cannot write {out / 'q.a.onnx'}: a file that fastseq did not write for q.toml is "
        "there; move it away or write q.toml elsewhere"
    )
    assert files(out) == {**first, "q.a.onnx": b"the user's model"}, "nothing written, nothing left"


def test_to_file_onto_a_folder_or_a_link(folder):
    out = folder / "out"
    out.mkdir()
    (out / "p.toml").mkdir()
    with pytest.raises(fastseq.ExportError, match=re.escape(f"cannot write {out / 'p.toml'}: it is a directory")):
        in_memory(folder).to_file(out / "p.toml")
    assert [p.name for p in out.iterdir()] == ["p.toml"], "no p.*.onnx left behind"
    victim = folder / "victim.toml"
    victim.write_text("# the user's\n")
    (out / "l.toml").symlink_to(victim)
    in_memory(folder).to_file(out / "l.toml")
    assert victim.read_text() == "# the user's\n" and not (out / "l.toml").is_symlink()
    (out / "k.a.onnx").symlink_to(folder / "a.onnx")
    with pytest.raises(fastseq.ExportError, match="a file that fastseq did not write for k.toml"):
        in_memory(folder).to_file(out / "k.toml")
    assert (out / "k.a.onnx").is_symlink() and not (out / "k.toml").exists()


def test_threads_writing_one_pipeline_file_leave_it_whole(folder):
    out = folder / "out"
    out.mkdir()
    pipe = in_memory(folder)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            for _ in range(5):
                pipe.to_file(out / "p.toml")
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=write) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sorted(p.name for p in out.iterdir()) == ["p.a.onnx", "p.toml"]
    np.testing.assert_allclose(fastseq.Pipeline.from_file(out / "p.toml")(X)[0], pipe(X)[0])


def test_to_file_on_a_full_disk_keeps_what_was_there(folder, tmp_path):
    big = fastseq.Pipeline(
        {"a": scale_model(2.0, shape=("N", 1 << 16)), "sm": ops.softmax()}, edges=["a.y -> sm.input"]
    )  # 256 KB of weights beside the file
    with tmpfs(tmp_path / "disk", "128k") as disk:
        (disk / "p.toml").write_text("# the last good one\n")
        with pytest.raises(
            fastseq.ExportError, match=re.escape(f"cannot write {disk / 'p.a.onnx'}: ") + "No space left on device"
        ):
            big.to_file(disk / "p.toml")
        assert files(disk) == {"p.toml": b"# the last good one\n"}


def test_to_file_refuses_a_read_only_pipeline_file_for_an_ordinary_user(folder):
    shared = unprivileged.shared_folder()
    try:
        target = shared / "p.toml"
        target.write_text("# the user's, read-only\n")
        target.chmod(0o444)
        scratch = unprivileged.writable_folder(shared / "scratch")
        warm = (
            "import onnx, fastseq\nfrom fastseq import ops\n"
            f"pipe = fastseq.Pipeline({{'a': onnx.load({str(folder / 'a.onnx')!r}), 'sm': ops.softmax()}}, "
            "edges=['a.y -> sm.input'])\n"
            f"pipe.to_file({str(scratch / 'w.toml')!r})\n"
        )
        code = unprivileged.printing_export_error(f"pipe.to_file({str(target)!r})")
        r = unprivileged.run(code, warm)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == f"cannot write {target}: it is read-only (Permission denied (os error 13))"
        assert target.read_text() == "# the user's, read-only\n" and sorted(p.name for p in shared.iterdir()) == [
            "p.toml",
            "scratch",
        ]
    finally:
        subprocess.run(["rm", "-rf", str(shared)], check=False)
