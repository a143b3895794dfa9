"""Operators for what comes out of a model: class scores and detector boxes.

Each reads ``input`` (nms: ``boxes`` and ``scores``) and names its outputs by what they
hold, so that a pipeline ending in one exposes ``probabilities`` or ``indices`` rather than
``output``.
"""

from __future__ import annotations

from typing import Any

from fastseq.ops import _graph as g
from fastseq.ops.operator import Operator


def _rank(op: str, rank: Any, axis: Any, default: int, first: int = 0) -> list[str]:
    """The dims fed: ``rank`` axes when given; else ``default`` axes, or as many as ``axis``
    needs (softmax(axis=3) reads at least 4), which a pipeline changes to the rank of what
    feeds the operator (``fastseq.ops.refit``). ``first``: the lowest rank the axis needs
    is ``axis + first`` for a non-negative axis (flatten's axis may equal the rank)."""
    if rank is None:
        need = (
            axis + 1 - first
            if isinstance(axis, int) and not isinstance(axis, bool) and axis >= 0
            else (-axis if isinstance(axis, int) and not isinstance(axis, bool) else 0)
        )
        rank = min(max(default, need), g.MAX_RANK)
    return g.rank_dims(op, rank)


def _fitted(model: Operator, rank: Any, params: dict[str, Any]) -> Operator:
    """``model``, marked to take the rank of what feeds it when ``rank`` was not given
    (``params``: its other arguments, checked: what builds it again)."""
    if rank is None:
        model.fit = (model.name, {k: v for k, v in params.items() if v is not None})
    return model


def _axis(op: str, value: Any, rank: int) -> int:
    """An axis in [-rank, rank), kept as given (negative counts from the end)."""
    ax = g.integer(op, "axis", value)
    if not -rank <= ax < rank:
        raise g.fail(op, f"axis must be in [{-rank}, {rank - 1}] for rank {rank}, got {ax}")
    return ax


def _without(shape: list[str], axis: int, keep: bool) -> list[Any]:
    """``shape`` reduced along ``axis``: the axis becomes 1, or goes."""
    ax = axis % len(shape)
    return shape[:ax] + ([1] if keep else []) + shape[ax + 1 :]


def _product(dims: list[str]) -> int | str:
    """The size of ``dims`` flattened into one axis: ``"d1*d2*d3"`` (the core turns it into
    a number once the sizes are known), the name itself for one axis, 1 for none."""
    return "*".join(dims) if dims else 1


@g.operator
def softmax(axis: int = -1, *, dtype: Any = "float32", rank: int | None = None, opset: int | None = None) -> Operator:
    """Scores to probabilities along ``axis`` (the classes, last by default); output
    ``probabilities``. ``rank``: the number of axes fed, the first being the batch; without
    it, what a pipeline feeds the operator ([N, classes] on its own)."""
    op = "softmax"
    shape = _rank(op, rank, axis, 2)
    ax = _axis(op, axis, len(shape))
    name, _ = g.dtype(op, dtype, g.FLOATS)
    version = g.opset(op, opset)
    graph = g.Graph(op, version)
    last = len(shape) - 1
    if version >= 13 or ax % len(shape) == last:
        graph.node("Softmax", ["input"], ["probabilities"], axis=ax)
    else:
        # Before opset 13 Softmax normalises over every axis from ``axis`` on at once (the
        # input read as 2-D): swap the axis with the last, normalise that one, swap back.
        perm = list(range(len(shape)))
        perm[ax % len(shape)], perm[last] = last, ax % len(shape)
        swapped = graph.node("Transpose", ["input"], perm=perm)
        graph.node("Transpose", [graph.node("Softmax", [swapped], axis=-1)], ["probabilities"], perm=perm)
    call = g.call_text(op, dict(axis=ax, dtype=name, rank=len(shape)))
    model = graph.model(call, [g.tensor("input", name, shape)], [g.tensor("probabilities", name, shape)], version)
    return _fitted(model, rank, dict(axis=ax, dtype=name, opset=opset))


@g.operator
def argmax(
    axis: int = -1, keepdims: bool = False, *, dtype: Any = "float32", rank: int | None = None, opset: int | None = None
) -> Operator:
    """The index of the largest value along ``axis`` (the first one on ties), as int64
    ``indices``; ``keepdims=True`` keeps the reduced axis with length 1. ``rank``: the
    number of axes fed; without it, what a pipeline feeds the operator ([N, classes] on its
    own)."""
    op = "argmax"
    shape = _rank(op, rank, axis, 2)
    ax = _axis(op, axis, len(shape))
    keep = g.flag(op, "keepdims", keepdims)
    name, _ = g.dtype(op, dtype, g.FLOATS + g.INTEGERS)
    version = g.opset(op, opset)
    graph = g.Graph(op, version)
    graph.node("ArgMax", ["input"], ["indices"], axis=ax, keepdims=int(keep))
    call = g.call_text(op, dict(axis=ax, keepdims=keep, dtype=name, rank=len(shape)))
    outputs = [g.tensor("indices", "int64", _without(shape, ax, keep))]
    model = graph.model(call, [g.tensor("input", name, shape)], outputs, version)
    return _fitted(model, rank, dict(axis=ax, keepdims=keep, dtype=name, opset=opset))


