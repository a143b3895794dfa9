"""Pipeline files: a :class:`~fastseq.graph.spec.PipelineSpec` graph as TOML, read with the
standard library's ``tomllib`` and written here (no dependency). The format::

    edges = ["pre.output -> backbone.input", "backbone.features -> cls.x"]
    outputs = ["cls.logits", "mask=seg.mask"]      # optional: default, every unconsumed output
    opset = 17                                      # optional conversion target
    providers = ["CPUExecutionProvider"]            # or { name = "...", device_id = 0 }

    [stages]                                        # in any order
    pre = "builtin:normalize"
    backbone = { source = "models/resnet.onnx", sha256 = "..." }   # relative to this file

    [inputs]
    image = ["pre.input", "seg.skip"]

    [session_options]                               # attributes, and "session.*" config entries
    intra_op_num_threads = 2
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastseq import _core
from fastseq.errors import ExportError, LoadError, PipelineFileError
from fastseq.graph.options import file_option, session_options, session_options_dict
from fastseq.graph.parts import META_KEYS, Stage
from fastseq.graph.spec import PipelineSpec

KEYS = (
    "stages", "edges", "inputs", "outputs", "opset", "ir_version", "metadata", "model_version",
    "external_data", "providers", "session_options", "prune", "dedupe", "adapt", "cache_dir",
)
_REMOTE = ("http://", "https://", "hf://", "builtin:")


#: No pipeline key nests deeper than this (providers = [{ name = ..., option = ... }] is 2).
MAX_DEPTH = 8
_SCALAR = (str, int, float, bool)


def read(path: str | os.PathLike[str]) -> PipelineSpec:
    """The pipeline described by the TOML file at ``path``; relative model paths resolve
    against the file's folder. Errors name the file and the key: a file that is not UTF-8
    TOML, or a key of the wrong type, is a :class:`~fastseq.PipelineFileError`."""
    file = Path(path).expanduser()
    origin = os.fspath(path)
    data = _load(file, origin)

    def bad(key: str, what: str) -> PipelineFileError:
        return PipelineFileError(f"{origin}: {key}: {what}")

    for key in data:
        if key not in KEYS:
            raise bad(key, f"not a pipeline key{_core.did_you_mean(key, list(KEYS))}")
    _check_depth(data, bad)
    stages = data.get("stages")
    if not isinstance(stages, dict) or not stages:
        raise bad("stages", "a [stages] table naming at least one model is needed")
    folder = file.parent

    def source(key: str, value: Any) -> Any:
        if not isinstance(value, str) or not value:
            raise bad(key, "expected a path, URL, hf:// id or builtin:NAME")
        if value.startswith(_REMOTE):
            return value
        p = Path(value).expanduser()
        return str(p if p.is_absolute() else folder / p)

    parsed: dict[str, Any] = {}
    for name, value in stages.items():
        key = f"stages.{name}"
        if isinstance(value, dict):
            if "source" in value:
                value = {**value, "source": source(key + ".source", value["source"])}
            if "sha256" in value and not _is_sha256(value["sha256"]):
                raise bad(key + ".sha256", f"expected 64 hex digits, got {_shown(value['sha256'])}")
            parsed[name] = value
        else:
            parsed[name] = source(key, value)
    options: dict[str, Any] = {}
    for key, kind, low, high in (
        ("opset", int, 1, 2**31 - 1),
        ("ir_version", int, 1, 2**31 - 1),
        ("model_version", int, 0, 2**63 - 1),
        ("cache_dir", str, None, None),
    ):
        if key in data:
            value = data[key]
            if key == "opset" and value == "highest":
                pass
            elif not isinstance(value, kind) or isinstance(value, bool):
                raise bad(key, f"expected {'an integer' if kind is int else 'a string'}, got {_shown(value)}")
            elif kind is int and not low <= value <= high:
                raise bad(key, f"expected an integer from {low} to {high}, got {value}")
            options[key] = value
    for key in ("prune", "dedupe"):
        if key in data:
            if not isinstance(data[key], bool):
                raise bad(key, "expected true or false")
            options[key] = data[key]
    if "external_data" in data:
        value = data["external_data"]
        modes = {"auto": None, "yes": True, "no": False, "reuse": "reuse", True: True, False: False}
        if not isinstance(value, (bool, str)) or value not in modes:
            raise bad("external_data", "expected true, false, \"auto\" or \"reuse\"")
        options["external_data"] = modes[value]
    if "metadata" in data:
        meta = data["metadata"]
        if not isinstance(meta, dict):
            raise bad("metadata", "expected a table")
        for k, v in meta.items():
            if k not in META_KEYS:
                raise bad(f"metadata.{k}", f"not a model field{_core.did_you_mean(k, list(META_KEYS))}")
            if not isinstance(v, _SCALAR):
                raise bad(f"metadata.{k}", f"expected a string, got {_shown(v)}")
        options["metadata"] = {k: str(v) for k, v in meta.items()}
    if "providers" in data:
        options["providers"] = _providers(data["providers"], bad)
    if "session_options" in data:
        table = data["session_options"]
        if not isinstance(table, dict):
            raise bad("session_options", "expected a table")
        for k, v in table.items():
            if not isinstance(v, _SCALAR):
                raise bad(f"session_options.{k}", f"expected a string, number or boolean, got {_shown(v)}")
        # Checked now, so that a typo is an error about this file, not at session start.
        try:
            session_options(table)
        except (LoadError, TypeError, ValueError, OverflowError) as e:
            raise bad("session_options", str(e)) from None
        # A pipeline file is shared input: it never names a file for ONNX Runtime to write.
        if found := file_option(table):
            raise bad(f"session_options.{found[0]}", f"a pipeline file cannot make ONNX Runtime write or read a "
                      f"file of its choosing; use {found[1]}")
        options["session_options"] = dict(table)
    for key, kind in (("edges", list), ("outputs", list), ("inputs", dict)):
        if key in data and not isinstance(data[key], kind):
            raise bad(key, f"expected {'a list of strings' if kind is list else 'a table'}")
    for key in ("edges", "outputs"):
        for i, item in enumerate(data.get(key, [])):
            if not isinstance(item, str):
                raise bad(f"{key}[{i}]", f"expected a string, got {_shown(item)}")
    for name, targets in data.get("inputs", {}).items():
        items = targets if isinstance(targets, list) else [targets]
        for j, item in enumerate(items):
            if not isinstance(item, str):
                where = f"inputs.{name}" + (f"[{j}]" if isinstance(targets, list) else "")
                raise bad(where, f"expected 'stage.input' or a list of them, got {_shown(item)}")
    adapt = data.get("adapt", False)
    if not isinstance(adapt, (bool, list)):
        raise bad("adapt", "expected true, false or a list of edges (indices or strings)")
    for i, item in enumerate(adapt if isinstance(adapt, list) else []):
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            raise bad(f"adapt[{i}]", f"expected an edge index or an edge string, got {_shown(item)}")
    return PipelineSpec.graph(
        parsed,
        data.get("edges", []),
        data.get("inputs"),
        data.get("outputs"),
        adapt=adapt,
        origin=origin,
        **options,
    )


def _load(file: Path, origin: str) -> dict[str, Any]:
    """The file's TOML table; anything but readable UTF-8 TOML is a PipelineFileError."""
    import tomllib

    try:
        # The core's open: a FIFO, a device or a folder is refused without blocking.
        with os.fdopen(_core.open_input(file), "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise PipelineFileError(f"{origin}: no such file") from None
    except OSError as e:
        raise PipelineFileError(f"{origin}: cannot be read: {e.strerror or e}") from None
    except LoadError as e:
        raise PipelineFileError(f"{origin}: cannot be read: {str(e).removeprefix(f'{file}: ')}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PipelineFileError(
            f"{origin}: not a pipeline file: not UTF-8 text (byte {e.start} is 0x{raw[e.start]:02x})"
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PipelineFileError(f"{origin}: not valid TOML: {e}") from None
    except RecursionError:
        key = _deepest_key(text)
        raise PipelineFileError(
            f"{origin}: {key or 'a value'}: nested deeper than any pipeline file (at most {MAX_DEPTH} levels)"
        ) from None


def _check_depth(data: dict[str, Any], bad) -> None:
    """Refuses values nested deeper than :data:`MAX_DEPTH`, naming the key (what reads them
    later need not guard against recursion)."""
    todo: list[tuple[str, Any, int]] = [(str(k), v, 1) for k, v in data.items()]
    while todo:
        key, value, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise bad(key, f"nested deeper than any pipeline file (at most {MAX_DEPTH} levels)")
        # The key named is the table entry (stages.a, metadata.name), not the path inside it.
        if isinstance(value, dict):
            todo += [(f"{key}.{k}" if depth < 2 else key, v, depth + 1) for k, v in value.items()]
        elif isinstance(value, list):
            todo += [(key, v, depth + 1) for v in value]


def _deepest_key(text: str) -> str | None:
    """The key whose value opens the most brackets, for a file too deep to parse: a rough
    scan (strings and comments skipped) that only has to name the culprit."""
    best, best_depth, table, key, depth = None, 0, "", None, 0
    for line in text.splitlines():
        if depth == 0:
            header = re.match(r"\s*\[\[?\s*([^\[\]]+?)\s*\]\]?\s*(#.*)?$", line)
            if header:
                table = header.group(1).replace('"', "").replace("'", "") + "."
                continue
            assignment = re.match(r"\s*([A-Za-z0-9_.\"' -]+?)\s*=", line)
            if assignment:
                key = table + assignment.group(1).replace('"', "").replace("'", "")
        quote = None
        for ch in line:
            if quote is not None:
                quote = None if ch == quote else quote
            elif ch in "\"'":
                quote = ch
            elif ch == "#":
                break
            elif ch in "[{":
                depth += 1
                if depth > best_depth:
                    best, best_depth = key, depth
            elif ch in "]}":
                depth = max(0, depth - 1)
    return best


def _is_sha256(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdefABCDEF" for c in value)


def _shown(value: Any) -> str:
    """A wrong value in a message: its type, and the value when it is short."""
    text = repr(value)
    return f"{type(value).__name__} {text}" if len(text) <= 40 else type(value).__name__


def _providers(value: Any, bad) -> list[Any]:
    if not isinstance(value, list):
        raise bad("providers", "expected a list of provider names or { name = ..., option = ... } tables")
    out: list[Any] = []
    for i, p in enumerate(value):
        if isinstance(p, str):
            out.append(p)
        elif isinstance(p, dict) and isinstance(p.get("name"), str):
            for k, v in p.items():
                if not isinstance(v, _SCALAR):
                    raise bad(f"providers[{i}].{k}", f"expected a string, number or boolean, got {_shown(v)}")
            out.append((p["name"], {k: v for k, v in p.items() if k != "name"}))
        else:
            raise bad(f"providers[{i}]", "expected a provider name or a table with a 'name'")
    return out


def write(spec: PipelineSpec, path: str | os.PathLike[str]) -> Path:
    """Writes ``spec`` (a graph) as TOML at ``path``, atomically. Model paths are written
    relative to the file's folder where they are below it; in-memory models (ModelProto,
    bytes, composed) are saved beside it as ``<file stem>.<stage>.onnx``."""
    if not spec.is_graph:
        raise TypeError("only a graph pipeline (named stages and edges) is written as a pipeline file")
    target = Path(path).expanduser()
    folder = target.parent.resolve()
    lines = ["# fastseq pipeline: stages, edges, exposed inputs and outputs"]
    top: dict[str, Any] = {"edges": [str(e) for e in spec.edges or []]}
    if spec.outputs is not None:
        top["outputs"] = [str(o) for o in spec.outputs]
    for key in ("opset", "ir_version", "model_version", "cache_dir"):
        if getattr(spec, key) is not None:
            top[key] = getattr(spec, key)
    for key in ("prune", "dedupe"):
        if getattr(spec, key) is not None:
            top[key] = getattr(spec, key)
    if spec.adapt:
        top["adapt"] = spec.adapt
    if spec.external_data is not None:
        top["external_data"] = spec.external_data
    if spec.providers:
        top["providers"] = [p if isinstance(p, str) else {"name": p[0], **p[1]} for p in spec.providers]
    for key, value in top.items():
        lines.append(f"{_key(key)} = {_value(value)}")
    lines += ["", "[stages]"]
    for st in spec.stages:
        assert st.name is not None
        src = _stage_source(st, target, folder)
        lines.append(f"{_key(st.name)} = " + (_value({"source": src, "sha256": st.sha256}) if st.sha256 else _value(src)))
    if spec.inputs:
        lines += ["", "[inputs]"]
        for name, targets in spec.inputs.items():
            lines.append(f"{_key(name)} = {_value([f'{s}.{i}' for s, i in targets])}")
    tables = {"session_options": _options_dict(spec.session_options), "metadata": spec.metadata}
    for name, table in tables.items():
        if table:
            lines += ["", f"[{name}]"] + [f"{_key(k)} = {_value(v)}" for k, v in table.items()]
    text = "\n".join(lines) + "\n"
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _stage_source(st: Stage, target: Path, folder: Path) -> str:
    src = st.source
    if isinstance(src, (str, os.PathLike)):
        text = os.fspath(src)
        if text.startswith(_REMOTE):
            return text
        p = Path(text).expanduser().resolve()
        try:
            return p.relative_to(folder).as_posix()
        except ValueError:
            return str(p)
    # An in-memory model gets a file beside the pipeline file.
    beside = target.with_name(f"{target.stem}.{st.name}.onnx")
    if isinstance(src, _core.Composed):
        src.save(str(beside), external_data=False)
    else:
        from fastseq.sources import resolve as loader

        data = loader.resolve_local(src, 0).data
        if not isinstance(data, bytes):
            raise TypeError(f"stage {st.name}: cannot write a {type(src).__name__} to a file")
        _core.commit_bytes(data, str(beside))
    return beside.name


def _options_dict(options: Any) -> dict[str, Any]:
    if found := file_option(options):  # the file would not load: say so now
        raise ExportError(f"session_options.{found[0]} cannot go into a pipeline file (ONNX Runtime would write or "
                          f"read a file of the pipeline file's choosing); use {found[1]}")
    if options is None or isinstance(options, Mapping):
        return dict(options or {})
    return session_options_dict(options)


_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k: str) -> str:
    return k if _BARE.match(k) else _string(k)


def _string(s: str) -> str:
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _value(v: Any) -> str:
    """One TOML value: strings, booleans, numbers, arrays and inline tables."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{_key(str(k))} = {_value(x)}" for k, x in v.items() if x is not None) + " }"
    raise TypeError(f"cannot write a {type(v).__name__} to a pipeline file")
