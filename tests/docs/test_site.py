"""The documentation site: ``mkdocs build --strict`` passes (every page in the nav, every link
and anchor resolving, the API reference generated from the docstrings by mkdocstrings), the
API reference names every public name, and every public name, member and constructor
parameter has a docstring to generate it from. The pages' code blocks run in
tests/docs/test_readme.py."""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import subprocess
import sys

import pytest

import fastseq
from conftest import ROOT

DOCS = ROOT / "docs"


def test_the_site_builds_strictly(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip("mkdocs is not installed: pip install '.[test]' brings mkdocs, mkdocs-material, mkdocstrings")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    # generated from the docstrings: a constructor parameter's explanation is on the page
    assert "keep_outputs" in api and "Base class of every fastseq error." in api
    security = (tmp_path / "site" / "security" / "index.html").read_text()
    assert "tests/hostile/test_hostile.py" in security, "the threat model, with its tests"
    assert "--8&lt;--" not in security and "Report a vulnerability" in security, "SECURITY.md's policy is included"


def test_security_md_is_a_short_policy_and_the_threat_model_is_in_the_docs():
    """SECURITY.md says which versions get fixes, how to report privately and what happens
    then (as onnx's, 1.8 KB); the threat model is docs/security.md, its lines readable."""
    policy = (ROOT / "SECURITY.md").read_text()
    assert len(policy) < 3000
    for part in (
        "## Supported versions",
        "## Reporting a vulnerability",
        "## What to expect",
        "private vulnerability reporting",
        "Report a vulnerability",
        "working days",
        "90 days",
    ):
        assert part in policy, part
    model = (DOCS / "security.md").read_text()
    assert "## What fastseq trusts" in model and "## Sources that change" in model
    long = [k for k, line in enumerate(model.splitlines(), 1) if len(line) > 130]
    assert not long, f"docs/security.md lines over 130 characters: {long}"


def test_every_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert pages and all(f": {p}" in nav for p in pages), sorted(p for p in pages if f": {p}" not in nav)


def directives() -> set[str]:
    return set(re.findall(r"^::: ([\w.]+)", (DOCS / "api.md").read_text(), re.M))


def test_the_api_reference_names_every_public_name():
    listed = directives()
    errors_members = re.search(
        r"::: fastseq\.errors\n\s+options:\n\s+members: \[([^\]]+)\]", (DOCS / "api.md").read_text()
    )
    listed |= {f"fastseq.errors.{m.strip()}" for m in errors_members.group(1).split(",")}
    missing = []
    for name in fastseq.__all__:
        obj = getattr(fastseq, name)
        if inspect.ismodule(obj):
            where = obj.__name__
        elif inspect.isclass(obj) or inspect.isfunction(obj):
            module = obj.__module__
            if module == "fastseq" and issubclass(obj, BaseException):
                module = "fastseq.errors"  # the errors say `fastseq.<Name>`; they live in errors.py
            where = f"{module}.{obj.__qualname__}"
        else:
            continue  # constants: MAX_IR_VERSION, __version__
        if where not in listed:
            missing.append(f"{name} ({where})")
    assert not missing, f"not in docs/api.md: {missing}"


def test_the_stubs_errors_are_the_ones_fastseq_errors_defines():
    """The core raises the classes of fastseq/errors.py; the stub must say so rather than
    declare classes of its own (mkdocstrings documents them once, in fastseq.errors)."""
    import ast

    from fastseq import _core, errors

    tree = ast.parse((ROOT / "python" / "fastseq" / "_core.pyi").read_text())
    assert not [n.name for n in tree.body if isinstance(n, ast.ClassDef) and hasattr(errors, n.name)]
    reexported = {
        a.name for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "fastseq.errors" for a in n.names
    }
    assert reexported == {"FastseqError", "LoadError", "CompositionError", "OpsetMismatchError", "ExportError"}
    assert all(getattr(_core, name) is getattr(errors, name) for name in reexported)


def members(cls) -> list[tuple[str, object]]:
    """Public methods and properties of ``cls`` and of its fastseq base classes (what the
    reference shows for it), each name once."""
    seen: dict[str, object] = {}
    for klass in cls.__mro__:
        if not klass.__module__.startswith("fastseq"):
            continue
        for name, value in vars(klass).items():
            if name in seen or (name.startswith("_") and name != "__call__"):
                continue
            if callable(value) or isinstance(value, (property, classmethod, staticmethod)):
                seen[name] = value
    return sorted(seen.items())


def test_every_public_name_and_member_has_a_docstring():
    missing = []
    for name in fastseq.__all__:
        obj = getattr(fastseq, name)
        if (inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismodule(obj)) and not (
            obj.__doc__ or ""
        ).strip():
            missing.append(name)
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            for member, value in members(obj):
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
