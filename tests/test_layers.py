"""The Python package's layers, read from its imports: each module imports only its own
layer and the ones below, and no two modules import each other in a circle (lazy imports
inside functions count: they are imports all the same). docs/architecture.md draws them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "python" / "fastseq"

#: bottom to top; a module may import its own layer and those before it
LAYERS = [
    ("base", ["fastseq._core", "fastseq.errors"]),
    ("ops", ["fastseq.ops"]),
    ("sources", ["fastseq.sources"]),
    ("graph", ["fastseq.graph"]),
    ("runtime", ["fastseq.runtime"]),
    ("integrations", ["fastseq.integrations"]),
    ("facades", ["fastseq.facades"]),
    # the public face: the package itself, the CLI and the public names of integrations
    ("top", ["fastseq", "fastseq.__main__", "fastseq.cli", "fastseq.ray", "fastseq.quantize", "fastseq.onnx_compose",
             "fastseq.operators"]),
]


def layer_of(module: str) -> int:
    best, rank = -1, None
    for k, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            exact_top = p == "fastseq"
            if (module == p or (not exact_top and module.startswith(p + "."))) and len(p) > best:
                best, rank = len(p), k
    if rank is None:
        raise AssertionError(f"{module} belongs to no layer: add it to LAYERS in tests/test_layers.py")
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
                is_module = any(where.with_suffix(s).exists() for s in (".py", ".pyi")) or (where / "__init__.py").exists()
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
    upward += ["fastseq"] if "fastseq" in imports(MODULES[name]) and name != "fastseq" and mine < len(LAYERS) - 1 else []
    assert not upward, f"{name} ({LAYERS[mine][0]}) imports {upward} from a layer above"


def test_no_import_circle():
    graph = {name: {m for m in imports(path) if m in MODULES} for name, path in MODULES.items()}
    # a package's __init__ imported for a submodule is not an edge back to the package
    state: dict[str, int] = {}

    def visit(n: str, path: list[str]) -> None:
        state[n] = 1
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                cycle = path[path.index(m):] + [m]
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
