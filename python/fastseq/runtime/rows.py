"""Whether the rows of a batch stay apart: the core decides it from the composed graph
(``Composed.row_mixing``, see ``crates/fastseq/src/merge/rows``); this module says it in the stages'
own names, for the batcher to refuse a pipeline whose rows may mix."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastseq.errors import CompositionError

#: At most this many reasons are listed in one error.
SHOWN = 3


def check_rows(
    findings: Sequence[tuple[int | None, str, str, str | None, str]],
    stages: Sequence[tuple[str, int, int]],
    renamed: Mapping[str, tuple[int, str]],
    inserted: Sequence[int] = (),
) -> None:
    """Raises :class:`CompositionError` naming the stage and node of each of the core's
    ``findings`` (``Composed.row_mixing()``), if there are any. ``stages``, ``renamed``:
    the core's origins (``Composed.origins()``); ``inserted``: per stage, the nodes at the
    start of its range that the merge inserted (adapters)."""
    if not findings:
        return
    raise CompositionError(
        "cannot batch this pipeline: the rows of one request may depend on the others' rows, so joining "
        "requests could give each caller values it would not get alone:\n"
        + _listed(findings, stages, renamed, inserted)
        + "\n"
        "If each row's outputs depend on that row alone, say so with pipe.batcher(row_independent=True) "
        "(fastseq serve --row-independent, or row_independent = true in its pipeline file)."
    )


def dynamic_batch(composed: Any) -> Any:
    """``composed`` (a ``_core.Composed``) with a dynamic batch axis in place of its inputs'
    fixed first axis of 1 (the core's adapter, ``Composed.dynamic_batch``), or a
    :class:`CompositionError` naming the stage and node where it cannot be proved."""
    made, findings = composed.dynamic_batch()
    if made is not None:
        return made
    stages, renamed = composed.origins()
    raise CompositionError(
        "cannot give this pipeline a dynamic batch axis (dynamic_batch=True, --dynamic-batch): the graph keeps "
        "its batch of 1 where the analysis cannot show that each row stays apart:\n"
        + _listed(findings, stages, renamed, composed.inserted_nodes())
        + "\nRe-export the model with a dynamic first axis (torch.onnx.export(..., dynamic_axes={name: {0: "
        "'batch'}}))."
    )


def _listed(
    findings: Sequence[tuple[int | None, str, str, str | None, str]],
    stages: Sequence[tuple[str, int, int]],
    renamed: Mapping[str, tuple[int, str]],
    inserted: Sequence[int],
) -> str:
    lines = [
        f"- {where(node, name, op, stages, renamed, inserted)}{f', at {inner}' if inner else ''}: {reason}"
        for node, name, op, inner, reason in findings[:SHOWN]
    ]
    if len(findings) > SHOWN:
        lines.append(f"- and {len(findings) - SHOWN} more")
    return "\n".join(lines)


def where(
    node: int | None,
    name: str,
    op: str,
    stages: Sequence[tuple[str, int, int]],
    renamed: Mapping[str, tuple[int, str]],
    inserted: Sequence[int] = (),
) -> str:
    """``stage 'head', node 'sm' (Softmax)`` for the merged graph's node ``node``: the stage
    whose range holds it, and the node's name in the stage's own model."""
    if node is None:
        return "the pipeline's outputs"
    for k, (label, first, end) in enumerate(stages):
        if first <= node < end:
            if node - first < (inserted[k] if k < len(inserted) else 0):  # adapters come first
                return f"stage '{label}', a {op} node the merge inserted on its input"
            hit = renamed.get(name)
            own = hit[1] if hit is not None and hit[0] == k else name
            skip = inserted[k] if k < len(inserted) else 0
            what = f"node '{own}' ({op})" if own else f"an unnamed {op} node (node {node - first - skip} of the stage)"
            return f"stage '{label}', {what}" if len(stages) > 1 or label else what
    return f"node '{name}' ({op})" if name else f"an unnamed {op} node (node {node})"
