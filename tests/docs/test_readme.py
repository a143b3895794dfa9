"""Every Python and shell block of README.md and of the documentation pages (docs/**/*.md)
runs here, so that an example that breaks fails.

Each block runs in its own process, in a fresh copy of a folder holding what the examples
name: small stand-in models with the names and inputs/outputs the text gives them
(``resnet18.onnx``, ``models/backbone.onnx``, ``a.onnx`` ...), ``.npy`` files, the pipeline
file of docs/pipelines.md, and a Parquet dataset for the Ray example. ``https://example.org/`` is
served by a local HTTP server and ``hf://`` by a local stand-in of the Hub (``HF_ENDPOINT``);
``pip install ...`` lines are taken as done (this environment has the package and its
extras). Python blocks start with ``numpy as np``, ``onnx`` and ``fastseq`` imported and the
models the text calls ``m1``, ``m2``, ``b3`` and ``models`` and the arrays ``x`` and
``image`` defined. The TOML block (docs/pipelines.md) is the pipeline file: its placeholder
digest is replaced by the real one. A block preceded by ``<!-- readme-test: skip (why) -->``
is skipped.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import ROOT
from servers import serve_files, serve_hub

README = ROOT / "README.md"
#: the files whose blocks run: the README, then the documentation pages
DOCUMENTS = [README, *sorted((ROOT / "docs").rglob("*.md"))]
SKIP = re.compile(r"^<!-- readme-test: skip \((.+)\) -->$")
EXAMPLE_ORG = "https://example.org/"
PRELUDE = """\
import numpy as np
import onnx
import fastseq

