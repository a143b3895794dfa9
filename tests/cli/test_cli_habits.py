"""The fastseq command as a new user meets it, through real subprocesses: each command's
own usage and the near miss of a misspelt flag; quiet commands (fastseq's own warnings as
one line, other libraries' log output only with --verbose, a failure said once); outputs
checked before the work runs and written through the core's writer (never through a link,
never half-written on a full disk, a read-only target refused as an ordinary user)."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import unprivileged
from conftest import all_at_once, scale_model, tmpfs

#: fastseq's own progress summary ("running: done in 0.01s"): the one line besides its
#: errors and warnings that it writes to a stderr that is not a terminal.
PROGRESS = re.compile(r"^[\w .'/-]+: done in \d+\.\d\ds$")


def fastseq(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: int = 240):
    return subprocess.run(
        [sys.executable, "-m", "fastseq", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env
    )


def stray(stderr: str) -> list[str]:
    """Lines on stderr that are not fastseq's own."""
    return [ln for ln in stderr.splitlines() if not ln.startswith("fastseq: ") and not PROGRESS.match(ln)]


def reshape_model() -> onnx.ModelProto:
    """x [N, 4] -> Reshape to [3, 3]: fails when it runs."""
    g = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape")],
        "r",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([3, 3], np.int64), "s")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def gather_model() -> onnx.ModelProto:
    """Gathers index 7 of an axis of 4: fails when it runs."""
    g = helper.make_graph(
        [helper.make_node("Gather", ["x", "i"], ["y"], name="gather", axis=1)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([7], np.int64), "i")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def conv_model() -> onnx.ModelProto:
    """A small classifier over images of any size [N, 3, H, W] -> logits [N, 10]."""
    rng = np.random.default_rng(0)
    g = helper.make_graph(
        [
            helper.make_node("Conv", ["input", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("GlobalAveragePool", ["r"], ["p"]),
            helper.make_node("Flatten", ["p"], ["f"]),
            helper.make_node("MatMul", ["f", "w2"], ["logits"]),
        ],
        "conv",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [
            numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
            numpy_helper.from_array(rng.standard_normal((8, 10)).astype(np.float32), "w2"),
        ],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    onnx.save(scale_model(2.0, shape=("N", 4)), tmp_path / "a.onnx")
    onnx.save(reshape_model(), tmp_path / "reshape.onnx")
    onnx.save(gather_model(), tmp_path / "gather.onnx")
    np.save(tmp_path / "x.npy", np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4))
    (tmp_path / "unused.toml").write_text(
        'edges = ["a.y -> sm.input", "sm.probabilities -> top.input"]\noutputs = ["top.values"]\n'
        '[stages]\na = "a.onnx"\nsm = "builtin:softmax"\ntop = "builtin:topk?k=2"\n'
    )
    return tmp_path


# --- usage ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,usage,hint",
    [
        (["merge", "a.onnx", "a.onnx", "--io-maps", "y:x", "-o", "m.onnx"], "fastseq merge", "'--io-map'"),
        (["merge", "a.onnx", "a.onnx", "--io-maps=y:x", "-o", "m.onnx"], "fastseq merge", "'--io-map'"),
        (["run", "a.onnx", "--inputs", "x.npy"], "fastseq run", "'--input'"),
        (["profile", "a.onnx", "--input", "x.npy", "--run", "3", "--warmups", "1"], "fastseq profile", "'--warmup'"),
        (["inspect", "unused.toml", "--svgg", "p.svg"], "fastseq inspect", "'--svg'"),
        (["cache", "list", "--dryrun"], "fastseq cache", "'--dry-run'"),
        (["quantize", "a.onnx", "-o", "q.onnx", "--per-chanel"], "fastseq quantize", "'--per-channel'"),
        (["merg", "a.onnx"], "fastseq [-h]", "'merge'"),
        (["cache", "lsit"], "fastseq cache", "'list'"),
    ],
)
def test_a_misspelt_flag_gets_its_commands_usage_and_the_near_miss(work, args, usage, hint):
    r = fastseq(*args, cwd=work)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0].startswith(f"usage: {usage}"), r.stderr
    errors = [ln for ln in lines if ln.startswith("fastseq: error:")]
    assert len(errors) == 1 and f"did you mean {hint}?" in errors[0], r.stderr
    assert "Traceback" not in r.stderr


# --- quiet ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [["inspect", "unused.toml"], ["run", "unused.toml", "--input", "x.npy"], ["merge", "unused.toml", "-o", "m.onnx"]],
)
def test_fastseqs_own_warning_is_one_line(work, command):
    r = fastseq(*command, cwd=work)
    assert r.returncode == 0, r.stderr
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("fastseq: warning:")]
    assert warnings == ["fastseq: warning: unused.toml: output(s) top.indices never used and not exported: left out"]
    assert not stray(r.stderr), r.stderr
    assert "UserWarning" not in r.stderr and "sys.exit" not in r.stderr


