"""Writes ``python/fastseq/_core.pyi`` from the built extension, so that the stub says what
the bindings are, never what someone remembered them to be.

The bindings crate builds with PyO3's ``experimental-inspect``: each function, method and
class carries, in the extension's own binary, a JSON record of its parameters, defaults,
type annotations, return type and docstring (the records ``pyo3-introspection`` reads). This
tool reads those records (ELF symbols ``PYO3_INTROSPECTION_1_*``) and the module itself
(its names, constants and exception classes, which the module's init adds), and renders the
stub. ``tests/base/test_core_stub.py`` renders it again and fails when the file differs.

    python tools/gen_stubs.py            # rewrites python/fastseq/_core.pyi
    python tools/gen_stubs.py --check    # exits 1 when the file is not what it would write

Run it after ``maturin develop`` whenever the bindings change.
"""

from __future__ import annotations

import inspect
import json
import struct
import sys
from pathlib import Path
from typing import Any

STUB = Path(__file__).resolve().parent.parent / "python" / "fastseq" / "_core.pyi"

#: Names the stub gives to a type that many parameters share; each must match the rendering
#: of an annotation the extension records (else the tool fails: the alias is stale).
ALIASES = {
    "Source": "bytes | str | os.PathLike[str] | tuple[str | os.PathLike[str], str | os.PathLike[str]] | Composed",
}

#: Builtin containers as PyO3 records an untyped ``PyDict``, ``PyList``, ...: written with
#: their parameters (items of any type), as a strict type checker wants every generic.
UNTYPED = {
    "dict": "dict[typing.Any, typing.Any]",
    "list": "list[typing.Any]",
    "set": "set[typing.Any]",
    "frozenset": "frozenset[typing.Any]",
    "tuple": "tuple[typing.Any, ...]",
}

#: The longest `def` line before its parameters go one a line.
LINE = 100

#: Modules an annotation may name (rendered qualified, imported at the top).
MODULES = ("_typeshed", "collections.abc", "os", "pathlib", "typing")

HEADER = '''"""Type stubs for the Rust extension module ``fastseq._core``, written by
``tools/gen_stubs.py`` from the extension itself (the signatures, types and docstrings
PyO3 records in it, and the module's own names): do not edit by hand; run the tool after
changing the bindings (``tests/base/test_core_stub.py`` fails when this file drifts)."""
'''


