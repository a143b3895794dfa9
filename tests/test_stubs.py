"""``_core.pyi`` is written by hand: this compares it with the built extension, so that a
function, method, class or parameter added, removed or renamed in Rust without the stub
(or the other way round) fails the tests."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from fastseq import _core

STUB = Path(__file__).resolve().parent.parent / "python" / "fastseq" / "_core.pyi"


def _params(args: ast.arguments) -> list[tuple[str, object]]:
    """(name, default) per parameter, ``self`` left out; defaults as Python values."""
    positional = args.posonlyargs + args.args
    defaults = [inspect.Parameter.empty] * (len(positional) - len(args.defaults)) + [
        ast.literal_eval(d) for d in args.defaults
    ]
    out = [(a.arg, d) for a, d in zip(positional, defaults) if a.arg != "self"]
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        out.append((a.arg, inspect.Parameter.empty if d is None else ast.literal_eval(d)))
    return out


def _signature(obj) -> list[tuple[str, object]]:
    sig = inspect.signature(obj)
    return [(p.name, p.default) for p in sig.parameters.values() if p.name != "self"]


def _stub():
    tree = ast.parse(STUB.read_text())
    functions, classes, names = {}, {}, set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            functions[node.name] = _params(node.args)
        elif isinstance(node, ast.ClassDef):
            classes[node.name] = {
                m.name: _params(m.args) for m in node.body if isinstance(m, ast.FunctionDef)
            }
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fastseq"):
            names.update(a.asname or a.name for a in node.names)  # re-exported (the error classes)
    return functions, classes, names


def _public(obj) -> list[str]:
    return sorted(n for n in dir(obj) if not n.startswith("_"))


def test_every_name_of_the_extension_is_in_the_stub_and_back():
    functions, classes, names = _stub()
    exported = set(_core.__all__)
    stubbed = set(functions) | set(classes) | names
    assert exported - stubbed == set(), "missing from _core.pyi"
    assert stubbed - exported == set(), "in _core.pyi but not in the extension"


def test_function_parameters_match():
    functions, _, _ = _stub()
    for name, params in functions.items():
        assert _signature(getattr(_core, name)) == params, f"_core.{name}"


def test_classes_and_their_methods_match():
    _, classes, _ = _stub()
    for cls_name, methods in classes.items():
        cls = getattr(_core, cls_name)
        if issubclass(cls, BaseException):
            assert methods == {}, f"{cls_name}: exceptions carry no methods of their own"
            continue
        assert _public(cls) == sorted(m for m in methods if not m.startswith("_")), f"_core.{cls_name}"
        for m, params in methods.items():
            assert _signature(getattr(cls, m)) == params, f"_core.{cls_name}.{m}"
