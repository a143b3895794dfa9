"""Writing a :class:`~fastseq.graph.spec.PipelineSpec` as a pipeline file (TOML, written
here: the standard library reads TOML but does not write it), the models it holds in memory
saved beside it; :mod:`.pipefile` reads them back."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastseq import _core
from fastseq.errors import ExportError
from fastseq.graph.parts import Stage
from fastseq.graph.pipefile import REMOTE
from fastseq.graph.session_settings import refuse_file_options, session_options_dict
from fastseq.graph.spec import PipelineSpec


def write(spec: PipelineSpec, path: str | os.PathLike[str]) -> Path:
    """Writes ``spec`` (a graph, or a chain of named stages) as TOML at ``path``. Model
    paths are written relative to the file's folder where they are below it; in-memory
    models (ModelProto, bytes, composed) are saved beside it as ``<file stem>.<stage>.onnx``.
    Every file goes through the core's writer: each is checked before any is written (an
    ExportError names the first that cannot be), a file beside it is replaced only if
    fastseq wrote it for this pipeline file, and the pipeline file is written last."""
    if not spec.is_graph and any(st.name is None for st in spec.stages):
        raise TypeError(
            "only a pipeline of named stages (a graph, or a chain read from a file) is written as a pipeline file"
        )
    target = Path(path).expanduser()
    _core.check_target(str(target))
    folder = target.parent.resolve()
    beside: list[tuple[Path, bytes]] = []  # in-memory models, written beside the file first
    lines = ["# fastseq pipeline: stages, " + ("edges, exposed inputs and outputs" if spec.is_graph else "in order")]
    top: dict[str, Any] = {}
    if spec.is_graph:
        top["edges"] = [str(e) for e in spec.edges or []]
        if spec.outputs is not None:
            top["outputs"] = [str(o) for o in spec.outputs]
    else:
        top["chain"] = _chain_entries(spec)
    for key in ("opset", "ir_version", "model_version", "cache_dir"):
        if getattr(spec, key) is not None:
            top[key] = getattr(spec, key)
    for key in ("row_independent", "dynamic_batch"):
        if getattr(spec, key):
            top[key] = True
    for key in ("prune", "dedupe"):
        value = getattr(spec, key)
        if (spec.is_graph and value is not None) or (not spec.is_graph and not value):  # a chain's are on in a file
            top[key] = bool(value)
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
        src = _stage_source(st, target, folder, beside)
        lines.append(
            f"{_key(st.name)} = " + (_value({"source": src, "sha256": st.sha256}) if st.sha256 else _value(src))
        )
    if spec.inputs:
        lines += ["", "[inputs]"]
        for name, targets in spec.inputs.items():
            lines.append(f"{_key(name)} = {_value([f'{s}.{i}' for s, i in targets])}")
    tables = {"session_options": _options_dict(spec.session_options), "metadata": spec.metadata}
    for name, table in tables.items():
        if table:
            lines += ["", f"[{name}]"] + [f"{_key(k)} = {_value(v)}" for k, v in table.items()]
    text = "\n".join(lines) + "\n"
    for file, _ in beside:
        _core.check_target(str(file), owner=target.name)
    for file, data in beside:
        _core.commit_bytes(data, str(file), owner=target.name)
    _core.commit_bytes(text.encode("utf-8"), str(target))
    return target


def _chain_entries(spec: PipelineSpec) -> list[Any]:
    """A chain's stages as ``chain`` lists them: names, with each joint's io_map if any."""
    names = [st.name for st in spec.stages]
    if spec.io_maps is None:
        return names
    return [names[0]] + [
        name if pairs is None else {"stage": name, "io_map": [f"{o}:{i}" for o, i in pairs]}
        for name, pairs in zip(names[1:], spec.io_maps)
    ]


def _stage_source(st: Stage, target: Path, folder: Path, beside: list[tuple[Path, bytes]]) -> str:
    """How the file names a stage's source; an in-memory model is added to ``beside``."""
    src = st.source
    if isinstance(src, (str, os.PathLike)):
        text = os.fspath(src)
        if text.startswith(REMOTE):
            return text
        p = Path(text).expanduser().resolve()
        try:
            return p.relative_to(folder).as_posix()
        except ValueError:
            return str(p)
    from fastseq.ops import Operator, to_string

    if isinstance(src, Operator) and src.fit is not None:  # kept as a string, to take its rank when read
        return "builtin:" + to_string(*src.fit)
    # An in-memory model gets a file beside the pipeline file.
    assert st.name is not None
    name = f"{target.stem}.{st.name}.onnx"
    if "/" in name or "\0" in name:
        raise ExportError(
            f"cannot write {target}: stage '{st.name}' holds a model in memory, which is saved beside "
            f"the file under the stage's name, and '{name}' is no file name; rename the stage"
        )
    if isinstance(src, _core.Composed):
        data = src.to_bytes()
    else:
        from fastseq.sources import resolve as loader

        resolved = loader.resolve_local(src, 0).data
        if not isinstance(resolved, bytes):
            raise TypeError(f"stage {st.name}: cannot write a {type(src).__name__} to a file")
        data = resolved
    beside.append((target.with_name(name), data))
    return name


def _options_dict(options: Any) -> dict[str, Any]:
    refuse_file_options(options, ExportError)  # the pipeline file would not load
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