def introspection_records(library: Path) -> list[dict[str, Any]]:
    """The JSON records PyO3's ``experimental-inspect`` put in the extension ``library``
    (a little-endian ELF64 shared object: each record is a symbol
    ``PYO3_INTROSPECTION_1_<id>`` pointing at a 32-bit length and that many bytes of JSON)."""
    data = library.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{library}: not a little-endian 64-bit ELF file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    # (type, addr, offset, size, link) of each section
    sections = []
    for i in range(shnum):
        _, kind, _, addr, offset, size, link, _, _, _ = struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
        sections.append((kind, addr, offset, size, link))
    records: dict[str, dict[str, Any]] = {}
    for kind, _, offset, size, link in sections:
        if kind not in (2, 11):  # SHT_SYMTAB, SHT_DYNSYM
            continue
        strings = sections[link][2]
        for k in range(size // 24):
            name_at, _, _, shndx, value, _ = struct.unpack_from("<IBBHQQ", data, offset + k * 24)
            end = data.index(b"\0", strings + name_at)
            name = data[strings + name_at : end].decode()
            if not name.lstrip("_").startswith("PYO3_INTROSPECTION_1_") or name in records:
                continue
            _, sec_addr, sec_offset, _, _ = sections[shndx]
            at = value - sec_addr + sec_offset
            (length,) = struct.unpack_from("<I", data, at)
            records[name] = json.loads(data[at + 4 : at + 4 + length])
    return list(records.values())


class Renderer:
    def __init__(self, records: list[dict[str, Any]], module: Any) -> None:
        self.module = module
        self.classes = {r["id"]: r for r in records if r["type"] == "class"}
        self.functions = [r for r in records if r["type"] == "function"]
        self.used_aliases: set[str] = set()

    # --- expressions -------------------------------------------------------------------
    def expr(self, e: dict[str, Any], annotation: bool = True, head: bool = False) -> str:
        """``e`` as the stub writes it; ``head``: the generic of a subscript (``dict`` of
        ``dict[str, int]``), written bare."""
        kind = e["type"]
        if kind == "constant":
            k = e["kind"]
            if k == "none":
                return "None"
            if k == "ellipsis":
                return "..."
            if k == "bool":
                return "True" if e["value"] else "False"
            if k == "str":
                # A string annotation is a type written as text: the stub takes it as it is.
                return e["value"] if annotation else repr(e["value"])
            return str(e["value"])
        if kind == "name":
            return e["id"]
        if kind == "attribute":
            value = self.expr(e["value"])
            if value == "builtins" and annotation and not head and e["attr"] in UNTYPED:
                return UNTYPED[e["attr"]]
            return e["attr"] if value == "builtins" else f"{value}.{e['attr']}"
        if kind == "id":
            return self.classes[e["id"]]["name"]
        if kind == "subscript":
            inner = e["slice"]
            if inner["type"] == "tuple":
                items = ", ".join(self.expr(x) for x in inner["elts"]) or "()"
            else:
                items = self.expr(inner)
            return f"{self.expr(e['value'], head=True)}[{items}]"
        if kind == "tuple":
            items = [self.expr(x) for x in e["elts"]]
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        if kind == "list":
            return "[" + ", ".join(self.expr(x) for x in e["elts"]) + "]"
        if kind == "binop" and e["op"] == "bitor":
            parts: list[str] = []
            for side in (e["left"], e["right"]):
                for p in self.expr(side).split(" | ") if side["type"] == "binop" else [self.expr(side)]:
                    if p not in parts:
                        parts.append(p)
            return " | ".join(parts)
        raise ValueError(f"an expression the stub cannot render: {e}")

    def annotation(self, e: dict[str, Any]) -> str:
        text = self.expr(e)
        for alias, value in ALIASES.items():
            if value in text:
                self.used_aliases.add(alias)
                text = text.replace(value, alias)
        return text

    # --- definitions -------------------------------------------------------------------
    def function(self, r: dict[str, Any], runtime: Any, indent: str = "") -> list[str]:
        args = r["arguments"]
        defaults = {}
        try:
            defaults = {p.name: p.default for p in inspect.signature(runtime).parameters.values()}
        except (TypeError, ValueError):
            pass
        params: list[str] = []

        def param(a: dict[str, Any]) -> str:
            text = a["name"]
            if "annotation" in a:
                text += f": {self.annotation(a['annotation'])}"
            if "default" in a:
                default = self.expr(a["default"], annotation=False)
                if default == "..." and defaults.get(a["name"], inspect.Parameter.empty) is not inspect.Parameter.empty:
                    default = repr(defaults[a["name"]])  # a value computed in Rust: the runtime's
                text += f" = {default}"
            return text

        for a in args.get("posonlyargs", []):
            params.append(param(a))
        if any(a["name"] != "self" for a in args.get("posonlyargs", [])):
            params.append("/")
        params += [param(a) for a in args.get("args", [])]
        if "vararg" in args:
            params.append("*" + param(args["vararg"]))
        elif args.get("kwonlyargs"):
            params.append("*")
        params += [param(a) for a in args.get("kwonlyargs", [])]
        if "kwarg" in args:
            params.append("**" + param(args["kwarg"]))
        returns = f" -> {self.annotation(r['returns'])}" if "returns" in r else ""
        out = [f"{indent}@{self.expr(d)}" for d in r.get("decorators", [])]
        head = f"{indent}def {r['name']}({', '.join(params)}){returns}:"
        if len(head) > LINE:  # one parameter a line
            inner = "".join(f"{indent}    {p},\n" for p in params)
            head = f"{indent}def {r['name']}(\n{inner}{indent}){returns}:"
        doc = r.get("doc")
        if not doc:
            return [*out, head + " ..."]
        return [*out, head, *docstring(doc, indent + "    ")]

    def pyclass(self, r: dict[str, Any]) -> list[str]:
        cls = getattr(self.module, r["name"])
        bases = ", ".join(self.expr(b) for b in r.get("bases", []))
        out = [f"@{self.expr(d)}" for d in r.get("decorators", [])]
        out.append(f"class {r['name']}({bases}):" if bases else f"class {r['name']}:")
        if r.get("doc"):
            out += docstring(r["doc"], "    ")
        members = [f for f in self.functions if f.get("parent") == r["id"]]
        # Properties first, then methods, each in name order (the records have no order).
        members.sort(key=lambda f: ({"name": "property"} not in f.get("decorators", []), f["name"]))
        for f in members:
            out.append("")
            out += self.function(f, getattr(cls, f["name"], None), "    ")
        return out

    def render(self) -> str:
        names = list(self.module.__all__)
        by_name = {r["name"]: r for r in self.functions if "parent" not in r}
        class_by_name = {r["name"]: r for r in self.classes.values()}
        constants, exceptions, classes, functions = [], [], [], []
        for name in names:
            value = getattr(self.module, name)
            if isinstance(value, type) and issubclass(value, BaseException):
                exceptions.append(reexport(name, value))
            elif isinstance(value, type):
                if name not in class_by_name:
                    raise ValueError(f"_core.{name}: a class without introspection records")
                classes.append(self.pyclass(class_by_name[name]))
            elif callable(value):
                if name not in by_name:
                    raise ValueError(f"_core.{name}: a function without introspection records")
                functions.append(self.function(by_name[name], value))
            else:
                constants.append(f"{name}: {type(value).__name__}")
        blocks = [*classes, *functions]
        body = "\n".join(constants) + "\n"
        if exceptions:
            body += (
                "\n# The error classes are defined in fastseq/errors.py (so that they print and pickle as\n"
                "# fastseq.<Name>); the core raises them and re-exports these.\n" + "\n".join(exceptions) + "\n"
            )
        for alias in sorted(self.used_aliases):
            body += f"\n{alias} = {ALIASES[alias]}\n"
        for block in blocks:
            body += "\n\n" + "\n".join(block) + "\n"
        stale = set(ALIASES) - self.used_aliases
        if stale:
            raise ValueError(f"ALIASES {sorted(stale)} match no annotation of the extension: update them")
        imports = [f"import {m}" for m in MODULES if f"{m}." in body]
        return HEADER + "\n" + "\n".join(imports) + "\n\n" + body


def reexport(name: str, cls: type) -> str:
    """An exception class the module re-exports from ``fastseq.errors`` (its init adds them:
    no records), as the stub imports it."""
    import fastseq.errors

    if getattr(fastseq.errors, name, None) is not cls:
        raise ValueError(f"_core.{name}: an exception class that fastseq.errors does not define")
    return f"from fastseq.errors import {name} as {name}"


def docstring(text: str, indent: str) -> list[str]:
    text = text.strip().replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    lines = text.splitlines() or [""]
    if len(lines) == 1:
        return [f'{indent}"""{lines[0]}"""']
    return [f'{indent}"""{lines[0]}', *[f"{indent}{line}" if line else "" for line in lines[1:]], f'{indent}"""']


def render() -> str:
    """The stub of the ``fastseq._core`` this interpreter imports."""
    from fastseq import _core

    return Renderer(introspection_records(Path(_core.__file__)), _core).render()


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if STUB.read_text() != text:
            print(f"{STUB} is not what the extension says: run python tools/gen_stubs.py", file=sys.stderr)
            return 1
        return 0
    STUB.write_text(text)
    print(f"wrote {STUB}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