@pytest.mark.parametrize(
    "command,says",
    [
        (["run", "a.onnx", "gather.onnx", "--input", "x.npy"], "indices element out of data bounds"),
        (["profile", "a.onnx", "gather.onnx", "--input", "x.npy", "--runs", "1"], "indices element out of data bounds"),
        (["run", "reshape.onnx", "--input", "x.npy"], "cannot be reshaped"),
    ],
)
def test_a_failing_run_says_its_error_once(work, command, says):
    r = fastseq(*command, cwd=work)
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastseq: error: stage ") and says in lines[0], r.stderr
    verbose = fastseq(*command, "--verbose", cwd=work)
    assert verbose.returncode == 1 and verbose.stderr.count("fastseq: error:") == 1
    if command[0] == "profile":  # ONNX Runtime's own log line shows when asked for
        assert "[E:onnxruntime:" in verbose.stderr


def test_quantize_keeps_shape_inference_logs_unless_verbose(work):
    """A center crop before a classifier over images of any size: ONNX Runtime's symbolic
    shape inference logs that it cannot compare floor(Max(...)) sizes."""
    onnx.save(conv_model(), work / "conv.onnx")
    r = fastseq(
        "merge",
        "builtin:to_float?",
        "builtin:layout?src=NHWC&dst=NCHW",
        "builtin:center_crop?size=48",
        "conv.onnx",
        "builtin:softmax",
        "-o",
        "pipe.onnx",
        cwd=work,
    )
    assert r.returncode == 0 and not stray(r.stderr), r.stderr
    r = fastseq("quantize", "pipe.onnx", "-o", "q.onnx", cwd=work)
    assert r.returncode == 0 and "wrote q.onnx" in r.stdout, r.stderr
    assert not stray(r.stderr), r.stderr
    r = fastseq("quantize", "pipe.onnx", "-o", "q.onnx", "--verbose", cwd=work)
    assert r.returncode == 0 and "Unable to determine if floor(Max(" in r.stderr, r.stderr


def test_provider_options_a_provider_ignores_are_one_warning(work):
    (work / "prov.toml").write_text(
        'chain = ["a"]\nproviders = [{ name = "CPUExecutionProvider", arena = 1 }]\n[stages]\na = "a.onnx"\n'
    )
    r = fastseq("run", "prov.toml", "--input", "x.npy", cwd=work)
    assert r.returncode == 0, r.stderr
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("fastseq: warning:")] == [
        "fastseq: warning: CPUExecutionProvider takes no options in this onnxruntime build: arena is ignored"
    ]
    assert not stray(r.stderr)


@pytest.mark.timeout(600)
def test_a_ray_run_is_quiet_and_a_ray_failure_said_once(work):
    pytest.importorskip("ray")
    (work / "ds").mkdir()
    for i in range(3):
        np.save(work / "ds" / f"{i}.npy", np.full((5, 4), i, np.float32))
    env = {**os.environ, "RAY_ADDRESS": ""}
    r = fastseq(
        "run", "a.onnx", "--input", "ds", "-o", "out", "--ray", "--concurrency", "1", cwd=work, env=env, timeout=500
    )
    assert r.returncode == 0, r.stderr
    assert "wrote 15 rows to out" in r.stdout
    assert not stray(r.stderr), r.stderr
    r = fastseq(
        "run",
        "reshape.onnx",
        "--input",
        "ds",
        "-o",
        "out2",
        "--ray",
        "--concurrency",
        "1",
        cwd=work,
        env=env,
        timeout=500,
    )
    assert r.returncode == 1
    assert len(r.stderr.splitlines()) == 1 and "cannot be reshaped" in r.stderr, r.stderr


# --- outputs ---------------------------------------------------------------------------------------


