"""The fastseq command, run as a real subprocess: outputs, files and exit codes."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort

from conftest import scale_model


def fastseq(*args: str, cwd=None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fastseq", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def test_demo_classifies_the_bundled_digits_without_network(tmp_path):
    r = fastseq("demo", "-o", str(tmp_path / "demo.onnx"))
    assert r.returncode == 0, r.stderr
    assert "prediction: 3 0 7 4 (4 of 4 right)" in r.stdout
    assert (
        "builtin:resize?size=8,8&mode=linear -> builtin:normalize?mean=0.5&std=0.5 -> builtin:flatten -> builtin:digits"
        in r.stdout
    )
    onnx.checker.check_model(str(tmp_path / "demo.onnx"))


def test_merge_inspect_and_run(tmp_path):
    onnx.save(scale_model(2.0, out="h"), tmp_path / "a.onnx")
    onnx.save(scale_model(3.0, inp="in"), tmp_path / "b.onnx")
    r = fastseq("merge", "a.onnx", "b.onnx", "--io-map", "h:in", "-o", "m.onnx", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "wrote m.onnx" in r.stdout and "merging 2 models: done" in r.stderr
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    got = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, np.maximum(np.maximum(2 * x, 0) * 3, 0))

    r = fastseq("inspect", "m.onnx", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "  x: float32[2, 4]" in r.stdout and "  y: float32[2, 4]" in r.stdout
    assert "opsets: ai.onnx 17" in r.stdout and "nodes: 4; initializers: 2 (32 B)" in r.stdout

    np.save(tmp_path / "x.npy", x)
    r = fastseq("run", "m.onnx", "--input", "x=x.npy", "-o", "out.npz", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "y: float32[2, 4]" in r.stdout
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["y"], got)


def test_merge_with_external_data(tmp_path):
    onnx.save(scale_model(2.0, shape=(2, 512)), tmp_path / "a.onnx")
    r = fastseq("merge", "a.onnx", "a.onnx", "-o", "m.onnx", "--external-data", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert ".data" in r.stdout
    s = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(s.run(None, {"x": np.ones((2, 512), np.float32)})[0], 4.0)


def test_errors_have_exit_codes_and_one_line_messages(tmp_path):
    onnx.save(scale_model(2.0, out="logits"), tmp_path / "a.onnx")
    onnx.save(scale_model(3.0), tmp_path / "b.onnx")
    r = fastseq("merge", "a.onnx", "b.onnx", "--io-map", "logit:x", "-o", "m.onnx", cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1].startswith("fastseq: error: joint 0 (a.onnx -> b.onnx): 'logit'")
    assert "did you mean 'logits'?" in r.stderr
    assert not (tmp_path / "m.onnx").exists()
    r = fastseq("inspect", "missing.onnx", cwd=tmp_path)
    assert r.returncode == 1 and "no such file" in r.stderr
    r = fastseq("merge", "a.onnx", "b.onnx", "--io-map", "nocolon", "-o", "m.onnx", cwd=tmp_path)
    assert r.returncode == 2 and "expected OUTPUT:INPUT" in r.stderr
    r = fastseq("run", "a.onnx", "--input", "x=nope.npy", cwd=tmp_path)
    assert r.returncode == 1 and "nope.npy" in r.stderr
    r = fastseq("bogus")
    assert r.returncode == 2


# --- habits: one spelling of --providers, summaries, one-input files, exact conversions ----


def int64_model(path) -> None:
    """ids int64 [N, 3] -> doubled int64 [N, 3], and as float32."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["ids", "ids"], ["twice"]), helper.make_node("Cast", ["twice"], ["f"], to=1)],
        "ids",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 3])],
        [
            helper.make_tensor_value_info("twice", TensorProto.INT64, ["N", 3]),
            helper.make_tensor_value_info("f", TensorProto.FLOAT, ["N", 3]),
        ],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


