"""Pipeline files: a :class:`~fastseq.graph.spec.PipelineSpec` as TOML, read here with the
standard library's ``tomllib`` (:mod:`.pipefile_write` writes them). Stages that run one after
another are a chain, each feeding the next by position (``io_map`` joins one joint by name,
where that joint needs it; the others still join by position)::

    chain = ["pre", "backbone", { stage = "head", io_map = ["features:x"] }]

    [stages]
    pre = "builtin:normalize?"
    backbone = "models/resnet.onnx"
    head = "head.onnx"

A graph names each connection instead::

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

A file may name several pipelines, one table each (what ``fastseq serve`` serves, each under
its name)::

    [pipelines.detect]
    chain = ["pre", "det"]
    stages = { pre = "builtin:normalize", det = "det.onnx" }

    [pipelines.classify.stages]
    cls = "cls.onnx"
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastseq import _core
from fastseq.errors import LoadError, PipelineFileError
from fastseq.graph.parts import META_KEYS
from fastseq.graph.session_settings import refuse_file_options, session_options
from fastseq.graph.spec import PipelineSpec

#: Sources kept as written (not paths relative to the file).
REMOTE = ("http://", "https://", "hf://", "builtin:")
KEYS = (
    "stages",
    "chain",
    "edges",
    "inputs",
    "outputs",
    "opset",
    "ir_version",
    "metadata",
    "model_version",
    "external_data",
    "providers",
    "session_options",
    "prune",
    "dedupe",
    "adapt",
    "cache_dir",
    "row_independent",
    "dynamic_batch",
)


#: No pipeline key nests deeper than this (providers = [{ name = ..., option = ... }] is 2).
MAX_DEPTH = 8
_SCALAR = (str, int, float, bool)


def read(path: str | os.PathLike[str]) -> PipelineSpec:
    """The pipeline described by the TOML file at ``path``; relative model paths resolve
    against the file's folder. Errors name the file and the key: a file that is not UTF-8
    TOML, or a key of the wrong type, is a :class:`~fastseq.PipelineFileError`. A file of
    several pipelines (``[pipelines.NAME]`` tables) is :func:`read_all`'s."""
    file = Path(path).expanduser()
    origin = os.fspath(path)
    data = _load(file, origin)
    if "pipelines" in data:
        raise PipelineFileError(
            f"{origin}: pipelines: this file names several pipelines ("
            + ", ".join(map(str, data["pipelines"]))
            + "): `fastseq serve` serves each; "
            "elsewhere, give a file of one pipeline"
        )
    return _parse(data, file.parent, origin, "")


def read_all(path: str | os.PathLike[str]) -> dict[str, PipelineSpec]:
    """The pipelines of the TOML file at ``path`` by name: each ``[pipelines.NAME]`` table is
    one pipeline, with the keys of a file of one (``stages``, ``edges`` or ``chain``, ...);
    a file of one pipeline is that pipeline under the file's stem. Errors name the file and
    the key (``pipelines.detect.edges[2]``)."""
    file = Path(path).expanduser()
    origin = os.fspath(path)
    data = _load(file, origin)
    if "pipelines" not in data:
        return {file.stem: _parse(data, file.parent, origin, "")}
    tables = data["pipelines"]
    others = [k for k in data if k != "pipelines"]
    if others:
        raise PipelineFileError(
            f"{origin}: {others[0]}: a file of several pipelines holds only [pipelines.NAME] "
            "tables; put the key in each pipeline's table"
        )
    if not isinstance(tables, dict) or not tables or not all(isinstance(t, dict) for t in tables.values()):
        raise PipelineFileError(f"{origin}: pipelines: expected one [pipelines.NAME] table per pipeline")
    return {name: _parse(table, file.parent, origin, f"pipelines.{name}.") for name, table in tables.items()}


def _parse(data: dict[str, Any], folder: Path, origin: str, prefix: str) -> PipelineSpec:
    """The pipeline of one table of a pipeline file; its keys are named ``prefix + key``."""

    def bad(key: str, what: str) -> PipelineFileError:
        return PipelineFileError(f"{origin}: {prefix}{key}: {what}")

    for key in data:
        if key not in KEYS:
            raise bad(key, f"not a pipeline key{_core.did_you_mean(key, list(KEYS))}")
    _check_depth(data, bad)
    stages = data.get("stages")
    if not isinstance(stages, dict) or not stages:
        raise bad("stages", "a [stages] table naming at least one model is needed")

    def source(key: str, value: Any) -> Any:
        if not isinstance(value, str) or not value:
            raise bad(key, "expected a path, URL, hf:// id or builtin:NAME")
        if value.startswith(REMOTE):
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
    bounds: tuple[tuple[str, type, Any, Any], ...] = (
        ("opset", int, 1, 2**31 - 1),
        ("ir_version", int, 1, 2**31 - 1),
        ("model_version", int, 0, 2**63 - 1),
        ("cache_dir", str, None, None),
    )
    for key, kind, low, high in bounds:
        if key in data:
            value = data[key]
            if key == "opset" and value == "highest":
                pass
            elif not isinstance(value, kind) or isinstance(value, bool):
                raise bad(key, f"expected {'an integer' if kind is int else 'a string'}, got {_shown(value)}")
            elif kind is int and not low <= value <= high:
                raise bad(key, f"expected an integer from {low} to {high}, got {value}")
            options[key] = value
    for key in ("prune", "dedupe", "row_independent", "dynamic_batch"):
        if key in data:
            if not isinstance(data[key], bool):
                raise bad(key, "expected true or false")
            options[key] = data[key]
    if "external_data" in data:
        value = data["external_data"]
        modes = {"auto": None, "yes": True, "no": False, "reuse": "reuse", True: True, False: False}
        if not isinstance(value, (bool, str)) or value not in modes:
            raise bad("external_data", 'expected true, false, "auto" or "reuse"')
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
            refuse_file_options(table)  # a pipeline file is shared input: it names no file for ONNX Runtime
        except (LoadError, TypeError, ValueError, OverflowError) as e:
            raise bad("session_options", str(e)) from None
        options["session_options"] = dict(table)
    for key, container in (("edges", list), ("outputs", list), ("inputs", dict)):
        if key in data and not isinstance(data[key], container):
            raise bad(key, f"expected {'a list of strings' if container is list else 'a table'}")
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
    if "chain" in data:
        return _chain(data, parsed, adapt, options, origin, bad)
    return PipelineSpec.graph(
        parsed,
        data.get("edges", []),
        data.get("inputs"),
        data.get("outputs"),
        adapt=adapt,
        origin=origin,
        **options,
    )


