"""Opset and IR version harmonisation.

The default domain (ai.onnx) goes through onnx.version_converter, which has an adapter per
operator change. Other domains have no converter: their version is moved only where no
operator the model uses changed its schema between the two versions (``onnx.defs``), which
leaves what the model computes untouched. Domains whose schemas onnx does not know
(com.microsoft, ai.onnx.contrib, ...) cannot be checked, so they merge only when every
model already imports the same version.

Neither step needs the weights, so both work on a copy without them: large tensors are
taken out before and put back after, which keeps the protobuf small (and under the 2 GB
limit) whatever the model's size.

A caller with a store of converted stages (the session cache) keeps each converted copy
there, under a key made of what the conversion reads and does: the copy without the weights,
byte for byte, the versions it goes to, and the converter (onnx's version and this module's
own code). Which stages need converting, and to what, is read from the core's summaries,
and the key needs no onnx either: a start whose converted stages are all in the store never
imports onnx (1-2 s). Only domains other than ai.onnx that differ between stages need
onnx's schemas to settle on a version."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from fastseq import _core
from fastseq.errors import ConversionError, OpsetMismatchError

if TYPE_CHECKING:
    import onnx

#: What each entry point lets its caller do about differing opsets (the core's message is
#: neutral: only the entry point knows which of its parameters converts).
HINTS = {
    "sequential": "pass auto_ir_version_conversion=True to convert them (target_opset_version=N picks "
    "the ai.onnx version)",
    "compose": "pass opset='highest' to convert them (or opset=N for the ai.onnx version)",
    "cli": "pass --opset highest to convert them (or --opset N for the ai.onnx version)",
    "merge_models": "onnx.compose.merge_models has no conversion option: use fastseq.compose([m1, m2], "
    "io_maps=[io_map], opset='highest'), which converts them, or convert a model first with "
    "onnx.version_converter.convert_version",
}


def with_hint(error: OpsetMismatchError, entry: str) -> OpsetMismatchError:
    """``error`` with the hint of entry point ``entry`` (a key of :data:`HINTS`) appended."""
    return OpsetMismatchError(f"{error}. To fix: {HINTS[entry]}.")


def _domain(name: str) -> str:
    return "" if name == "ai.onnx" else name


def _shown(domain: str) -> str:
    return domain or "ai.onnx"


def _convert_default(stripped: onnx.ModelProto, source: int, target: int, label: str) -> onnx.ModelProto:
    import onnx.version_converter

    try:
        converted = onnx.version_converter.convert_version(stripped, target)
    except Exception as e:  # the converter raises RuntimeError, ValueError or its own
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        blocker = _blocking_op(stripped, text)
        blocked = f" (blocked by operator {blocker})" if blocker else ""
        raise ConversionError(f"{label}: cannot convert from opset {source} to {target}{blocked}: {text}") from e
    _raise_ir_version(converted)
    return converted


def _raise_ir_version(model: onnx.ModelProto) -> None:
    import onnx

    # A newer opset may need a newer IR version than the model had.
    needed = onnx.helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    model.ir_version = max(model.ir_version, needed)


def _blocking_op(model: onnx.ModelProto, message: str) -> str | None:
    """The operator the converter's message is about: one of the model's own op types that
    the message names ("No Adapter For Relu", "adapt_upsample_9_8: ..."), longest first."""
    lowered = message.lower()
    ops = {n.op_type for n in model.graph.node}
    named = [op for op in ops if re.search(rf"(?<![a-z]){op.lower()}(?![a-z])", lowered)]
    return max(named, key=len) if named else None


# --- domains other than ai.onnx ------------------------------------------------------------


def _nodes(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    """Every node of ``nodes``, their If/Loop/Scan bodies included."""
    import onnx

    for node in nodes:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(attr.g.node)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _nodes(g.node)


def _version_in(owner: onnx.ModelProto | onnx.FunctionProto, domain: str) -> int | None:
    return next((e.version for e in owner.opset_import if _domain(e.domain) == domain), None)


def _follows(function: onnx.FunctionProto, model: onnx.ModelProto, domain: str) -> bool:
    """Whether ``function`` sees ``domain`` at the model's version (it imports the same
    version, or does not say): then its body moves with the model."""
    own = _version_in(function, domain)
    return own is None or own == _version_in(model, domain)


def _ops_of(model: onnx.ModelProto, domain: str) -> set[str]:
    """The operators of ``domain`` the model uses at its own version of it: in its graph and
    in the bodies of the local functions that follow it. Calls of the model's own local
    functions are left out: the model defines them, whatever the domain's version."""
    local = {(_domain(f.domain), f.name) for f in model.functions}
    bodies = [model.graph.node] + [f.node for f in model.functions if _follows(f, model, domain)]
    return {
        node.op_type
        for body in bodies
        for node in _nodes(body)
        if _domain(node.domain) == domain and (domain, node.op_type) not in local
    }