@g.operator
def topk(
    k: int,
    axis: int = -1,
    largest: bool = True,
    *,
    dtype: Any = "float32",
    rank: int | None = None,
    opset: int | None = None,
) -> Operator:
    """The ``k`` largest (or smallest) values along ``axis``, sorted, as ``values`` and
    their int64 ``indices``. The axis must hold at least ``k`` entries at run time.
    ``rank``: the number of axes fed; without it, what a pipeline feeds the operator ([N,
    classes] on its own)."""
    op = "topk"
    count = g.integer(op, "k", k, minimum=1)
    shape = _rank(op, rank, axis, 2)
    ax = _axis(op, axis, len(shape))
    big = g.flag(op, "largest", largest)
    name, _ = g.dtype(op, dtype, g.FLOATS + g.INTEGERS)
    version = g.opset(op, opset)
    graph = g.Graph(op, version)
    graph.node(
        "TopK",
        ["input", graph.ints([count], "k")],
        ["values", "indices"],
        axis=ax,
        largest=int(big),
        sorted=1,
    )
    call = g.call_text(op, dict(k=count, axis=ax, largest=big, dtype=name, rank=len(shape)))
    picked: list[int | str] = list(shape)
    picked[ax % len(shape)] = count
    outputs = [g.tensor("values", name, picked), g.tensor("indices", "int64", picked)]
    model = graph.model(call, [g.tensor("input", name, shape)], outputs, version)
    return _fitted(model, rank, dict(k=count, axis=ax, largest=big, dtype=name, opset=opset))


@g.operator
def flatten(axis: int = 1, *, dtype: Any = "float32", rank: int | None = None, opset: int | None = None) -> Operator:
    """Flattens the axes before ``axis`` into one and the axes from it on into another:
    images [N, C, H, W] become the feature rows [N, C*H*W] that a scikit-learn model
    reads. ``rank``: the number of axes fed; without it, what a pipeline feeds the operator
    (4 on its own)."""
    op = "flatten"
    shape = _rank(op, rank, axis, 4, first=1)
    ax = g.integer(op, "axis", axis, minimum=1)
    if ax > len(shape):
        raise g.fail(op, f"axis must be at most the rank ({len(shape)}), got {ax}")
    name, _ = g.dtype(op, dtype, g.FLOATS + g.INTEGERS)
    version = g.opset(op, opset)
    graph = g.Graph(op, version)
    graph.node("Flatten", ["input"], ["output"], axis=ax)
    call = g.call_text(op, dict(axis=ax, dtype=name, rank=len(shape)))
    out_shape = [_product(shape[:ax]), _product(shape[ax:])]
    model = graph.model(call, [g.tensor("input", name, shape)], [g.tensor("output", name, out_shape)], version)
    return _fitted(model, rank, dict(axis=ax, dtype=name, opset=opset))


@g.operator
def nms(
    iou: float = 0.5,
    score: float = 0.0,
    max_boxes: int = 100,
    *,
    box_format: str = "xyxy",
    scores_layout: str = "NCB",
    opset: int | None = None,
) -> Operator:
    """Non-maximum suppression per image and class over detector outputs: ``boxes``
    float32 [N, B, 4] and ``scores`` float32 [N, C, B] (``scores_layout="NBC"`` for
    [N, B, C], as YOLO heads write them).

    Keeps boxes scoring above ``score``, drops any box overlapping a better one of its
    class by an IoU above ``iou``, and keeps at most ``max_boxes`` per image and class.
    ``box_format``: ``"xyxy"`` (two opposite corners) or ``"cxcywh"`` (centre and size).
    Outputs ``selected_indices`` int64 [K, 3] (image, class, box), and for each selected
    box ``selected_boxes`` [K, 4] (as given), ``selected_scores`` [K] and
    ``selected_classes`` int64 [K]; ordered by image, class, then falling score."""
    op = "nms"
    threshold = g.number(op, "iou", iou)
    if not 0.0 <= threshold <= 1.0:
        raise g.fail(op, f"iou must be between 0 and 1, got {iou!r}")
    floor = g.number(op, "score", score)
    limit = g.integer(op, "max_boxes", max_boxes, minimum=1)
    fmt = g.choice(op, "box_format", box_format, ("xyxy", "cxcywh"))
    scores_order = g.choice(op, "scores_layout", scores_layout, ("NCB", "NBC"))
    version = g.opset(op, opset)
    graph = g.Graph(op, version)
    scores = "scores" if scores_order == "NCB" else graph.node("Transpose", ["scores"], perm=[0, 2, 1])
    selected = graph.node(
        "NonMaxSuppression",
        [
            "boxes",
            scores,
            graph.ints([limit], "max_boxes"),
            graph.const([threshold], "float32", [1], "iou"),
            graph.const([floor], "float32", [1], "score"),
        ],
        ["selected_indices"],
        center_point_box=int(fmt == "cxcywh"),
    )
    image_box = graph.node("Gather", [selected, graph.ints([0, 2], "image_box")], axis=1)
    graph.node("GatherND", ["boxes", image_box], ["selected_boxes"])
    graph.node("GatherND", [scores, selected], ["selected_scores"])
    graph.node("Gather", [selected, graph.ints(1, "class")], ["selected_classes"], axis=1)
    call = g.call_text(
        op, dict(iou=threshold, score=floor, max_boxes=limit, box_format=fmt, scores_layout=scores_order)
    )
    scores_shape = ["N", "classes", "boxes"] if scores_order == "NCB" else ["N", "boxes", "classes"]
    return graph.model(
        call,
        [g.tensor("boxes", "float32", ["N", "boxes", 4]), g.tensor("scores", "float32", scores_shape)],
        [
            g.tensor("selected_indices", "int64", ["selected", 3]),
            g.tensor("selected_boxes", "float32", ["selected", 4]),
            g.tensor("selected_scores", "float32", ["selected"]),
            g.tensor("selected_classes", "int64", ["selected"]),
        ],
        version,
    )
