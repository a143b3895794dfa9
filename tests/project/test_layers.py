"""The Python package's layers, read from its imports: each module imports only its own
layer and the ones below, and no two modules import each other in a circle (lazy imports
inside functions count: they are imports all the same). docs/architecture.md draws them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGE = ROOT / "python" / "fastseq"

#: bottom to top; a module may import its own layer and those before it
LAYERS = [
    ("base", ["fastseq._core", "fastseq.errors"]),
    ("ops", ["fastseq.ops"]),
    ("sources", ["fastseq.sources"]),
    ("graph", ["fastseq.graph"]),
    ("runtime", ["fastseq.runtime"]),
    ("serving", ["fastseq.serving"]),
    # each module at its public path: fastseq.ray (a package), fastseq.ray_serve, fastseq.quantize
    ("integrations", ["fastseq.ray", "fastseq.ray_serve", "fastseq.quantize"]),
    # fastseq.onnx_compose at its public path too
    ("facades", ["fastseq.facades", "fastseq.onnx_compose"]),
    # the public face: the package itself and the CLI
    ("top", ["fastseq", "fastseq.__main__", "fastseq.cli"]),
]


def layer_of(module: str) -> int:
    best, rank = -1, None
    for k, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            exact_top = p == "fastseq"
            if (module == p or (not exact_top and module.startswith(p + "."))) and len(p) > best:
                best, rank = len(p), k
    if rank is None:
        raise AssertionError(f"{module} belongs to no layer: add it to LAYERS in tests/project/test_layers.py")
    return rank


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    """The fastseq modules that ``path`` imports, anywhere in the file."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("fastseq")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("fastseq"):
                continue
            for a in node.names:  # `from fastseq.x import y`: y may be a module
                sub = f"{mod}.{a.name}"
                where = PACKAGE.parent / sub.replace(".", "/")
                is_module = (
                    any(where.with_suffix(s).exists() for s in (".py", ".pyi")) or (where / "__init__.py").exists()
                )
                found.add(sub if is_module else mod)
    found.discard(me)
    return found


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_module_has_a_layer():
    for name in MODULES:
        layer_of(name)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_upward_import(name):
    mine = layer_of(name)
    upward = [m for m in sorted(imports(MODULES[name])) if m != "fastseq" and layer_of(m) > mine]
    upward += (
        ["fastseq"] if "fastseq" in imports(MODULES[name]) and name != "fastseq" and mine < len(LAYERS) - 1 else []
    )
    assert not upward, f"{name} ({LAYERS[mine][0]}) imports {upward} from a layer above"


def test_no_import_circle():
    graph = {name: {m for m in imports(path) if m in MODULES} for name, path in MODULES.items()}
    # a package's __init__ imported for a submodule is not an edge back to the package
    state: dict[str, int] = {}

    def visit(n: str, path: list[str]) -> None:
        state[n] = 1
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                cycle = path[path.index(m) :] + [m]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if m not in state:
                visit(m, path + [m])
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])


def test_the_check_catches_an_upward_import(tmp_path):
    """The reader finds lazy imports inside functions and relative ones."""
    f = PACKAGE / "runtime" / "session.py"
    assert "fastseq.errors" in imports(f)
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from fastseq.facades import sequential\n")
    tree = ast.parse(probe.read_text())
    names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "fastseq.facades" in names and layer_of("fastseq.facades.sequential") > layer_of("fastseq.runtime.session")


# --- docs/architecture.md draws the package as it is ------------------------------------------------
DOC = PACKAGE.parent.parent / "docs" / "architecture.md"


def _table(title: str) -> list[list[str]]:
    """The rows of the first table after the heading ``title``, as lists of cells."""
    lines = DOC.read_text().split("\n")
    start = next(k for k, line in enumerate(lines) if line.startswith("#") and title in line)
    rows, inside = [], False
    for line in lines[start + 1 :]:
        if line.startswith("|"):
            inside = True
            cells = [c.strip() for c in line.strip("|").split("|")]
            if not set(cells[0]) <= set("-: "):
                rows.append(cells)
        elif inside:
            break
    return rows[1:]  # the header row


def _short(module: str, prefixes: list[str]) -> str | None:
    """A module's name as the doc writes it in its layer's row (None: the layer's folder)."""
    if module == "fastseq":
        return "__init__"
    prefix = max((p for p in prefixes if module == p or module.startswith(p + ".")), key=len)
    package = MODULES[module].name == "__init__.py"
    if module == prefix:
        return None if package else module.rpartition(".")[2]  # a folder, or fastseq.cli and the like
    rest = module[len(prefix) + 1 :].replace(".", "/")
    return rest + "/" if package else rest


def _named(cell: str, prefixes: list[str]) -> set[str]:
    """The module names in a row's cell: its backticked names, but the layer's own folder."""
    folders = {p.rpartition(".")[2] + "/" for p in prefixes}
    tokens = {t.removesuffix(".py") for t in re.findall(r"`([^`]+)`", cell)}
    return {t for t in tokens if re.fullmatch(r"[\w/]+", t) and t not in folders}


def test_the_doc_lists_the_layers_in_order_with_every_module():
    rows = _table("Python: `python/fastseq/`")
    assert [r[0].split()[0] for r in rows] == [name for name, _ in LAYERS]
    for (name, prefixes), row in zip(LAYERS, rows):
        mine = {m for m in MODULES if layer_of(m) == [n for n, _ in LAYERS].index(name)}
        expected = {_short(m, prefixes) for m in mine} - {None}
        listed = _named(row[1], prefixes) - {"_core"}
        assert expected == listed, (
            f"docs/architecture.md, layer {name}: missing {expected - listed}, stale {listed - expected}"
        )


def test_the_doc_lists_the_runtime_modules_in_import_order():
    rows = _table("The runtime, one idea per module")
    order = [r[0].strip("`") for r in rows]
    runtime = sorted(m.rpartition(".")[2] for m in MODULES if m.startswith("fastseq.runtime."))
    assert sorted(order) == runtime, f"docs/architecture.md's runtime table: {sorted(set(runtime) ^ set(order))}"
    for k, name in enumerate(order):
        below = {f"fastseq.runtime.{n}" for n in order[k + 1 :]}
        wrong = sorted(imports(MODULES[f"fastseq.runtime.{name}"]) & below)
        assert not wrong, f"runtime.{name} imports {wrong}, listed after it in docs/architecture.md"


def test_ops_import_neither_onnx_nor_numpy_but_in_the_build_script():
    """What the doc says of ops/: building an operator loads neither (only inside functions
    that are asked for a model, such as to_onnx), and shipped/build.py, which does at import,
    is a script that nothing imports."""
    for name, path in MODULES.items():
        if not name.startswith("fastseq.ops") or name == "fastseq.ops.shipped.build":
            continue
        top = [n for n in ast.parse(path.read_text()).body if isinstance(n, (ast.Import, ast.ImportFrom))]
        loaded = {a.name.split(".")[0] for n in top if isinstance(n, ast.Import) for a in n.names}
        loaded |= {(n.module or "").split(".")[0] for n in top if isinstance(n, ast.ImportFrom)}
        assert not loaded & {"onnx", "numpy"}, f"{name} imports {loaded & {'onnx', 'numpy'}} at import"
    assert not [n for n, p in MODULES.items() if "fastseq.ops.shipped.build" in imports(p)]