def test_providers_is_one_spelling_and_provider_is_still_taken(tmp_path):
    onnx.save(scale_model(2.0), tmp_path / "a.onnx")
    np.save(tmp_path / "x.npy", np.ones((2, 4), np.float32))
    for flags in (["--providers", "CPUExecutionProvider"], ["--provider", "CPUExecutionProvider"]):
        r = fastseq("run", "a.onnx", *flags, "--input", "x=x.npy", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        r = fastseq("merge", "a.onnx", "--optimize", *flags, "-o", "opt.onnx", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    for command in ("run", "merge"):
        assert "--providers PROVIDER" in fastseq(command, "--help").stdout
    r = fastseq("run", "a.onnx", "--providers", "CPUExecutionProviderr", "--input", "x=x.npy", cwd=tmp_path)
    assert r.returncode == 1 and "did you mean 'CPUExecutionProvider'" in r.stderr


def test_run_without_output_file_summarises_each_output(tmp_path):
    onnx.save(scale_model(2.0), tmp_path / "a.onnx")
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    np.save(tmp_path / "x.npy", x)
    r = fastseq("run", "a.onnx", "--input", "x.npy", cwd=tmp_path)  # one input: the file alone
    assert r.returncode == 0, r.stderr
    y = np.maximum(2 * x, 0)
    assert f"y: float32[2, 4]  min 0 max 2 mean {y.mean():.6g}, first [0, 0, 0, 0, 0.2857, ...]\n" in r.stdout
    int64_model(tmp_path / "ids.onnx")
    np.save(tmp_path / "ids.npy", np.array([[1, 2, 3]], np.int64))
    r = fastseq("run", "ids.onnx", "--input", "ids=ids.npy", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "twice: int64[1, 3]  min 2 max 6 mean 4, first [2, 4, 6]" in r.stdout
    assert "f: float32[1, 3]  min 2 max 6 mean 4, first [2, 4, 6]" in r.stdout
    r = fastseq("run", "ids.onnx", "--input", "ids=ids.npy", "-o", "o.npz", cwd=tmp_path)  # a file: no summary
    assert "twice: int64[1, 3]\n" in r.stdout and "mean" not in r.stdout


def test_run_converts_inputs_exactly_and_refuses_lossy_ones_without_cast(tmp_path):
    int64_model(tmp_path / "ids.onnx")
    onnx.save(scale_model(2.0), tmp_path / "a.onnx")
    ids = np.array([[1, 2, 3], [4, 5, 6]])
    for dtype in (np.int64, np.int32, np.uint8, np.bool_):
        np.save(tmp_path / "ids.npy", ids.astype(dtype))
        r = fastseq("run", "ids.onnx", "--input", "ids.npy", "-o", "o.npz", cwd=tmp_path)
        assert r.returncode == 0, (dtype, r.stderr)
        np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["twice"], 2 * ids.astype(dtype).astype(np.int64))
    x = np.linspace(-1, 1, 8).reshape(2, 4) / 3
    np.save(tmp_path / "half.npy", x.astype(np.float16))
    r = fastseq("run", "a.onnx", "--input", "x=half.npy", "-o", "o.npz", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["y"], np.maximum(2 * x.astype(np.float16), 0))
    np.save(tmp_path / "x64.npy", x)
    r = fastseq("run", "a.onnx", "--input", "x=x64.npy", cwd=tmp_path)
    assert r.returncode != 0 and r.stderr.strip() == (
        "fastseq: error: --input x=x64.npy holds float64, input 'x' expects float32, and converting loses "
        "values; pass --cast to convert it anyway (as array.astype(numpy.float32) does)"
    )
    r = fastseq("run", "a.onnx", "--input", "x=x64.npy", "--cast", "-o", "o.npz", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["y"], np.maximum(2 * x.astype(np.float32), 0))
    np.save(tmp_path / "floats.npy", ids.astype(np.float32))  # float ids: refused, even if whole
    r = fastseq("run", "ids.onnx", "--input", "floats.npy", cwd=tmp_path)
    assert r.returncode != 0 and "holds float32, input 'ids' expects int64" in r.stderr


def test_run_input_names_are_checked(tmp_path):
    onnx.save(scale_model(2.0), tmp_path / "a.onnx")
    np.save(tmp_path / "x.npy", np.ones((2, 4), np.float32))
    r = fastseq("run", "a.onnx", "--input", "xx=x.npy", cwd=tmp_path)
    assert (
        r.returncode == 1 and r.stderr.strip() == "fastseq: error: 'xx' is not an input (did you mean 'x'?); inputs: x"
    )
    onnx.save(scale_model(3.0, inp="in"), tmp_path / "b.onnx")
    two = ["a.onnx", "b.onnx", "--io-map", ""]  # a joint without connections: two graph inputs
    r = fastseq("run", *two, "--input", "x.npy", cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.strip() == (
        "fastseq: error: --input 'x.npy': expected NAME=FILE.npy; the inputs are x: float32[2, 4], in: float32[2, 4]"
    )


# --- every error the CLI knows: one line, a non-zero exit, no traceback ------------------------
def reshape_model(shape) -> onnx.ModelProto:
    """x [n] -> Reshape(x, shape): fails at run time when n does not fit ``shape``."""
    from onnx import TensorProto, helper, numpy_helper

    s = numpy_helper.from_array(np.array(shape, np.int64), "s")
    g = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape")],
        "r",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [s],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def error_workspace(root) -> None:
    """The files the error cases below refer to, all in ``root``."""
    onnx.save(scale_model(2.0, out="logits"), root / "a.onnx")
    onnx.save(scale_model(3.0), root / "b.onnx")
    onnx.save(reshape_model([3, 3]), root / "reshape.onnx")
    good = scale_model(2.0).SerializeToString()
    (root / "garbage.onnx").write_bytes(bytes(range(256)) * 16)
    (root / "truncated.onnx").write_bytes(good[: len(good) // 2])
    (root / "empty.onnx").write_bytes(b"")
    (root / "folder.onnx").mkdir()
    (root / "file").write_text("not a folder")
    x = np.ones((2, 4), np.float32)
    np.save(root / "x.npy", x)
    np.save(root / "x64.npy", x.astype(np.float64))
    np.save(root / "x3.npy", np.ones((2, 3), np.float32))
    np.save(root / "x9.npy", np.ones(8, np.float32))
    np.save(root / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    (root / "cut.npy").write_bytes((root / "x.npy").read_bytes()[:100])
    np.savez(root / "x.npz", x=x)
    (root / "x.txt").write_text("1 2 3")
    stages = '[stages]\na = "a.onnx"\nb = "b.onnx"\n'
    (root / "garbage.toml").write_bytes(b"\xff\xfe\x00garbage\x80")
    (root / "deep.toml").write_text("edges = " + "[" * 5000 + "]" * 5000 + "\n" + stages)
    (root / "deep_stage.toml").write_text(
        '[stages]\na = { source = "a.onnx", sha256 = ' + "[" * 5000 + "]" * 5000 + " }\n"
    )
    (root / "sha.toml").write_text('[stages]\na = { source = "a.onnx", sha256 = 5 }\n')
    (root / "edges3.toml").write_text("edges = 3\n" + stages)
    (root / "providers.toml").write_text('providers = "x"\n' + stages)
    (root / "inputs.toml").write_text(stages + "[inputs]\nimage = 5\n")
    (root / "bad_edge.toml").write_text('edges = ["a.logit -> b.x"]\n' + stages)
    (root / "not_toml.toml").write_text("edges = [\n")
    (root / "unknown_key.toml").write_text("edgse = []\n" + stages)
    (root / "missing_stage.toml").write_text('[stages]\na = "gone.onnx"\n')
    (root / "version.toml").write_text("model_version = 99999999999999999999999\n" + stages)


#: (arguments, what the error line says): every CLI error path the test suite knows.
ERRORS = [
    # paths and garbage files
    (["inspect", "missing.onnx"], "no such file"),
    (["merge", "missing.onnx", "a.onnx", "-o", "m.onnx"], "no such file"),
    (["run", "missing.onnx"], "no such file"),
    (["inspect", "folder.onnx"], "folder.onnx"),
    (["inspect", "garbage.onnx"], "not a valid ONNX model"),
    (["inspect", "truncated.onnx"], "truncated.onnx"),
    (["inspect", "empty.onnx"], "empty.onnx"),
    (["run", "garbage.onnx"], "not a valid ONNX model"),
    (["inspect", "x" * 5000 + ".onnx"], "cannot be read"),
    (["merge", "a.onnx", "b.onnx", "--io-map", "logits:x", "-o", "file/m.onnx"], "file"),
    (["merge", "a.onnx", "b.onnx", "--io-map", "logits:x", "-o", "folder.onnx"], "folder.onnx"),
    # io-maps
    (["merge", "a.onnx", "b.onnx", "--io-map", "logit:x", "-o", "m.onnx"], "did you mean 'logits'?"),
    (["merge", "a.onnx", "b.onnx", "--io-map", "nocolon", "-o", "m.onnx"], "expected OUTPUT:INPUT"),
    (["merge", "a.onnx", "b.onnx", "--io-map", "logits:x", "--io-map", "y:x", "-o", "m.onnx"], "2 models have 1 joint"),
    (["run", "a.onnx", "b.onnx", "--io-map", "a:b", "--io-map", "c:d"], "2 models have 1 joint"),
    (["merge", "sha.toml", "--io-map", "a:b", "-o", "m.onnx"], "--io-map and --keep-outputs"),
    (["run", "sha.toml", "--io-map", "a:b"], "--io-map is for a chain"),
    # pipeline files
    (["merge", "garbage.toml", "-o", "m.onnx"], "garbage.toml: not a pipeline file: not UTF-8"),
    (["inspect", "garbage.toml"], "not UTF-8"),
    (["run", "garbage.toml"], "not UTF-8"),
    (["merge", "deep.toml", "-o", "m.onnx"], "deep.toml: edges: nested deeper"),
    (["inspect", "deep.toml"], "nested deeper"),
    (["run", "deep.toml"], "nested deeper"),
    (["inspect", "deep_stage.toml"], "deep_stage.toml: stages.a: nested deeper"),
    (["merge", "sha.toml", "-o", "m.onnx"], "sha.toml: stages.a.sha256: expected 64 hex digits"),
    (["merge", "edges3.toml", "-o", "m.onnx"], "edges3.toml: edges: expected a list"),
    (["run", "providers.toml"], "providers.toml: providers: expected a list"),
    (["inspect", "inputs.toml"], "inputs.toml: inputs.image: expected"),
    (["merge", "bad_edge.toml", "-o", "m.onnx"], "did you mean 'logits'?"),
    (["inspect", "not_toml.toml"], "not valid TOML"),
    (["inspect", "unknown_key.toml"], "did you mean 'edges'?"),
    (["inspect", "missing_stage.toml"], "gone.onnx: no such file"),
    (["inspect", "missing.toml"], "missing.toml: no such file"),
    (["merge", "version.toml", "-o", "m.onnx"], "model_version: expected an integer"),
    (["inspect", "a.onnx", "--svg", "a.svg"], "draw a pipeline file"),
    # inputs
    (["run", "a.onnx", "--input", "x=nope.npy"], "nope.npy: no such file"),
    (["run", "a.onnx", "--input", "x=x.npz"], "an .npz archive"),
    (["run", "a.onnx", "--input", "x=x.txt"], "not a .npy file"),
    (["run", "a.onnx", "--input", "x=objects.npy"], "objects.npy"),
    (["run", "a.onnx", "--input", "x=cut.npy"], "cut.npy"),
    (["run", "a.onnx", "--input", "=x.npy"], "expected NAME=FILE.npy"),
    (["run", "a.onnx", "--input", "y=x.npy"], "'y' is not an input"),
    (["run", "a.onnx"], "no --input: the pipeline needs x: float32[2, 4]; pass --input FILE.npy"),
    (["run", "a.onnx", "--input", "x=x64.npy"], "holds float64, input 'x' expects float32"),
    (["run", "a.onnx", "--ray", "--cast", "--input", "data"], "--cast converts .npy inputs"),
    (["run", "a.onnx", "--input", "x=x3.npy"], "expects size 4 on axis 1"),
    (["run", "reshape.onnx", "--input", "x=x9.npy"], "reshape"),
    (["run", "a.onnx", "--ray", "--input", "x=x.npy"], "--ray needs one --input"),
    (["profile", "a.onnx", "--input", "x=nope.npy"], "nope.npy: no such file"),
    (["profile", "a.onnx", "--input", "x=x.npy", "--runs", "0"], "profile needs runs >= 1"),
    # providers
    (
        ["run", "a.onnx", "--input", "x=x.npy", "--provider", "CUDAExecutionProvder"],
        "did you mean 'CUDAExecutionProvider'",
    ),
    (["merge", "a.onnx", "-o", "m.onnx", "--optimize", "--providers", "Bogus"], "unknown execution provider 'Bogus'"),
    # built-in operators
    (["inspect", "builtin:nms?max_boxes=99999999999999999999"], "max_boxes must be at most"),
    (["inspect", "builtin:resize?size=20&mode=bilnear"], "did you mean 'bilinear'"),
    (["inspect", "builtin:to_float?rank=99999999999"], "rank must be at most"),
    (["inspect", "builtin:normalize?mean=1e39"], "within float32's range"),
    (["inspect", "builtin:normalize?std=1e-45"], "1 / 1e-45 is inf there"),
    (["inspect", "builtin:nope"], "no built-in operator 'nope'"),
    (["inspect", "builtin:resize?size"], "is not KEY=VALUE"),
    # conversion, downloads
    (["merge", "a.onnx", "-o", "m.onnx", "--opset", "99999"], "99999"),
    (["merge", "a.onnx", "-o", "m.onnx", "--opset", "new"], "expected an opset version"),
    (["inspect", "hf://../../repo/m.onnx"], "hf://../../repo/m.onnx"),
    (["inspect", "hf://org/repo//etc/passwd.onnx"], "hf://org/repo//etc/passwd.onnx"),
    (["inspect", "http://127.0.0.1:9/m.onnx"], "http://127.0.0.1:9/m.onnx"),
    # the session cache
    (["cache", "list", "--dir", "file"], "file"),
    (["cache", "clear", "--dir", "file"], "file"),
    (["cache", "empty"], "invalid choice"),
    # quantize, usage
    (["quantize", "missing.onnx", "-o", "q.onnx"], "missing.onnx"),
    (["quantize", "garbage.onnx", "-o", "q.onnx"], "garbage.onnx"),
    (["quantize", "a.onnx", "-o", "q.onnx", "--static"], "static=True needs calibration data"),
    (["merge", "a.onnx"], "the following arguments are required: -o/--output"),
    (["bogus"], "invalid choice"),
]


def test_every_error_is_one_line_and_a_non_zero_exit(tmp_path):
    """Each error path the tests know, through the real command: exit code 1 (2 for usage),
    exactly one ``fastseq: error:`` line saying what is wrong, and never a traceback or
    ONNX Runtime's own log line."""
    from concurrent.futures import ThreadPoolExecutor

    error_workspace(tmp_path)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "FASTSEQ_DOWNLOAD_DEADLINE": "20",
        "HF_HOME": str(tmp_path / "hf"),
        "FASTSEQ_CACHE": str(tmp_path / "cache"),
    }

    def attempt(case):
        args, _ = case
        return subprocess.run(
            [sys.executable, "-m", "fastseq", *args], capture_output=True, text=True, cwd=tmp_path, timeout=120, env=env
        )

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(attempt, ERRORS))
    failures = []
    for (args, says), r in zip(ERRORS, results):
        lines = [line for line in r.stderr.splitlines() if line.startswith("fastseq: error:")]
        problems = []
        if r.returncode not in (1, 2):
            problems.append(f"exit code {r.returncode}")
        if len(lines) != 1:
            problems.append(f"{len(lines)} error lines")
        elif says not in lines[0]:
            problems.append(f"the error line does not say {says!r}")
        if "Traceback" in r.stderr or "[E:onnxruntime:" in r.stderr:
            problems.append("a traceback or ONNX Runtime's error log")
        if problems:
            failures.append(f"fastseq {' '.join(a[:60] for a in args)}: {'; '.join(problems)}\n{r.stderr[-1500:]}")
    assert not failures, "\n\n".join(failures)
