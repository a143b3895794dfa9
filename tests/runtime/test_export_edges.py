"""Targets at the edges of what a file system takes, on every writer path (issue 26, items 10
and 12): a legal name of up to 255 bytes (the writer's temporary names used to add 28), a
name that is not UTF-8 (onnx's and ONNX Runtime's bindings take UTF-8 only), a ``location``
whose folder is a link out of the model's folder, a missing folder (the optimised export
made it where the other paths refuse), and a full disk under ONNX Runtime's own write of the
optimised model (a raw onnxruntime Fail, which the CLI called a bug in fastseq)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import fastseq
from conftest import tmpfs
from runtime.test_export import FORMATS, KINDS, expected, matmul_model, outputs, referenced, write

SUFFIX = {"textproto": ".txtpb", "json_external": ".json"}
#: every path that writes a model file: test_export.py's and the core's plain exports
ALL = ["inline", "external_data", *KINDS]


def write_any(kind: str, scale: float, target: Path) -> None:
    if kind == "inline":
        fastseq.ONNXSequential(matmul_model(scale)).export(target)
    elif kind == "external_data":
        fastseq.ONNXSequential(matmul_model(scale)).export(target, external_data=True)
    else:
        write(kind, scale, target)


def sources(folder: Path) -> Path:
    """The folder to write into, with `fastseq merge`'s sources beside it."""
    (folder / "src").mkdir(exist_ok=True)
    for scale in (1.0, 2.0):
        onnx.save(matmul_model(scale), folder / "src" / f"s{scale:g}.onnx")
    out = folder / "out"
    out.mkdir(exist_ok=True)
    return out


def long_name(kind: str, length: int) -> str:
    suffix = SUFFIX.get(kind, ".onnx")
    return "m" * (length - len(suffix)) + suffix


def computes(kind: str, target: Path, scale: float, tmp_path: Path) -> None:
    np.testing.assert_allclose(outputs(kind, target), expected(kind, scale, tmp_path / "ref"), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ALL)
def test_a_name_of_the_longest_legal_length_is_written_on_every_path(kind, tmp_path):
    """A model file of 255 bytes where it holds its weights, and of 250 where a data file
    ``<name>.data`` goes beside it (the longest that data file's name may be): written, and
    written again over itself (the second write puts its data under a token name first)."""
    out = sources(tmp_path)
    inline = kind in ("inline", "textproto")
    target = out / long_name(kind, 255 if inline else 250)
    for scale in (1.0, 2.0):
        write_any(kind, scale, target)
        computes(kind, target, scale, tmp_path)
        data = (
            set() if inline else referenced(onnx.load(str(target), format=FORMATS.get(kind), load_external_data=False))
        )
        assert {p.name for p in out.iterdir()} == {target.name, *data}


@pytest.mark.parametrize("kind", ALL)
def test_a_name_that_is_not_utf8_is_written_on_every_path(kind, tmp_path):
    """Linux names are bytes: ``b"\\xff\\xfe.onnx"`` in a folder named ``b"\\xff"`` is
    written (the data file, whose name the model records as UTF-8 text, gets U+FFFD for the
    bad bytes, as the core names it), never a TypeError from a binding."""
    out = sources(tmp_path)
    folder = Path(os.fsdecode(os.fsencode(out) + b"/\xff"))
    folder.mkdir()
    target = Path(os.fsdecode(os.fsencode(folder) + b"/\xfe" + SUFFIX.get(kind, ".onnx").encode()))
    if kind == "location":  # the caller's location is not UTF-8 either: text in the model cannot be
        with pytest.raises(fastseq.ExportError, match="must be UTF-8"):
            write_any(kind, 2.0, target)
        assert list(folder.iterdir()) == []
        return
    if kind == "merge_optimize":  # the command line as bytes, as a shell passes them
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "fastseq",
                "merge",
                str(tmp_path / "src" / "s2.onnx"),
                "-o",
                os.fsencode(target),
                "--optimize",
            ],
            capture_output=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
    else:
        write_any(kind, 2.0, target)
    assert target.is_file()
    readable = "readable" + SUFFIX.get(kind, ".onnx")  # onnx and ONNX Runtime read UTF-8 paths only
    os.link(target, folder / readable)
    (tmp_path / "plain").symlink_to(folder, target_is_directory=True)
    computes(kind, tmp_path / "plain" / readable, 2.0, tmp_path)
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("kind", ["location", "direct"])
def test_a_location_through_a_link_out_of_the_folder_is_an_export_error(kind, tmp_path):
    """``export(location="sub/w.bin")`` with ``sub`` a link to another folder wrote the data
    there (and fastseq then refused to load its own export): an ExportError naming the link,
    and nothing is written on either side."""
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "sub").symlink_to(elsewhere, target_is_directory=True)
    pipe = fastseq.ONNXSequential(matmul_model(1.0))
    target = out / "m.onnx"
    with pytest.raises(
        fastseq.ExportError, match=re.escape(f"cannot write {target}: its data file sub/w.bin") + ".*symbolic link"
    ):
        pipe.export(target, save_as_external_data=True, location="sub/w.bin")
    assert sorted(p.name for p in out.iterdir()) == ["sub"] and list(elsewhere.iterdir()) == []
    # A real folder of that name takes it, and the export loads back.
    (out / "sub").unlink()
    pipe.export(target, save_as_external_data=True, location="sub/w.bin")
    assert (out / "sub" / "w.bin").is_file()
    fastseq.ONNXSequential(target)