def test_an_output_that_cannot_be_written_fails_before_the_model_runs(work):
    """reshape.onnx fails when it runs: the error being the output's proves nothing ran."""
    (work / "folder").mkdir()
    for output, says in (
        (
            "/nonexistent/dir/out.npz",
            "cannot write /nonexistent/dir/out.npz: the folder /nonexistent/dir does not exist",
        ),
        ("folder", "cannot write folder: it is a directory"),
        ("x.npy/out.npz", "cannot write x.npy/out.npz: the folder x.npy does not exist"),
    ):
        r = fastseq("run", "reshape.onnx", "--input", "x.npy", "-o", output, cwd=work)
        assert r.returncode == 1 and r.stderr.splitlines() == [f"fastseq: error: {says}"], r.stderr
    r = fastseq("merge", "a.onnx", "-o", "x.npy/m.onnx", cwd=work)
    assert r.returncode == 1 and "fastseq: error: cannot write x.npy/m.onnx" in r.stderr, r.stderr
    r = fastseq("inspect", "unused.toml", "--dot", "/nonexistent/p.dot", cwd=work)
    assert r.returncode == 1 and "cannot write /nonexistent/p.dot" in r.stderr and "unused.toml: 3" not in r.stdout


def test_merge_makes_missing_folders_only_for_a_merge_that_worked(work):
    r = fastseq("merge", "missing.onnx", "-o", "new/sub/m.onnx", cwd=work)
    assert r.returncode == 1 and not (work / "new").exists()
    r = fastseq("merge", "a.onnx", "-o", "new/sub/m.onnx", cwd=work)
    assert r.returncode == 0 and (work / "new" / "sub" / "m.onnx").is_file(), r.stderr


def test_an_output_name_gets_npz_as_numpy_adds_it_and_says_so(work):
    r = fastseq("run", "a.onnx", "--input", "x.npy", "-o", "result", cwd=work)
    assert r.returncode == 0, r.stderr
    assert "wrote result.npz" in r.stdout.splitlines()
    x = np.load(work / "x.npy")
    np.testing.assert_allclose(np.load(work / "result.npz")["y"], np.maximum(2 * x, 0))
    assert sorted(p.name for p in work.iterdir() if p.name.startswith("result")) == ["result.npz"]


def test_an_output_link_is_replaced_never_followed(work):
    victim = work / "victim.txt"
    victim.write_text("the user's file")
    (work / "out.npz").symlink_to(victim)
    (work / "dangling.npz").symlink_to(work / "nowhere" / "x")
    for name in ("out.npz", "dangling.npz"):
        r = fastseq("run", "a.onnx", "--input", "x.npy", "-o", name, cwd=work)
        assert r.returncode == 0, r.stderr
        assert not (work / name).is_symlink() and "y" in np.load(work / name).files
    assert victim.read_text() == "the user's file"
    assert not (work / "nowhere").exists()


def test_a_full_disk_keeps_the_previous_output_and_names_the_file(work, tmp_path):
    big = scale_model(1.0, shape=("N", 4096))
    onnx.save(big, work / "big.onnx")
    np.save(work / "big.npy", np.ones((64, 4096), np.float32))  # 1 MB out
    with tmpfs(tmp_path / "disk", "256k") as disk:
        previous = disk / "out.npz"
        np.savez(previous, y=np.arange(3))
        kept = previous.read_bytes()
        r = fastseq("run", str(work / "big.onnx"), "--input", str(work / "big.npy"), "-o", str(previous), cwd=work)
        assert r.returncode == 1
        assert not stray(r.stderr), r.stderr
        assert [ln for ln in r.stderr.splitlines() if ln.startswith("fastseq:")] == [
            f"fastseq: error: cannot write {previous}: No space left on device (os error 28)"
        ]
        assert previous.read_bytes() == kept
        assert [p.name for p in disk.iterdir()] == ["out.npz"], "nothing half-written is left"


def test_a_read_only_output_is_refused_for_an_ordinary_user(work):
    """As nobody (tests run as root here, and root may write any file): an existing output
    that is read-only, and a folder that is, are ExportErrors before the model runs."""
    shared = unprivileged.shared_folder()
    try:
        onnx.save(reshape_model(), shared / "reshape.onnx")
        np.save(shared / "x.npy", np.ones((2, 4), np.float32))
        out = shared / "out.npz"
        out.write_bytes(b"the user's results")
        out.chmod(0o444)
        locked = shared / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        scratch = unprivileged.writable_folder(shared / "scratch")
        warm = (
            "from fastseq.cli import main\n"
            f"main(['run', {str(work / 'a.onnx')!r}, '--input', {str(work / 'x.npy')!r}, '-o', "
            f"{str(scratch / 'w.npz')!r}])"
        )
        for target, says in ((out, "it is read-only (Permission denied"), (locked / "out.npz", "Permission denied")):
            code = (
                f"sys.exit(main(['run', {str(shared / 'reshape.onnx')!r}, '--input', {str(shared / 'x.npy')!r}, "
                f"'-o', {str(target)!r}]))"
            )
            r = unprivileged.run(code, warm)
            assert r.returncode == 1, r.stderr
            (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("fastseq: error:")]
            assert line.startswith(f"fastseq: error: cannot write {target}: ") and says in line, r.stderr
        assert out.read_bytes() == b"the user's results" and stat.S_IMODE(out.stat().st_mode) == 0o444
        assert list(locked.iterdir()) == []
    finally:
        subprocess.run(["rm", "-rf", str(shared)], check=False)


