"""The Python package's shape: no hand-written file over 500 lines (the few still over are
named, and must still be over: split one, and it leaves the list), and the runner's callers
use its public interface only (the batcher, IO binding, profiles and Ray reached into
``_runner``, ``_call`` and ``_output_list``). And the tests' shape: they mirror the package,
a module's tests at ``tests/<layer>/test_<module>.py``, the suites that cross modules apart
(docs/development.md says where tests go)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import ROOT
from project.test_layers import LAYERS, MODULES, layer_of

PACKAGE = ROOT / "python" / "fastseq"
LIMIT = 500
#: files still over the limit, being edited elsewhere: to be split, never to grow this list
OVER: set[str] = set()

FILES = sorted(p for p in PACKAGE.rglob("*.py"))


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_file_over_the_limit(path):
    name = str(path.relative_to(PACKAGE))
    if name in OVER:
        assert lines(path) > LIMIT, f"{name} is within {LIMIT} lines now: take it off OVER in {__file__}"
    else:
        assert lines(path) <= LIMIT, f"{name} has {lines(path)} lines, over {LIMIT}: split it by idea"


def test_the_allow_list_names_files_that_exist():
    assert all((PACKAGE / name).is_file() for name in OVER)


def private_members(path: Path, cls: str) -> set[str]:
    """The underscore names a class defines: its methods and the attributes it assigns on
    ``self`` (dunders aside)."""
    tree = ast.parse(path.read_text())
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    names = {f.name for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self":
            names.add(sub.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def foreign_reads(names: set[str], home: Path, files: list[Path] = FILES) -> list[str]:
    """Where a module other than ``home`` reads one of ``names`` off anything but ``self``."""
    found = []
    for path in files:
        if path == home:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in names
                and not (isinstance(node.value, ast.Name) and node.value.id == "self")
            ):
                found.append(f"{path.name}:{node.lineno} .{node.attr}")
    return found


def test_nothing_outside_the_runner_uses_its_private_members():
    home = PACKAGE / "runtime" / "runner.py"
    private = private_members(home, "Runner")
    assert {"_run", "_explain", "_by_name"} <= private  # the reader sees what it should
    assert not foreign_reads(private, home)


def test_nothing_outside_the_runnable_reaches_for_its_engine():
    """``pipe._runner`` was read by the batcher, ``pipe._session_options``, ``pipe._runner_for``
    and ``pipe._batch_runner`` by the batches; ``pipe.engine`` (the Engine contract) is the
    public way."""
    home = PACKAGE / "runtime" / "runnable.py"
    assert "_engine" in private_members(home, "Runnable")
    assert not foreign_reads({"_engine"}, home)


def test_the_reader_finds_a_foreign_read(tmp_path):
    """What the batcher did before: a foreign read is found, a class's own is not."""
    probe = tmp_path / "probe.py"
    probe.write_text("class B:\n    def f(self):\n        return self._pipe._runner.run(self._runner)\n")
    home = PACKAGE / "runtime" / "runnable.py"
    assert foreign_reads({"_runner"}, home, [probe]) == ["probe.py:3 ._runner"]


def test_no_module_reads_another_modules_private_attributes():
    """A class's private members (methods and attributes on ``self``) are read in its own
    module only: what another module needs is public (the engine's contract, the runner's
    interface)."""
    defined: dict[Path, set[str]] = {}
    for path in FILES:
        tree = ast.parse(path.read_text())
        defined[path] = set().union(*(private_members(path, c.name) for c in tree.body if isinstance(c, ast.ClassDef)))
    found = []
    for path in FILES:
        others = set().union(*(names for p, names in defined.items() if p != path)) - defined[path]
        found += [
            f"{path.relative_to(PACKAGE)}:{node.lineno} .{node.attr}"
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Attribute)
            and node.attr in others
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ]
    assert not found, found


def test_onnx_runtimes_private_api_is_reached_in_one_place():
    """``InferenceSession._sess`` and ``IOBinding._iobinding`` (the compiled session and
    binding, without the public methods' per-call checks) only in the runner's seam
    (``compiled_calls``, ``compiled_binding_run``), tested with and without them in
    tests/runtime/test_runner.py."""
    private = re.compile(r"\b(_sess|_iobinding)\b")
    users = [str(p.relative_to(PACKAGE)) for p in FILES if private.search(p.read_text())]
    assert users == ["runtime/runner.py"]
    text = (PACKAGE / "runtime" / "runner.py").read_text()
    seam = text[text.index("# --- the seam") : text.index("class Runner")]
    assert len(private.findall(text)) == len(private.findall(seam)) >= 2


# --- the tests mirror the package -------------------------------------------------------------------
TESTS = ROOT / "tests"