def test_the_optimised_export_refuses_a_missing_folder_as_every_path_does(tmp_path):
    pipe = fastseq.ONNXSequential(matmul_model(1.0))
    for how in (dict(optimized=True), dict(), dict(external_data=True)):
        target = tmp_path / "new" / "sub" / "m.onnx"
        with pytest.raises(fastseq.ExportError, match=re.escape(f"the folder {target.parent} does not exist")):
            pipe.export(target, **how)
        assert list(tmp_path.iterdir()) == []


def test_an_optimised_export_on_a_full_disk_is_an_export_error_naming_the_target(tmp_path):
    """ONNX Runtime writes the optimised model itself (into the core's staging folder): on a
    full disk its failure is an ExportError naming the target, in Python and as the CLI's one
    line; the old file stays and nothing is left beside it. Needs root for the tmpfs."""
    w = np.random.default_rng(1).standard_normal((512, 512)).astype(np.float32)  # 1 MB
    big = onnx.helper.make_model(
        onnx.helper.make_graph(
            [onnx.helper.make_node("MatMul", ["x", "w"], ["y"])],
            "big",
            [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 512])],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 512])],
            [onnx.numpy_helper.from_array(w, "w")],
        ),
        opset_imports=[onnx.helper.make_opsetid("", 17)],
        ir_version=8,
    )
    onnx.save(big, tmp_path / "big.onnx")
    with tmpfs(tmp_path / "full", "512k") as disk:
        target = disk / "m.onnx"
        target.write_bytes(b"old model")
        pipe = fastseq.ONNXSequential(tmp_path / "big.onnx", session_cache=False)
        with pytest.raises(fastseq.ExportError, match=re.escape(f"cannot write {target}: ")) as e:
            pipe.export(target, optimized=True)
        assert "bug" not in str(e.value)
        assert [p.name for p in disk.iterdir()] == ["m.onnx"] and target.read_bytes() == b"old model"
        r = subprocess.run(
            [sys.executable, "-m", "fastseq", "merge", str(tmp_path / "big.onnx"), "-o", str(target), "--optimize"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        lines = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(lines) == 1, r.stderr
        assert lines[0].startswith(f"fastseq: error: cannot write {target}: ") and "bug" not in lines[0]
        assert [p.name for p in disk.iterdir()] == ["m.onnx"] and target.read_bytes() == b"old model"


def test_a_model_that_onnx_runtime_refuses_is_not_called_a_write_error(tmp_path):
    """The optimised export tells ONNX Runtime refusing the model (a RunError naming the
    stage) from failing to write it (an ExportError): only a write that fails is the latter."""
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("NoSuchOp", ["x"], ["y"], domain="no.such.domain")],
        "bad",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    model = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid("no.such.domain", 1)]
    )
    onnx.save(model, tmp_path / "bad.onnx")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastseq",
            "merge",
            str(tmp_path / "bad.onnx"),
            "-o",
            str(tmp_path / "o.onnx"),
            "--optimize",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0 and "cannot write" not in r.stderr, r.stderr
    assert not (tmp_path / "o.onnx").exists()


PLAIN = {
    "inline": "fastseq.ONNXSequential(src / 's2.onnx').export(target)",
    "external_data": "fastseq.ONNXSequential(src / 's2.onnx').export(target, external_data=True)",
    "compose_to_file": "fastseq.compose_to_file([src / 's2.onnx'], target)",
    "reuse": "fastseq.compose_to_file([src / 'e2.onnx'], target, external_data='reuse')",
    "merge": "from fastseq import cli\nif cli.main(['merge', str(src / 's2.onnx'), '-o', str(target)]) != 0:\n"
    "    raise fastseq.ExportError('merge failed')",
}


@pytest.mark.parametrize("kind", PLAIN)
def test_a_read_only_target_is_an_export_error_for_an_ordinary_user_on_the_plain_paths(kind):
    """Issue 26, item 2, on the paths test_export.py's KINDS leave out (the core's own
    exports, compose_to_file, a reuse export, a plain `fastseq merge`): as nobody, in a folder
    anyone may write in (a rename over the file would go through), a read-only target is an
    ExportError naming it, and it stays as it was."""
    import unprivileged

    shared = unprivileged.shared_folder()
    try:
        src, out = shared / "src", shared / "out"
        for folder in (src, out):
            unprivileged.writable_folder(folder)
        onnx.save(matmul_model(2.0), src / "s2.onnx")
        onnx.save(matmul_model(2.0), src / "e2.onnx", save_as_external_data=True, location="e2.bin", size_threshold=0)
        for p in src.iterdir():
            p.chmod(0o644)
        target = out / "m.onnx"
        target.write_bytes(b"old model")
        target.chmod(0o444)
        (shared / "warm").mkdir()
        warm = (
            f"import fastseq\nfrom pathlib import Path\nsrc, target = Path({str(src)!r}), "
            f"Path({str(shared / 'warm' / 'm.onnx')!r})\n{PLAIN[kind]}\n"
        )  # loads every module as root
        paths = f"src, target = Path({str(src)!r}), Path({str(target)!r})\n"
        code = paths + unprivileged.printing_export_error(PLAIN[kind])
        r = unprivileged.run(code, warm)
        assert r.returncode == 0, r.stderr
        assert f"cannot write {target}: it is read-only" in r.stdout or kind == "merge", r.stdout + r.stderr
        if kind == "merge":
            assert f"cannot write {target}: it is read-only" in r.stderr, r.stderr
        assert [p.name for p in out.iterdir()] == [target.name] and target.read_bytes() == b"old model"
    finally:
        subprocess.run(["rm", "-rf", str(shared)], check=False)
