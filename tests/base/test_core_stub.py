"""``_core.pyi`` is written by ``tools/gen_stubs.py`` from the built extension (the
signatures, types and docstrings PyO3 records in it): the stub must be what the tool writes
today, so that a function, method, class, parameter, type or docstring changed in Rust
without the stub fails the tests. The runtime checks below hold on any platform (the tool
reads ELF files only)."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from fastseq import _core

STUB = ROOT / "python" / "fastseq" / "_core.pyi"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_stubs", ROOT / "tools" / "gen_stubs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_stubs"] = module
    spec.loader.exec_module(module)
    return module


def test_the_stub_is_what_the_extension_says():
    if Path(_core.__file__).read_bytes()[:4] != b"\x7fELF":
        pytest.skip("tools/gen_stubs.py reads ELF extensions only")
    gen = _generator()
    assert STUB.read_text() == gen.render(), "run: python tools/gen_stubs.py"
    assert gen.main(["--check"]) == 0


def test_the_tool_renders_types_from_the_records():
    """The records' expressions as the stub writes them: qualified names, builtins bare,
    unions flattened, classes by their introspection id, the Source alias where it fits."""
    gen = _generator()
    records = [{"type": "class", "id": "7", "name": "Composed"}]
    r = gen.Renderer(records, _core)
    name = lambda m, a: {"type": "attribute", "value": {"type": "name", "id": m}, "attr": a}  # noqa: E731
    path = {
        "type": "binop",
        "op": "bitor",
        "left": name("builtins", "str"),
        "right": {"type": "subscript", "value": name("os", "PathLike"), "slice": name("builtins", "str")},
    }
    union = {
        "type": "binop",
        "op": "bitor",
        "left": name("builtins", "bytes"),
        "right": {
            "type": "binop",
            "op": "bitor",
            "left": path,
            "right": {
                "type": "binop",
                "op": "bitor",
                "left": {
                    "type": "subscript",
                    "value": name("builtins", "tuple"),
                    "slice": {"type": "tuple", "elts": [path, path]},
                },
                "right": {"type": "id", "id": "7"},
            },
        },
    }
    assert r.annotation(union) == "Source"
    optional = {
        "type": "binop",
        "op": "bitor",
        "left": name("typing", "SupportsIndex"),
        "right": {"type": "constant", "kind": "none"},
    }
    assert r.annotation(optional) == "typing.SupportsIndex | None"
    assert r.expr({"type": "constant", "kind": "str", "value": "fastseq"}, annotation=False) == "'fastseq'"


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
            classes[node.name] = {m.name: _params(m.args) for m in node.body if isinstance(m, ast.FunctionDef)}
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
            member = getattr(cls, m)
            if not callable(member):  # a property: its getter takes self alone
                assert params == [], f"_core.{cls_name}.{m}"
                continue
            assert _signature(member) == params, f"_core.{cls_name}.{m}"


def test_sources_take_every_form_the_stub_names(tmp_path):
    """``Source`` in the stub: bytes, a path (str or PathLike), (path, root folder), a Composed."""
    import onnx

    from conftest import scale_model

    onnx.save(scale_model(2.0), str(tmp_path / "m.onnx"))
    data = (tmp_path / "m.onnx").read_bytes()
    stub = STUB.read_text()
    assert (
        "Source = bytes | str | os.PathLike[str] | tuple[str | os.PathLike[str], str | os.PathLike[str]] | "
        "Composed" in stub
    )
    loaded = _core.load_model(data)
    for source in (data, str(tmp_path / "m.onnx"), tmp_path / "m.onnx", (str(tmp_path / "m.onnx"), tmp_path), loaded):
        assert _core.load_model(source).to_bytes() == loaded.to_bytes()


def test_every_writer_returns_the_same_typed_result(tmp_path):
    """``Saved``: model_bytes, data_bytes and data_files (never a dict, never one data file
    under another name), from a save, a commit of bytes and a staged commit alike."""
    import onnx

    from conftest import scale_model

    composed = _core.load_model(scale_model(2.0, shape=(2, 4096)).SerializeToString())
    results = [
        composed.save(str(tmp_path / "a.onnx"), external_data=True),
        _core.commit_bytes(composed.to_bytes(), str(tmp_path / "b.onnx")),
    ]
    with _core.stage(str(tmp_path / "c.onnx")) as stage:
        onnx.save(
            onnx.load_from_string(composed.to_bytes()),
            str(stage.folder() / "c.onnx"),
            save_as_external_data=True,
            location="w.bin",
            size_threshold=0,
        )
        results.append(stage.commit("c.onnx"))
    for saved, name, data in zip(results, "abc", (["a.onnx.data"], [], ["w.bin"])):
        assert type(saved) is _core.Saved
        assert saved.model_bytes == (tmp_path / f"{name}.onnx").stat().st_size
        assert saved.data_files == data
        assert saved.data_bytes == sum((tmp_path / d).stat().st_size for d in data)
        assert "data_files=" in repr(saved)


def test_the_layout_is_the_cores():
    layout = _core.LAYOUT
    assert (layout.threshold, layout.data_suffix) == (1024, ".data")
    assert layout.data_file("m.onnx") == "m.onnx.data"
    assert layout.allows_location("weights/w.bin")
    for bad in ("", ".", "../w", "/abs", "a/../../w", "a\0b"):
        assert not layout.allows_location(bad), bad
        with pytest.raises(_core.LoadError, match="is refused"):
            layout.check_location(bad)