def _since(op: str, version: int, domain: str) -> int | None:
    """The version at which ``op`` as seen by ``domain`` ``version`` last changed; None when
    onnx has no schema for it (an unknown domain or operator)."""
    import onnx

    try:
        return onnx.defs.get_schema(op, version, domain).since_version
    except onnx.defs.SchemaError:
        return None


def _blockers(ops: set[str], domain: str, source: int, goal: int) -> list[str]:
    """Why a model using ``ops`` of ``domain`` at ``source`` cannot import ``goal`` instead:
    one line per operator whose schema differs between the two, or is unknown to onnx
    (then only ``source`` itself is safe)."""
    if source == goal:
        return []
    reasons = []
    for op in sorted(ops):
        before, after = _since(op, source, domain), _since(op, goal, domain)
        if before is None:
            reasons.append(f"onnx knows no schema for {op}, so a change of version cannot be checked")
        elif after is None:
            reasons.append(f"{op} does not exist in {_shown(domain)} {goal}")
        elif before != after:
            reasons.append(f"{op} changed in {_shown(domain)} {max(before, after)}")
    return reasons


def _settle(domain: str, versions: dict[int, int], ops: dict[int, set[str]], labels: list[str]) -> int:
    """The version of ``domain`` every model can import without any operator it uses
    changing: the highest such between the lowest and the highest imported (a model that
    uses no operator of the domain takes any). ``versions`` and ``ops`` are keyed by model
    index."""
    low, high = min(versions.values()), max(versions.values())
    for goal in range(high, low - 1, -1):
        if all(not _blockers(ops.get(i, set()), domain, v, goal) for i, v in versions.items()):
            return goal
    # Nothing fits: say what stops the two obvious choices, the highest and the lowest.
    lines = []
    for goal in dict.fromkeys((high, low)):
        for i, v in versions.items():
            for reason in _blockers(ops.get(i, set()), domain, v, goal):
                lines.append(f"to {goal}: {labels[i]} ({_shown(domain)} {v}): {reason}")
    listing = "; ".join(f"{v} in {labels[i]}" for i, v in sorted(versions.items(), key=lambda kv: kv[1]))
    advice = ""
    if any("knows no schema" in line for line in lines):
        advice = f". Export the models with one {_shown(domain)} version"
    raise ConversionError(
        f"cannot bring domain '{_shown(domain)}' to one version ({listing}): " + "; ".join(lines) + advice
    )


def _set_version(model: onnx.ModelProto, domain: str, goal: int) -> None:
    """Imports ``goal`` for ``domain`` in the model and in the local functions that follow
    it (a duplicate import of the domain is dropped)."""
    for owner in [model] + [f for f in model.functions if _follows(f, model, domain)]:
        kept: list[onnx.OperatorSetIdProto] = []
        for entry in owner.opset_import:
            if _domain(entry.domain) == domain:
                if any(_domain(k.domain) == domain for k in kept):
                    continue
                entry.version = goal
            kept.append(entry)
        del owner.opset_import[:]
        owner.opset_import.extend(kept)


def _dedupe_imports(model: onnx.ModelProto) -> None:
    """Keeps the first import of each domain: skl2onnx writes ai.onnx twice, and the
    converter would move only one of the two."""
    seen: set[str] = set()
    kept = []
    for entry in model.opset_import:
        if _domain(entry.domain) not in seen:
            seen.add(_domain(entry.domain))
            kept.append(entry)
    if len(kept) != len(model.opset_import):
        del model.opset_import[:]
        model.opset_import.extend(kept)