def _chain(
    data: dict[str, Any],
    stages: dict[str, Any],
    adapt: Any,
    options: dict[str, Any],
    origin: str,
    bad: Callable[[str, str], PipelineFileError],
) -> PipelineSpec:
    """The chain form: ``chain`` lists every stage once, in the order they run; each is a
    stage name, or ``{ stage = NAME, io_map = ["OUT:IN", ...] }`` to join it to the one
    before by name; a joint without one joins by position, as ONNXSequential does."""
    from fastseq.errors import CompositionError
    from fastseq.graph.parse import _stage, _Where, parse_io_pair

    for given in (k for k in ("edges", "inputs", "outputs") if k in data):
        raise bad(
            given,
            "belongs to the graph form: a chain runs its stages in order and exposes the last one's "
            "outputs; write edges (and inputs, outputs) instead of chain to name each connection",
        )
    chain = data["chain"]
    if not isinstance(chain, list) or not chain:
        raise bad("chain", 'expected the stages in the order they run, e.g. chain = ["pre", "model", "head"]')
    order: list[str] = []
    maps: list[list[tuple[str, str]] | None] = []
    for i, item in enumerate(chain):
        key = f"chain[{i}]"
        pairs = None
        if isinstance(item, dict):
            unknown = sorted(set(item) - {"stage", "io_map"})
            if unknown or "stage" not in item:
                what = (
                    f"'{unknown[0]}' is not a key{_core.did_you_mean(unknown[0], ['stage', 'io_map'])}"
                    if unknown
                    else "needs a 'stage'"
                )
                raise bad(key, what + ' (keys: stage, io_map: { stage = "head", io_map = ["features:x"] })')
            if "io_map" in item:
                if i == 0:
                    raise bad(key + ".io_map", "the first stage has no stage before it to join")
                if not isinstance(item["io_map"], list):
                    raise bad(
                        key + ".io_map", f'expected a list of "OUTPUT:INPUT" strings, got {_shown(item["io_map"])}'
                    )
                try:
                    pairs = [parse_io_pair(p, f"{origin}: {key}.io_map[{j}]: ") for j, p in enumerate(item["io_map"])]
                except CompositionError as e:
                    raise PipelineFileError(str(e)) from None
            item = item["stage"]
        if not isinstance(item, str):
            raise bad(key, f"expected a stage name, got {_shown(item)}")
        if item not in stages:
            raise bad(key, f"no stage named '{item}'{_core.did_you_mean(item, list(stages))} in [stages]")
        if item in order:
            raise bad(key, f"'{item}' is in the chain twice (chain[{order.index(item)}]); each stage runs once")
        order.append(item)
        if i:
            maps.append(pairs)
    left = [name for name in stages if name not in order]
    if left:
        raise bad(
            "chain",
            f"stage{'s' * (len(left) > 1)} {', '.join(left)} of [stages] {'are' if len(left) > 1 else 'is'}"
            " not in the chain; list each stage where it runs",
        )
    named = any(m is not None for m in maps)  # the other joints join by position
    if isinstance(adapt, list) and any(isinstance(a, str) for a in adapt):
        raise bad("adapt", "a chain's adapters are given as true or as edge indices (fastseq inspect lists them)")
    try:
        parsed = [_stage(name, stages[name], _Where(origin)) for name in order]
    except CompositionError as e:
        raise PipelineFileError(str(e)) from None
    # prune and dedupe as in the graph form: a file is one or the other
    return PipelineSpec(
        parsed,
        io_maps=maps if named else None,
        adapt=adapt,
        origin=origin,
        **{"prune": True, "dedupe": True, **options},
    )


def _load(file: Path, origin: str) -> dict[str, Any]:
    """The file's TOML table; anything but readable UTF-8 TOML is a PipelineFileError."""
    import tomllib

    try:
        with os.fdopen(_core.open_input(file), "rb") as f:  # the core's open: a FIFO is refused, never waited on
            raw = f.read()
    except FileNotFoundError:
        from fastseq.sources.resolve import near_path

        raise PipelineFileError(f"{origin}: no such file{near_path(file)}") from None
    except (OSError, LoadError) as e:  # a LoadError: not a regular file
        why = getattr(e, "strerror", None) or str(e).removeprefix(f"{file}: ")
        raise PipelineFileError(f"{origin}: cannot be read: {why}") from None
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


def _check_depth(data: dict[str, Any], bad: Callable[[str, str], PipelineFileError]) -> None:
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


def _providers(value: Any, bad: Callable[[str, str], PipelineFileError]) -> list[Any]:
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
