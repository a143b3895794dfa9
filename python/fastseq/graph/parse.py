"""The user's strings and shapes to the description's parts: ``"a.out -> b.in"``,
``"name=b.out"``, stage entries and kornia's ``io_maps`` forms. Errors name the key the text
came from (``pipeline.toml: edges[2]: ...``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from fastseq import _core
from fastseq.errors import CompositionError
from fastseq.graph.parts import Edge, Exposed, Stage


class _Where:
    """Where a name was written: ``pipeline.toml: edges[2]: `` for messages."""

    def __init__(self, origin: str | None) -> None:
        self.origin = origin

    def key(self, key: str) -> str:
        return f"{self.origin}: {key}: " if self.origin else f"{key}: "


def _stage(name: Any, value: Any, at: _Where) -> Stage:
    if not isinstance(name, str) or not name.strip() or name != name.strip():
        raise CompositionError(at.key("stages") + f"{name!r} is not a stage name (a non-empty string)")
    for bad in ("->", "=", " ", ","):
        if bad in name:
            raise CompositionError(at.key(f"stages.{name}") + f"a stage name may not contain {bad!r}")
    if isinstance(value, Stage):
        return replace(value, name=name)
    if isinstance(value, Mapping):
        unknown = set(value) - {"source", "sha256"}
        if unknown or "source" not in value:
            extra = sorted(unknown)[0] if unknown else "source"
            hint = _core.did_you_mean(extra, ["source", "sha256"]) if unknown else ""
            what = f"'{extra}' is not a stage key{hint}" if unknown else "needs a 'source'"
            raise CompositionError(at.key(f"stages.{name}") + what + " (keys: source, sha256)")
        return Stage(name, value["source"], value.get("sha256"))
    return Stage(name, value)


def parse_port(text: Any, stages: Sequence[str], where: str) -> tuple[str, str]:
    """``"stage.name"`` -> (stage, name). Tensor names may contain dots: the stage is the
    longest known stage name followed by a dot."""
    if isinstance(text, tuple) and len(text) == 2:
        stage, name = map(str, text)
        if stage not in stages:
            raise CompositionError(where + f"no stage named '{stage}'{_core.did_you_mean(stage, list(stages))}")
        return stage, name
    if not isinstance(text, str):
        raise CompositionError(where + f"expected 'stage.name', got {type(text).__name__}")
    text = text.strip()
    known = [s for s in stages if text.startswith(s + ".") and len(text) > len(s) + 1]
    if known:
        stage = max(known, key=len)
        return stage, text[len(stage) + 1 :]
    head = text.split(".", 1)[0]
    if "." not in text or not head:
        raise CompositionError(where + f"'{text}': expected 'stage.name' (stages: {', '.join(stages)})")
    return_hint = _core.did_you_mean(head, list(stages))
    raise CompositionError(where + f"'{text}': no stage named '{head}'{return_hint}")


def parse_edge(text: Any, stages: Sequence[str], where: str) -> Edge:
    """``"a.out -> b.in"`` (or an Edge, or ((a, out), (b, in))) -> Edge."""
    if isinstance(text, Edge):
        parse_port((text.src, text.output), stages, where)
        parse_port((text.dst, text.input), stages, where)
        return text
    if isinstance(text, tuple) and len(text) == 2:
        (src, out), (dst, inp) = (parse_port(p, stages, where) for p in text)
        return Edge(src, out, dst, inp)
    if not isinstance(text, str) or text.count("->") != 1:
        raise CompositionError(where + f"{text!r}: expected 'stage.output -> stage.input'")
    left, right = text.split("->")
    src, out = parse_port(left, stages, where)
    dst, inp = parse_port(right, stages, where)
    return Edge(src, out, dst, inp)


def parse_outputs(outputs: Sequence[Any], stages: Sequence[str], at: _Where) -> list[Exposed]:
    """``"b.out"`` exposes under the output's own name (``b.out`` where two clash);
    ``"name=b.out"`` under ``name``."""
    raw: list[tuple[str | None, str, str]] = []
    for i, text in enumerate(outputs):
        where = at.key(f"outputs[{i}]")
        if isinstance(text, Exposed):
            raw.append((text.name, text.stage, text.output))
            continue
        name: str | None = None
        if isinstance(text, str) and "=" in text:
            left, right = (p.strip() for p in text.split("=", 1))
            # "name=stage.out" renames; a tensor name with "=" in it is a plain "stage.out".
            if any(right.startswith(s + ".") for s in stages) or not any(left.startswith(s + ".") for s in stages):
                name, text = left, right
                if not name:
                    raise CompositionError(where + "an empty name before '='")
        raw.append((name, *parse_port(text, stages, where)))
    own = [out for name, _, out in raw if name is None]
    exposed = [
        Exposed(name if name is not None else (out if own.count(out) == 1 else f"{stage}.{out}"), stage, out)
        for name, stage, out in raw
    ]
    seen: dict[str, int] = {}
    for i, e in enumerate(exposed):
        if e.name in seen:
            raise CompositionError(
                at.key(f"outputs[{i}]") + f"the output name '{e.name}' is taken by outputs[{seen[e.name]}]"
            )
        seen[e.name] = i
    return exposed


def _edge_index(a: int | str, edges: list[Edge], where: str) -> int:
    if isinstance(a, bool) or not isinstance(a, (int, str)):
        raise CompositionError(where + "expected an edge index or an edge string")
    if isinstance(a, int):
        if not 0 <= a < len(edges):
            raise CompositionError(where + f"there is no edge {a} ({len(edges)} edges)")
        return a
    wanted = " ".join(a.split())
    for i, e in enumerate(edges):
        if str(e) == wanted:
            return i
    raise CompositionError(
        where + f"'{a}' is not one of the edges{_core.did_you_mean(wanted, [str(e) for e in edges])}"
    )


def parse_io_pair(text: Any, where: str) -> tuple[str, str]:
    """``"OUT:IN"`` (the command line's ``--io-map`` and a pipeline file's chain) -> (OUT, IN).
    Names may hold colons: the last one splits."""
    out, sep, inp = text.strip().rpartition(":") if isinstance(text, str) else ("", "", "")
    if not sep or not out.strip() or not inp.strip():
        raise CompositionError(where + f"{text!r}: expected OUTPUT:INPUT")
    return out.strip(), inp.strip()


def groups(
    stages: Sequence[str], edges: Sequence[Edge], inputs: Mapping[str, Sequence[tuple[str, str]]]
) -> list[list[str]]:
    """The stages in groups that no edge or shared graph input joins (one group when every
    stage is connected), each in the given order."""
    parent = {s: s for s in stages}

    def root(s: str) -> str:
        while parent[s] != s:
            parent[s] = parent[parent[s]]
            s = parent[s]
        return s

    joined = [(e.src, e.dst) for e in edges] + [(t[0][0], s) for t in inputs.values() for s, _ in t[1:]]
    for a, b in joined:
        parent[root(a)] = root(b)
    found: dict[str, list[str]] = {}
    for s in stages:
        found.setdefault(root(s), []).append(s)
    return list(found.values())


_NESTED = "io_maps=[[('out', 'in')], [('out2', 'in2')]]: one list of (output, input) pairs per joint"


def normalize_io_maps(io_maps: Any, n_models: int) -> list[list[tuple[str, str]] | None] | None:
    """``io_maps`` as one list of ``(output, input)`` pairs per joint.

    Besides the nested form, takes the flat form ``[("a", "b"), ...]`` for a single joint
    (two models), and kornia's mapping from joint index to pairs (``{0: [("a", "b")]}``).
    Any other shape (a ``{"a": "b"}`` dict, a bare pair, a string) is a CompositionError
    that shows the nested form."""
    if io_maps is None:
        return None
    joints = n_models - 1
    if isinstance(io_maps, Mapping):
        if io_maps and all(isinstance(k, int) and not isinstance(k, bool) for k in io_maps):
            missing = [j for j in range(joints) if j not in io_maps]
            if missing:
                raise CompositionError(
                    f"io_maps has no entry for joint {missing[0]} ({n_models} models have {joints} joints); "
                    f"expected {_NESTED}"
                )
            io_maps = [io_maps[j] for j in range(joints)]
        else:
            example = _as_pairs(list(io_maps.items())) if io_maps else None
            shown = f"io_maps=[{example!r}]" if example else _NESTED
            raise CompositionError(f"io_maps is a dict; pass {shown} (one list of (output, input) pairs per joint)")
    if isinstance(io_maps, (str, bytes)) or not isinstance(io_maps, Iterable):
        raise CompositionError(f"io_maps must be a list, got {type(io_maps).__name__}; expected {_NESTED}")
    entries = list(io_maps)
    flat = _as_pairs(entries)
    if flat is not None and entries:
        if joints != 1:
            raise CompositionError(
                f"io_maps={entries!r} is a flat list of pairs, which only describes one joint; "
                f"{n_models} models have {joints} joints: expected {_NESTED}"
            )
        return [flat]
    out: list[list[tuple[str, str]] | None] = []
    for j, entry in enumerate(entries):
        is_list = isinstance(entry, Iterable) and not isinstance(entry, (str, bytes, Mapping))
        pairs = _as_pairs(list(entry)) if is_list else None
        if pairs is None:
            hint = f" (for one pair: [{entry!r}])" if isinstance(entry, tuple) and len(entry) == 2 else ""
            raise CompositionError(
                f"io_maps[{j}] must be a list of (output, input) name pairs, got {entry!r}{hint}; expected {_NESTED}"
            )
        out.append(pairs)
    return out


def _as_pairs(items: list[Any]) -> list[tuple[str, str]] | None:
    """``items`` as (str, str) pairs, or None if any item is not a pair of names."""
    pairs = []
    for item in items:
        if isinstance(item, (str, bytes)) or not isinstance(item, Sequence) or len(item) != 2:
            return None
        if not all(isinstance(n, str) for n in item):
            return None
        pairs.append((item[0], item[1]))
    return pairs
