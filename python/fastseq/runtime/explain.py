"""ONNX Runtime's errors in the stages' own names: a node or tensor it names is traced back
to its stage through the core's origins, and the error raised as a typed fastseq error."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

from fastseq import _core

_PREFIXED = re.compile(r"\bm(\d+)/([^\s'\"\]\[,:;()]+)")
_TOKEN = r"[^\s'\"\]\[,;()]+"
# Where ONNX Runtime names a node: "... running Reshape node. Name:'reshape' Status ..." at
# run time, "Node (reshape) Op (Reshape) ..." when a session is made.
_NODE = r"(?<=Name:')[^']+(?=')|(?<=Node \()[^()]+(?=\))"
_WORDS = re.compile(f"(?P<node>{_NODE})|(?P<token>{_TOKEN})")


def node_names(composed: _core.Composed) -> dict[str, set[int]]:
    """Every node name of a composed model's graph, subgraphs' nodes included, mapped to the
    indices of the top-level nodes they sit in: what a node that ONNX Runtime names is
    traced back to its stage with. Reads the model without its weights."""
    import onnx

    graph = onnx.ModelProto.FromString(composed.stripped_bytes(0)).graph
    names: dict[str, set[int]] = {}
    for index, top in enumerate(graph.node):
        todo = [top]
        while todo:
            node = todo.pop()
            names.setdefault(node.name, set()).add(index)
            for attribute in node.attribute:
                for sub in [attribute.g, *attribute.graphs]:
                    todo.extend(sub.node)
    return names


def adapter_origins(composed: _core.Composed, stages: list[tuple[str, int, int]]) -> dict[str, tuple[int, str]]:
    """The nodes of the adapters the merge inserted, each as the edge it sits on (the
    core names them ``fastseq/adapt<edge>/...`` among the nodes of the stage the edge
    feeds): an error in one names the edge, ``a.y -> b.u``, not the node."""
    plan = composed.plan()
    if not plan.get("adapters"):
        return {}
    edges = plan["edges"]
    inserted = composed.inserted_nodes()
    into: dict[int, list[tuple[int, str]]] = {}  # stage -> its adapters (edge, what it does)
    for edge, what in plan["adapters"]:
        k = next((k for k, (label, _, _) in enumerate(stages) if label == edges[edge][2]), None)
        if k is not None:
            into.setdefault(k, []).append((edge, what))
    found: dict[str, tuple[int, str]] = {}
    for name, indices in node_names(composed).items():
        for k, adapters in into.items():
            first = stages[k][1]
            if not any(first <= i < first + inserted[k] for i in indices):
                continue
            hinted = re.match(r"fastseq/adapt(\d+)/", name)  # which edge, where several feed stage k
            pick = adapters if len(adapters) == 1 else [a for a in adapters if hinted and a[0] == int(hinted[1])]
            if pick:
                (edge, what), (src, out, dst, inp, _) = pick[0], edges[pick[0][0]]
                found[name] = (k, f"the adapter on edge {src}.{out} -> {dst}.{inp} ({what})")
    return found


def explain(
    error: Exception,
    labels: Sequence[str],
    renamed: Mapping[str, tuple[int, str]] | None = None,
    ranges: Sequence[tuple[int, int]] | None = None,
    nodes: Callable[[], Mapping[str, set[int]]] | None = None,
) -> Exception:
    """An ONNX Runtime error as a :class:`RunError` whose message names the stage and its own
    node and tensor names, from the core's origins: ``renamed`` maps every name the core
    changed in the merged graph to (stage, original name); ``ranges`` gives each stage's
    nodes in the merged graph (first, end), and ``nodes`` the merged graph's node names
    (:func:`node_names`; read only when the error names a node the core did not rename), so
    that a node is traced to its stage whatever its name. Without them, the core's ``m<i>/``
    prefix (given only where two stages clash) says the stage."""
    from fastseq.errors import RunError, RunTimeoutError

    text = str(error).strip()
    if "terminate flag" in text.lower():
        return RunTimeoutError(f"the call was stopped: {text}")
    stages: list[str] = []
    known: list[Mapping[str, set[int]]] = []  # the node names, once read

    def named(stage: int, original: str) -> str:
        label = labels[stage] if stage < len(labels) else f"model {stage}"
        if label not in stages:
            stages.append(label)
        return f"{original} (in {label})"

    def stage_of_node(name: str) -> int | None:
        if not ranges or nodes is None:
            return None
        if not known:
            known.append(nodes())
        found = {k for i in known[0].get(name, ()) for k, (first, end) in enumerate(ranges) if first <= i < end}
        return found.pop() if len(found) == 1 else None

    def word(m: re.Match[str]) -> str:
        text = m.group(0)
        for candidate in (text, text.rstrip(".:")):
            hit = renamed.get(candidate) if renamed else None
            if hit is not None:
                return named(*hit) + text[len(candidate) :]
        if m.group("node") is not None and not _PREFIXED.match(text):
            stage = stage_of_node(text)
            if stage is not None:
                return named(stage, text)
        return _PREFIXED.sub(lambda p: named(int(p.group(1)), p.group(2)), text)

    translated = _WORDS.sub(word, text)
    where = f"stage {', '.join(stages)}" if stages else "the pipeline " + " -> ".join(labels)
    return RunError(f"{where}: onnxruntime {type(error).__name__}: {translated}")
