"""The API reference (docs/api.md) is generated from the docstrings and up to date, and
every public name, member and constructor parameter is documented."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path

import pytest

import fastseq

ROOT = Path(__file__).resolve().parent.parent


def _generator():
    spec = importlib.util.spec_from_file_location("gen_api_docs", ROOT / "tools" / "gen_api_docs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_api_docs"] = module
    spec.loader.exec_module(module)
    return module


def test_api_reference_is_up_to_date():
    gen = _generator()
    assert (ROOT / "docs" / "api.md").read_text() == gen.render(), "run: python tools/gen_api_docs.py"
    assert gen.main(["--check"]) == 0


def test_every_public_name_and_member_has_a_docstring():
    gen = _generator()
    missing = []
    for name in fastseq.__all__:
        obj = getattr(fastseq, name)
        if inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismodule(obj):
            if not (obj.__doc__ or "").strip():
                missing.append(name)
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            for member, value in gen._members(obj, set()):
                func = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
                if not (func.__doc__ or "").strip():
                    missing.append(f"{name}.{member}")
    assert not missing, f"no docstring: {missing}"


@pytest.mark.parametrize("cls", [fastseq.ONNXSequential, fastseq.ONNXModule])
def test_constructor_parameters_are_explained(cls):
    doc = inspect.getdoc(cls)
    params = [p for p in inspect.signature(cls).parameters if p not in ("self",)]
    unexplained = [p for p in params if f"{p}:" not in doc]
    assert not unexplained, f"{cls.__name__} docstring does not explain {unexplained}"
    import pydoc

    text = pydoc.render_doc(cls, renderer=pydoc.plaintext)
    for word in ("keep_outputs", "sha256", "token", "cache_dir") if cls is fastseq.ONNXSequential else ("op",):
        assert word in text