m1, m2, b3 = (onnx.load(f) for f in ("a.onnx", "m2.onnx", "c.onnx"))
models = ["a.onnx", "m2.onnx"]
x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
image = np.load("x.npy")
"""
#: What a block must print, by a line of its code.
PRINTS = {
    "fastseq demo": "(4 of 4 right)",
    "print(pipe)                                  # ... outputs": (
        "outputs [values: float32[N, 5]; indices: int64[N, 5]]"
    ),
    "fastseq inspect merged.onnx": "opsets: ai.onnx 17",
}


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int
    skip: str | None
    #: the file, the section it is in and its place there: "readme-install-1", "cli-the-command-line-2"
    id: str = ""
    #: the file, relative to the repository
    file: str = "README.md"


def blocks_of(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    page = "readme" if path == README else path.relative_to(ROOT / "docs").with_suffix("").as_posix().replace("/", "-")
    found, i, section, count = [], 0, "top", 0
    while i < len(lines):
        heading = re.match(r"^#{1,3} (.+)$", lines[i])
        if heading:
            section, count = re.sub(r"[^a-z0-9]+", "-", heading.group(1).lower()).strip("-"), 0
        opening = re.match(r"^```(\w+)$", lines[i])
        if not opening:
            i += 1
            continue
        end = lines.index("```", i + 1)
        before = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        marker = SKIP.match(before)
        count += 1
        code = "\n".join(lines[i + 1 : end]) + "\n"
        found.append(
            Block(
                opening.group(1),
                code,
                i + 1,
                marker and marker.group(1),
                f"{page}-{section}-{count}",
                path.relative_to(ROOT).as_posix(),
            )
        )
        i = end + 1
    return found


BLOCKS = [b for doc in DOCUMENTS for b in blocks_of(doc)]
RUNNABLE = [b for b in BLOCKS if b.lang in ("python", "sh")]


# --- the stand-ins -----------------------------------------------------------------------------


def save(path: Path, nodes, name, inputs, outputs, weights=()) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(np.asarray(w, np.float32) if isinstance(w, list) else w, k) for k, w in weights],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


F = TensorProto.FLOAT
RNG = np.random.default_rng(0)


def features(path: Path, size: int | str = "H") -> None:
    """A backbone: images "input" [N, 3, H, W] -> "features" [N, 8]."""
    nodes = [
        helper.make_node("GlobalAveragePool", ["input"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"]),
        helper.make_node("Gemm", ["flat", "w"], ["features"], transB=1),
    ]
    save(
        path,
        nodes,
        "backbone",
        [("input", F, ["N", 3, size, size])],
        [("features", F, ["N", 8])],
        [("w", RNG.random((8, 3), np.float32))],
    )


def classifier(path: Path, inp: str, out: str, shape: list, classes: int) -> None:
    """Images [N, 3, 224, 224] (or rows [N, k]) -> scores [N, classes]."""
    rows = len(shape) == 2
    nodes = (
        []
        if rows
        else [
            helper.make_node("GlobalAveragePool", [inp], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["flat"]),
        ]
    )
    nodes.append(helper.make_node("Gemm", [inp if rows else "flat", "w"], [out], transB=1))
    k = shape[1]
    save(
        path,
        nodes,
        "classifier",
        [(inp, F, shape)],
        [(out, F, ["N", classes])],
        [("w", RNG.random((classes, k), np.float32))],
    )


def linear(path: Path, inp: str, out: str, k: int, n: int, extra: str | None = None) -> None:
    """out = inp @ W, [N, k] -> [N, n]; ``extra`` is a second output, its softmax."""
    nodes = [helper.make_node("MatMul", [inp, "w"], [out])]
    outputs = [(out, F, ["N", n])]
    if extra:
        nodes.append(helper.make_node("Softmax", [out], [extra], axis=-1))
        outputs.append((extra, F, ["N", n]))
    save(path, nodes, out, [(inp, F, ["N", k])], outputs, [("w", RNG.random((k, n), np.float32))])


def workspace(root: Path, web: Path, hub: Path, web_url: str) -> Path:
    """The folder every block starts from (copied for each)."""
    from fastseq import ops

    ws = root / "ws"
    # Use: kornia's hf://operators/resize, a backbone on disk, a head at a URL.
    (hub / "kornia" / "ONNX_models" / "operators").mkdir(parents=True)
    (hub / "kornia" / "ONNX_models" / "operators" / "resize.onnx").write_bytes(bytes(ops.resize(224)))
    features(ws / "models" / "backbone.onnx", 224)
    linear(ws / "head.onnx", "x", "logits", 8, 10)
    web.mkdir()
    shutil.copy(ws / "head.onnx", web / "head.onnx")
    # Lower level, the session cache, the command line: a -> b -> c.
    linear(ws / "a.onnx", "x", "y", 4, 4)
    linear(ws / "m2.onnx", "x", "y", 4, 4)
    linear(ws / "b.onnx", "x", "logits", 4, 3, extra="probs")
    save(
        ws / "c.onnx",
        [helper.make_node("Add", ["z", "w"], ["out"])],
        "c",
        [("z", F, ["N", 3]), ("w", F, ["N", 3])],
        [("out", F, ["N", 3])],
    )
    np.save(ws / "array.npy", np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4))
    np.save(ws / "big.npy", np.linspace(-1, 1, 8).reshape(2, 4))
    (ws / "batches").mkdir()
    for k in range(3):
        np.save(ws / "batches" / f"{k}.npy", RNG.random((2, 4), np.float32))
    # Operators and the command line: a resnet18-like classifier.
    classifier(ws / "resnet18.onnx", "image", "logits", ["N", 3, 224, 224], 1000)
    shutil.copy(ws / "resnet18.onnx", ws / "model.onnx")
    # Pipelines as graphs (and the pipeline file): a backbone, a head, a segmenter.
    features(ws / "resnet.onnx")
    shutil.copy(ws / "resnet.onnx", ws / "models" / "resnet.onnx")
    seg = [
        helper.make_node("ReduceMean", ["skip"], ["grey"], axes=[1], keepdims=1),  # axes an attribute until 18
        helper.make_node("ReduceSum", ["x", "axis"], ["total"], keepdims=1),
        helper.make_node("Unsqueeze", ["total", "hw"], ["total4"]),
        helper.make_node("Mul", ["grey", "total4"], ["mask"]),
    ]
    save(
        ws / "seg.onnx",
        seg,
        "seg",
        [("x", F, ["N", 8]), ("skip", F, ["N", 3, "H", "W"])],
        [("mask", F, ["N", 1, "H", "W"])],
        [("axis", np.array([1], np.int64)), ("hw", np.array([2, 3], np.int64))],
    )
    (hub / "org" / "repo").mkdir(parents=True)
    shutil.copy(ws / "seg.onnx", hub / "org" / "repo" / "seg.onnx")
    np.save(ws / "x.npy", RNG.random((1, 3, 32, 32), np.float32))
    (ws / "pipeline.toml").write_text(pipeline_file(ws, web_url))
    (chain,) = [b for b in BLOCKS if b.lang == "toml" and b.code.startswith("chain = ")]
    (ws / "chain.toml").write_text(chain.code)  # the chain form, run by the block after it
    # Ray: rows of 12 uint8 pixels in a column "pixels", and a classifier of such rows.
    classifier(ws / "classifier.onnx", "features", "logits", ["N", 12], 10)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pixels = RNG.integers(0, 256, (40, 12)).astype(np.uint8)
    (ws / "images").mkdir()
    column = pa.FixedSizeListArray.from_arrays(pa.array(pixels.ravel()), 12)
    pq.write_table(pa.table({"pixels": column, "id": np.arange(40)}), ws / "images" / "part0.parquet")
    # The command itself, as a pip install puts it on PATH.
    (ws / "bin").mkdir()
    launcher = ws / "bin" / "fastseq"
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m fastseq "$@"\n')
    launcher.chmod(0o755)
    return ws


def pipeline_file(ws: Path, web_url: str) -> str:
    """The docs' TOML block of the graph form (the pipeline file), with the real digest of its
    backbone."""
    (toml,) = [b for b in BLOCKS if b.lang == "toml" and '"9f2c..."' in b.code]
    digest = hashlib.sha256((ws / "models" / "resnet.onnx").read_bytes()).hexdigest()
    assert '"9f2c..."' in toml.code
    return toml.code.replace('"9f2c..."', f'"{digest}"').replace(EXAMPLE_ORG, f"{web_url}/")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("readme")
    web, hub = serve_files(root / "web"), serve_hub(root / "hub")
    ws = workspace(root, root / "web", root / "hub", web.url)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "FASTSEQ_"))}
    env.update(
        HF_ENDPOINT=hub.url,
        HF_HOME=str(root / "hf"),
        HF_HUB_DISABLE_TELEMETRY="1",
        HOME=str(root / "home"),
        XDG_CACHE_HOME=str(root / "home" / ".cache"),
        PATH=f"{ws / 'bin'}{os.pathsep}{os.environ['PATH']}",
        RAY_USAGE_STATS_ENABLED="0",
        RAY_ENABLE_UV_RUN_RUNTIME_ENV="0",
    )
    yield ws, env, web.url
    web.close()
    hub.close()


def run_block(block: Block, setup, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    ws, env, web_url = setup
    folder = tmp_path / "run"
    shutil.copytree(ws, folder)
    code = block.code.replace(EXAMPLE_ORG, f"{web_url}/")
    if block.lang == "python":
        (folder / "block.py").write_text(PRELUDE + "\n" + code)
        command = [sys.executable, "block.py"]
    else:
        # pip install lines are done already: pip only checks that it was asked to install.
        shim = 'pip() { [ "$1" = install ]; }\n'
        command = ["bash", "-euo", "pipefail", "-c", shim + code]
    timeout = 600 if "import ray" in code else 300
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("block", RUNNABLE, ids=[b.id for b in RUNNABLE])
def test_readme_block_runs(block, setup, tmp_path):
    if block.skip:
        pytest.skip(block.skip)
    if "import ray" in block.code:
        pytest.importorskip("ray", reason="needs the ray extra: pip install 'fastseq-onnx[ray]'")
    r = run_block(block, setup, tmp_path)
    assert r.returncode == 0, (
        f"{block.file} line {block.line}:\n{block.code}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"
    )
    for line, text in PRINTS.items():
        if line in block.code:
            assert text in r.stdout, (line, r.stdout)
    if "write_parquet" in block.code:  # the Ray Data example
        import pyarrow.parquet as pq

        for folder in ("scores", "predicted"):
            table = pq.read_table(tmp_path / "run" / folder)
            assert table.num_rows == 40 and "id" in table.column_names, folder
            scores = np.stack(table.column("scores" if folder == "scores" else "probabilities").to_numpy(False))
            np.testing.assert_allclose(scores.sum(1), 1, rtol=1e-5)


def test_the_pipeline_file_block_loads_and_runs(setup, tmp_path):
    block = Block(
        "python",
        "pipe = fastseq.Pipeline.from_file('pipeline.toml')\nlogits, mask = pipe(image)\n"
        "assert logits.shape == (1, 10) and mask.shape == (1, 1, 32, 32)\n",
        0,
        None,
        "toml",
    )
    r = run_block(block, setup, tmp_path)
    assert r.returncode == 0, r.stderr


def test_every_page_has_its_blocks_found():
    """The README and the guide pages with examples are read (a page moved or renamed
    would otherwise drop its blocks from the run silently)."""
    files = {b.file for b in RUNNABLE}
    for page in (
        "README.md",
        "docs/running.md",
        "docs/kornia.md",
        "docs/onnx-compose.md",
        "docs/operators.md",
        "docs/pipelines.md",
        "docs/cli.md",
        "docs/batching.md",
        "docs/ray.md",
        "docs/install.md",
    ):
        assert page in files, page
    assert len({b.id for b in BLOCKS}) == len(BLOCKS), "block ids are unique"


def test_skips_are_rare_and_say_why():
    """The test command (README and docs/install.md), the release build, a Ray cluster from
    the CLI and the benchmarks: each is run elsewhere, as its reason says."""
    skipped = [b for b in BLOCKS if b.skip]
    assert len(skipped) <= 5, [b.id for b in skipped]
    assert all(len(b.skip) > 20 for b in skipped)
    assert {b.lang for b in BLOCKS} == {"python", "sh", "toml"}, "a block in a language this test does not run"
