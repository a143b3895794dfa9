"""The Python package's shape: no hand-written file over 500 lines (the few still over are
named, and must still be over: split one, and it leaves the list), and the runner's callers
use its public interface only (the batcher, IO binding, profiles and Ray reached into
``_runner``, ``_call`` and ``_output_list``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import ROOT

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
