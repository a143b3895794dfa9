"""Writes docs/api.md, the API reference, from the docstrings of fastseq's public names.

    python tools/gen_api_docs.py           # rewrite docs/api.md
    python tools/gen_api_docs.py --check   # exit 1 if docs/api.md is out of date

tests/test_api_docs.py runs the check, so a docstring change without the regenerated page
fails the tests. Public names are ``fastseq.__all__``; for classes, their public methods and
properties, including those inherited from fastseq's own base classes.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "docs" / "api.md"

HEADER = """# fastseq API reference

Generated from the docstrings by `tools/gen_api_docs.py`; do not edit by hand (run
`python tools/gen_api_docs.py` after changing a docstring). The README has the overview.
"""


class _Raw(str):
    """An annotation shown as written (``str | None``), not quoted as a string's repr."""

    def __repr__(self) -> str:
        return str(self)


def _signature(obj) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"

    def plain(annotation):
        return _Raw(annotation) if isinstance(annotation, str) else annotation

    params = [p.replace(annotation=plain(p.annotation)) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=plain(sig.return_annotation)))


_SECTIONS = ("Args:", "Arguments:", "Raises:", "Returns:", "Warns:", "Note:")


def _doc(obj) -> str:
    """The docstring as markdown: Google-style sections (``Args:`` and indented
    ``name: text`` items) become bold headings and bullet lists; the rest is kept."""
    text = inspect.cleandoc(obj.__doc__) if getattr(obj, "__doc__", None) else ""
    out: list[str] = []
    in_section = False
    for line in text.splitlines():
        if line.strip() in _SECTIONS and not line.startswith(" "):
            out += ["", f"**{line.strip()[:-1]}**", ""]
            in_section = True
        elif in_section and line.startswith("    ") and not line.startswith("        "):
            out.append(f"- {line.strip()}")
        elif in_section and line.startswith("        "):
            out[-1] += " " + line.strip()
        else:
            if line.strip():  # unindented text ends a section; a blank line does not
                in_section = False
            out.append(line)
    return "\n".join(out)


def _members(cls, shared: set[type]) -> list[tuple[str, object]]:
    """Public methods and properties of ``cls`` and of its fastseq base classes that are
    not documented apart (``shared``), each name once."""
    seen: dict[str, object] = {}
    for klass in cls.__mro__:
        if not klass.__module__.startswith("fastseq") or (klass in shared and klass is not cls):
            continue
        for name, value in vars(klass).items():
            if name in seen or (name.startswith("_") and name != "__call__"):
                continue
            if isinstance(value, (property, classmethod, staticmethod)) or inspect.isfunction(value):
                seen[name] = value
    return list(seen.items())


def _member_text(cls_name: str, name: str, value) -> list[str]:
    if isinstance(value, property):
        return [f"#### `{cls_name}.{name}` (property)", "", _doc(value.fget) or _doc(value), ""]
    func = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
    sig = _signature(func)
    if not isinstance(value, staticmethod):
        # Drop self / cls from the shown signature.
        sig = sig.replace("(self, ", "(").replace("(self)", "()").replace("(cls, ", "(").replace("(cls)", "()")
    kind = " (class method)" if isinstance(value, classmethod) else ""
    return [f"#### `{cls_name}.{name}{sig}`{kind}", "", _doc(func), ""]


def render() -> str:
    import fastseq

    errors, classes, functions, others = [], [], [], []
    for name in sorted(fastseq.__all__, key=str.lower):
        obj = getattr(fastseq, name)
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            errors.append((name, obj))
        elif inspect.isclass(obj):
            classes.append((name, obj))
        elif inspect.isfunction(obj) or inspect.isbuiltin(obj):
            functions.append((name, obj))
        else:
            others.append((name, obj))

    public = {cls for _, cls in classes}
    # fastseq base classes outside __all__ (the runtime API that ONNXSequential, ONNXModule
    # and Pipeline share) are documented once, apart.
    shared = sorted(
        {b for cls in public for b in cls.__mro__[1:] if b.__module__.startswith("fastseq") and b not in public},
        key=lambda b: b.__name__,
    )
    lines = [HEADER]
    lines += ["## Classes", ""]
    for name, cls in classes:
        lines += [f"### `fastseq.{name}{_signature(cls)}`", "", _doc(cls), ""]
        bases = [b for b in shared if issubclass(cls, b)]
        if bases:
            names = ", ".join(f"`{b.__module__}.{b.__name__}`" for b in bases)
            lines += [f"Also has the shared runtime API of {names} (below).", ""]
        for member, value in _members(cls, set(shared)):
            lines += _member_text(name, member, value)
    for base in shared:
        lines += [f"### `{base.__module__}.{base.__name__}` (shared runtime API)", "", _doc(base), ""]
        for member, value in _members(base, set(shared)):
            lines += _member_text(base.__name__, member, value)
    lines += ["## Functions", ""]
    for name, func in functions:
        lines += [f"### `fastseq.{name}{_signature(func)}`", "", _doc(func), ""]
    lines += ["## Errors", ""]
    for name, cls in errors:
        bases = ", ".join(b.__name__ for b in cls.__bases__)
        lines += [f"### `fastseq.{name}` ({bases})", "", _doc(cls), ""]
    lines += ["## Other names", ""]
    for name, obj in others:
        if inspect.ismodule(obj):
            lines += [f"### `fastseq.{name}` (module)", "", _doc(obj), ""]
        elif name == "__version__":  # its value changes with each release, not the API
            lines += [f"### `fastseq.{name}`", "", "The package version, a str.", ""]
        else:
            lines += [f"### `fastseq.{name}`", "", f"`{obj!r}` ({type(obj).__name__}).", ""]
    text = "\n".join(lines)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text.rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/api.md is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = TARGET.read_text() if TARGET.exists() else ""
        if current != text:
            print(f"{TARGET.relative_to(ROOT)} is out of date: run python tools/gen_api_docs.py", file=sys.stderr)
            return 1
        return 0
    TARGET.parent.mkdir(exist_ok=True)
    TARGET.write_text(text)
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
