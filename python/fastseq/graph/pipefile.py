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
from fastseq.errors import LoadError
from fastseq.graph.options import session_options, session_options_dict
from fastseq.graph.parts import META_KEYS, Stage
from fastseq.graph.spec import PipelineSpec

KEYS = (
    "stages", "edges", "inputs", "outputs", "opset", "ir_version", "metadata", "model_version",
    "external_data", "providers", "session_options", "prune", "dedupe", "adapt", "cache_dir",
)
_REMOTE = ("http://", "https://", "hf://", "builtin:")


def read(path: str | os.PathLike[str]) -> PipelineSpec:
    """The pipeline described by the TOML file at ``path``; relative model paths resolve
    against the file's folder. Errors name the file and the key."""
    import tomllib

    file = Path(path).expanduser()
    origin = os.fspath(path)
    try:
        with open(file, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise LoadError(f"{origin}: no such file") from None
    except tomllib.TOMLDecodeError as e:
        raise LoadError(f"{origin}: not valid TOML: {e}") from None

    def bad(key: str, what: str) -> LoadError:
        return LoadError(f"{origin}: {key}: {what}")

    for key in data:
        if key not in KEYS:
            raise bad(key, f"not a pipeline key{_core.did_you_mean(key, list(KEYS))}")
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
            parsed[name] = value
        else:
            parsed[name] = source(key, value)
    options: dict[str, Any] = {}
    for key, kind in (("opset", int), ("ir_version", int), ("model_version", int), ("cache_dir", str)):
        if key in data:
            if not isinstance(data[key], kind) or isinstance(data[key], bool):
                if not (key == "opset" and data[key] == "highest"):
                    raise bad(key, f"expected {'an integer' if kind is int else 'a string'}")
            options[key] = data[key]
    for key in ("prune", "dedupe"):
        if key in data:
            if not isinstance(data[key], bool):
                raise bad(key, "expected true or false")
            options[key] = data[key]
    if "external_data" in data:
        value = data["external_data"]
        modes = {"auto": None, "yes": True, "no": False, "reuse": "reuse", True: True, False: False}
        if value not in modes:
            raise bad("external_data", "expected true, false, \"auto\" or \"reuse\"")
        options["external_data"] = modes[value]
    if "metadata" in data:
        meta = data["metadata"]
        if not isinstance(meta, dict):
            raise bad("metadata", "expected a table")
        for k in meta:
            if k not in META_KEYS:
                raise bad(f"metadata.{k}", f"not a model field{_core.did_you_mean(k, list(META_KEYS))}")
        options["metadata"] = {k: str(v) for k, v in meta.items()}
    if "providers" in data:
        options["providers"] = _providers(data["providers"], bad)
    if "session_options" in data:
        if not isinstance(data["session_options"], dict):
            raise bad("session_options", "expected a table")
        # Checked now, so that a typo is an error about this file, not at session start.
        try:
            session_options(data["session_options"])
        except (LoadError, TypeError, ValueError) as e:
            raise bad("session_options", str(e)) from None
        options["session_options"] = dict(data["session_options"])
    for key, kind in (("edges", list), ("outputs", list), ("inputs", dict)):
        if key in data and not isinstance(data[key], kind):
            raise bad(key, f"expected {'a list of strings' if kind is list else 'a table'}")
    adapt = data.get("adapt", False)
    if not isinstance(adapt, (bool, list)):
        raise bad("adapt", "expected true, false or a list of edges (indices or strings)")
    return PipelineSpec.graph(
        parsed,
        data.get("edges", []),
        data.get("inputs"),
        data.get("outputs"),
        adapt=adapt,
        origin=origin,
        **options,
    )


def _providers(value: Any, bad) -> list[Any]:
    if not isinstance(value, list):
        raise bad("providers", "expected a list of provider names or { name = ..., option = ... } tables")
    out: list[Any] = []
    for i, p in enumerate(value):
        if isinstance(p, str):
            out.append(p)
        elif isinstance(p, dict) and isinstance(p.get("name"), str):
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