#: the folder of each layer's tests, by the layer's name in tests/project/test_layers.py (the
#: top layer, the package's face, is mostly its command line)
LAYER_FOLDERS = {name: "cli" if name == "top" else name for name, _ in LAYERS}

#: the suites that test behaviour across modules, each in a folder of its own
SUITES = {
    "core": "the Rust core through the public API: adapters, the graph form, scoping, bad input, external data, "
    "differential and property tests",
    "hostile": "hostile and broken input: trust boundaries, files that change or are not regular files",
    "peers": "side by side with the libraries fastseq stands in for: kornia, onnx.compose and its fuzzers",
    "docs": "the documentation site, and every example of README.md and docs/",
    "scenarios": "what users do across the layers: no ONNX Runtime, exporters' batch axes, own rows, real models",
    "project": "the repository's own rules: layers, shape, this layout, the release",
}

#: test files named after a module (test_<module>.py) that are not in its layer's folder, and why
ELSEWHERE = {
    "peers/test_onnx_compose.py": "fastseq.onnx_compose is onnx.compose function for function: its tests run both",
}


def short(module: str) -> str:
    """The name a module's tests are named by: its last part, a leading underscore dropped
    (``fastseq.ops._proto``: ``proto``; ``fastseq.__main__``: ``main``; a package: its own)."""
    return module.rpartition(".")[2].strip("_")


def layer_modules() -> dict[str, set[str]]:
    """The short names of each layer's modules, by the layer's tests folder."""
    names: dict[str, set[str]] = {folder: set() for folder in LAYER_FOLDERS.values()}
    for module in MODULES:
        names[LAYER_FOLDERS[LAYERS[layer_of(module)][0]]].add(short(module))
    names["base"].add("core")  # fastseq._core, the extension (its stub is python/fastseq/_core.pyi)
    return names


TEST_FILES = sorted(p.relative_to(TESTS) for p in TESTS.rglob("test_*.py") if "fixtures" not in p.parts)


def test_no_test_file_is_left_at_the_top():
    assert not [str(p) for p in TEST_FILES if len(p.parts) == 1], "tests/<layer>/ or a suite's folder"


def test_every_folder_is_a_layer_or_a_suite_and_a_package():
    folders = {p.parts[0] for p in TEST_FILES if len(p.parts) > 1}
    other = sorted(folders - set(LAYER_FOLDERS.values()) - set(SUITES))
    assert not other, f"tests/ folders that are neither a layer's nor a suite's (SUITES): {other}"
    # A package each, so that two folders may hold files of one name (tests/runtime/test_cache.py
    # beside a tests/cli/test_cache.py) and test modules import as runtime.test_export.
    assert not [f for f in folders if not (TESTS / f / "__init__.py").is_file()]
    assert not [p for p in TEST_FILES if len(p.parts) > 2], "one level: tests/<folder>/test_<name>.py"


def test_a_layers_files_are_named_after_its_modules():
    """``tests/<layer>/test_<module>.py``, or ``test_<module>_<aspect>.py`` where one module's
    tests take several files (serving/test_server_grpc.py)."""
    modules = layer_modules()
    wrong = []
    for path in TEST_FILES:
        folder, name = path.parts[0], path.stem.removeprefix("test_")
        if folder in modules and not any(name == m or name.startswith(m + "_") for m in modules[folder]):
            wrong.append(str(path))
    assert not wrong, f"named after no module of their layer: {wrong}"


def test_a_file_named_after_a_module_is_in_its_layers_folder():
    modules = layer_modules()
    wrong = []
    for path in TEST_FILES:
        name = path.stem.removeprefix("test_")
        homes = {folder for folder, names in modules.items() if name in names}
        if homes and path.parts[0] not in homes and str(path) not in ELSEWHERE:
            wrong.append(f"{path} (in {' or '.join(sorted(homes))}/?)")
    assert not wrong, wrong
    assert all((TESTS / p).is_file() for p in ELSEWHERE)


def test_the_layout_check_sees_a_misplaced_file():
    """What the checks above read: a module's layer and the name its tests take."""
    modules = layer_modules()
    assert {"runner", "cache", "batcher"} <= modules["runtime"] and "proto" in modules["ops"]
    assert {"fastseq", "main", "cli", "cache", "version"} <= modules["cli"] and "core" in modules["base"]
    assert "cache" in modules["cli"] and "cache" in modules["runtime"]  # two homes: either will do


def test_the_development_guide_says_where_tests_go():
    text = (ROOT / "docs" / "development.md").read_text()
    missing = [f"tests/{f}/" for f in [*SUITES, "runtime", "cli"] if f"tests/{f}/" not in text]
    assert not missing, f"docs/development.md does not name {missing}"