def test_processes_writing_one_output_leave_one_whole_archive(work):
    for k in range(4):
        np.save(work / f"x{k}.npy", np.full((2, 4), k, np.float32))
    all_at_once(
        [[sys.executable, "-m", "fastseq", "run", "a.onnx", "--input", f"x{k}.npy", "-o", "out.npz"] for k in range(4)],
        timeout=240,
        cwd=work,
    )
    y = np.load(work / "out.npz")["y"]
    assert any(np.array_equal(y, np.full((2, 4), 2.0 * k, np.float32)) for k in range(4))
    assert not [p.name for p in work.iterdir() if p.name.startswith(".out.npz")]


# --- the session cache --------------------------------------------------------------------------------


def test_cache_list_tells_pipelines_of_operators_apart(work):
    code = (
        "import sys, fastseq\nfrom fastseq import ops\n"
        "for size in (8, 16, 24):\n"
        "    fastseq.ONNXSequential(ops.to_float(), ops.resize(size), ops.softmax(axis=1),"
        " session_cache=sys.argv[1])\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(work / "cache")], cwd=work, capture_output=True, text=True, timeout=240
    )
    assert r.returncode == 0, r.stderr
    r = fastseq("cache", "list", "--dir", "cache", cwd=work)
    assert r.returncode == 0 and not stray(r.stderr), r.stderr
    lines = r.stdout.splitlines()[1:]
    heads, stages = lines[0::2], [ln.strip() for ln in lines[1::2]]
    assert len(heads) == 3 and len({re.search(r"model ([0-9a-f]{12})", h)[1] for h in heads}) == 3, r.stdout
    for size in (8, 16, 24):
        (line,) = [s for s in stages if f"resize(size=({size}, {size})" in s]
        assert line.startswith("to_float(") and line.endswith("softmax(axis=1, dtype='float32', rank=4)"), line


# --- what a new user tripped over (issue 42) --------------------------------------------------------


@pytest.mark.parametrize("command", ["run", "profile"])
def test_run_and_profile_without_input_say_how_to_pass_it(work, command):
    r = fastseq(command, "a.onnx", cwd=work)
    assert r.returncode == 1 and not stray(r.stderr)
    assert r.stderr.strip() == (
        "fastseq: error: no --input: the pipeline needs x: float32[N, 4]; pass --input "
        "FILE.npy (each array saved with numpy.save)"
    )


@pytest.mark.parametrize(
    "args,hint",
    [
        (["inspect", "a.onxx"], "a.onxx: no such file (did you mean 'a.onnx'?)"),
        (["run", "reshap.onnx", "--input", "x.npy"], "reshap.onnx: no such file (did you mean 'reshape.onnx'?)"),
        (["run", "a.onnx", "--input", "xx.npy"], "--input x=xx.npy: no such file (did you mean 'x.npy'?)"),
        (["inspect", "unsed.toml"], "unsed.toml: no such file (did you mean 'unused.toml'?)"),
        (["inspect", "modle/a.onnx"], "modle/a.onnx: no such file (did you mean 'model/a.onnx'?)"),
        (["inspect", "zzzzzzzzzz.onnx"], "zzzzzzzzzz.onnx: no such file"),
    ],
)
def test_a_path_typo_gets_the_near_miss_from_its_folder(work, args, hint):
    (work / "model").mkdir()
    r = fastseq(*args, cwd=work)
    assert r.returncode == 1 and r.stderr.strip() == f"fastseq: error: {hint}", r.stderr


def test_output_into_a_reader_that_leaves_ends_quietly(work):
    """``fastseq inspect x.onnx | head``: the reader takes a line and goes; fastseq ends as a
    command that SIGPIPE ends (141), without a word on stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "fastseq", "inspect", "a.onnx"], cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.close()  # the reader is gone before fastseq writes
    assert proc.wait(timeout=240) == 141
    assert proc.stderr.read() == b""
    proc.stderr.close()


def test_serve_help_points_to_the_network_serving_page(work):
    r = fastseq("serve", "--help", cwd=work)
    assert r.returncode == 0 and "docs/netserve.md" in r.stdout and "docs/serving.md" not in r.stdout