class Store(Protocol):
    """Where converted stages are kept between starts (the session cache's
    :class:`~fastseq.runtime.cache_entry.ConvertedStages`): ``get`` gives the converted copy
    kept under ``parts`` (verified) or None, ``put`` keeps one."""

    def get(self, parts: dict[str, Any]) -> bytes | None: ...

    def put(self, parts: dict[str, Any], label: str, data: bytes) -> None: ...


#: What a converted stage's key says it is (the key's format: change it to leave old entries).
KIND = "converted stage 1"


def harmonise(
    models: list[_core.Composed], labels: list[str], target: int | None, store: Store | None = None
) -> list[_core.Composed]:
    """Brings every domain to one version across ``models``: ai.onnx to ``target`` (else the
    highest) through onnx.version_converter, every other domain to the highest version that
    no model's operators object to. Raises :class:`ConversionError` naming the model, the
    operator and the versions when that cannot be done. With a ``store``, a stage converted
    before (the same copy without its weights, to the same versions, by the same converter)
    is taken from it, and one converted now is kept there."""
    imports: list[dict[str, int]] = []
    for m in models:
        first: dict[str, int] = {}
        for d, v in m.summary()["opsets"]:
            first.setdefault(_domain(d), v)  # the import _dedupe_imports keeps
        imports.append(first)
    raw: dict[int, bytes] = {}
    stripped: dict[int, onnx.ModelProto] = {}

    def weightless(i: int) -> bytes:
        # The tensors the core's layout keeps in a model stay: shape and axes constants that
        # adapters read; the weights go.
        if i not in raw:
            raw[i] = models[i].stripped_bytes()
        return raw[i]

    def proto(i: int) -> onnx.ModelProto:
        import onnx

        if i not in stripped:
            stripped[i] = onnx.ModelProto.FromString(weightless(i))
        return stripped[i]

    defaults = [imp.get("", 0) for imp in imports]
    default_goal = target if target is not None else max(defaults)
    goals: dict[str, int] = {}
    for domain in sorted({d for imp in imports for d in imp} - {""}):
        versions = {i: imp[domain] for i, imp in enumerate(imports) if domain in imp}
        if len(set(versions.values())) > 1:
            ops = {i: _ops_of(proto(i), domain) for i in versions}
            goals[domain] = _settle(domain, versions, ops, labels)

    converter = _converter() if store is not None else None
    out = []
    for i, model in enumerate(models):
        moves = {d: g for d, g in goals.items() if imports[i].get(d, g) != g}
        convert_default = defaults[i] not in (0, default_goal)
        if not moves and not convert_default:
            out.append(model)
            continue
        parts = None
        if converter is not None:  # None: onnx's version is unknown, nothing is kept
            parts = {
                "kind": KIND,
                "model": hashlib.sha256(weightless(i)).hexdigest(),
                "keep_bytes": _core.LAYOUT.threshold,
                "ai.onnx": [defaults[i], default_goal] if convert_default else None,
                "domains": dict(sorted(moves.items())),
                **converter,
            }
        data = store.get(parts) if store is not None and parts is not None else None
        if data is None:
            edited = proto(i)
            _dedupe_imports(edited)
            if convert_default:
                edited = _convert_default(edited, defaults[i], default_goal, labels[i])
            for domain, goal in moves.items():
                _set_version(edited, domain, goal)
            _raise_ir_version(edited)
            data = edited.SerializeToString()
            if store is not None and parts is not None:
                store.put(parts, labels[i], data)
        out.append(model.with_weights(data, labels[i]))
    return out


def _converter() -> dict[str, str] | None:
    """What the converter is: onnx's version (read from its distribution's metadata, without
    importing it) and this module's code; None when onnx's version cannot be read."""
    import importlib.util

    version = None
    spec = importlib.util.find_spec("onnx")
    if spec is not None and spec.origin:
        # Beside the package: onnx-<version>.dist-info (one of them, else importlib decides).
        found = list(Path(spec.origin).parent.parent.glob("onnx-*.dist-info"))
        if len(found) == 1:
            version = found[0].name[len("onnx-") : -len(".dist-info")]
    if version is None:
        import importlib.metadata  # 0.1-0.2 s (it imports the email package): only when needed

        try:
            version = importlib.metadata.version("onnx")
        except importlib.metadata.PackageNotFoundError:
            return None
    return {"onnx": version, "converter": hashlib.sha256(Path(__file__).read_bytes()).hexdigest()}
