"""Image operators: each builds a small ONNX model for a batch of images.

Images are a batch axis ``N`` of any size, then channels and pixels in the ``layout``
given (``"NCHW"``, as torch and most exported classifiers read them, or ``"NHWC"``, as
images are decoded). Every model reads ``input`` and writes ``output`` (kornia's
convention); ``letterbox`` adds ``scale`` and ``padding``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from fastseq.ops import _graph as g
from fastseq.ops.operator import Operator

#: ImageNet's channel statistics (RGB, for pixels in [0, 1]): normalize's defaults.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: ITU-R BT.601 luma weights, as Pillow's ``convert("L")`` and torchvision use.
LUMA = (0.299, 0.587, 0.114)
#: Element types ONNX Runtime's CPU Resize (and so resize and letterbox) accepts.
RESIZE_DTYPES = ("uint8", "int8", "int32", "float32")
MODES = ("nearest", "linear", "cubic")
MODE_ALIASES = {"bilinear": "linear", "bicubic": "cubic"}
ASPECT = ("not_smaller", "not_larger")


def _dims(layout: str, **fixed: int | str) -> list[int | str]:
    """Symbolic dims named by the layout's letters, some fixed: ``_dims("NCHW", C=3)``."""
    return [fixed.get(axis, axis) for axis in layout]


@g.operator
def to_float(
    scale: float = 1 / 255, *, dtype: Any = "uint8", to: Any = "float32", rank: int = 4, opset: int | None = None
) -> Operator:
    """Casts to floating point and multiplies by ``scale``: uint8 pixels in [0, 255] become
    [0, 1] by default. The layout is kept (see :func:`layout`).

    ``dtype``: the element type fed (any integer or float type); ``to``: float32, float16
    or float64; ``rank``: the number of axes, the first being the batch."""
    op = "to_float"
    factor = g.number(op, "scale", scale, nonzero=True)
    shape = g.rank_dims(op, rank)
    name, _ = g.dtype(op, dtype, g.INTEGERS + g.FLOATS)
    out_name, out_elem = g.dtype(op, to, g.FLOATS)
    g.held_in(op, "scale", [factor], out_name, nonzero=True)
    if name in g.INT_RANGE:
        # An integer input's largest value, cast to ``to``, times scale must stay finite (255
        # * 300 is inf in float16). Where the cast alone overflows (uint16 to float16), no
        # scale is to blame; a float input has no range to check.
        largest = max(-g.INT_RANGE[name][0], g.INT_RANGE[name][1])
        cast = g.in_dtype(float(largest), out_name)
        if math.isfinite(cast):
            g.finite(
                op,
                "scale",
                cast * g.in_dtype(factor, out_name),
                out_name,
                f"{out_name}(input) * scale",
                f"{largest} * {scale!r}",
            )
    g.normal(op, "scale", [factor], out_name)
    version = g.opset(op, opset)
    graph = g.Graph(op, version)
    cast = graph.node("Cast", ["input"], to=out_elem)
    graph.node("Mul", [cast, graph.scalar(factor, out_name, "scale")], ["output"])
    call = g.call_text(op, dict(scale=scale, dtype=name, to=out_name, rank=len(shape)))
    return graph.model(call, [g.tensor("input", name, shape)], [g.tensor("output", out_name, shape)], version)


@g.operator
def layout(src: str = "NHWC", dst: str = "NCHW", *, dtype: Any = "float32", opset: int | None = None) -> Operator:
    """Moves axes from one layout to another, named by letters: ``layout("NHWC", "NCHW")``
    turns decoded images channels-first; any permutation of distinct letters works."""
    op = "layout"
    a, b = g.letters(op, "src", src), g.letters(op, "dst", dst)
    if sorted(a) != sorted(b):
        raise g.fail(op, f"src and dst must name the same axes, got {a!r} and {b!r}")
    name, _ = g.dtype(op, dtype, g.INTEGERS + g.FLOATS)
    version = g.opset(op, opset)
    graph = g.Graph(op, version)
    graph.node("Transpose", ["input"], ["output"], perm=[a.index(axis) for axis in b])
    call = g.call_text(op, dict(src=a, dst=b, dtype=name))
    return graph.model(call, [g.tensor("input", name, list(a))], [g.tensor("output", name, list(b))], version)


@g.operator
def rgb_to_bgr(*, layout: str = "NCHW", dtype: Any = "float32", opset: int | None = None) -> Operator:
    """Reverses the order of three colour channels (RGB to BGR, and BGR to RGB)."""
    op = "rgb_to_bgr"
    order = g.image_layout(op, layout)
    name, _ = g.dtype(op, dtype, g.INTEGERS + g.FLOATS)
    version = g.opset(op, opset)
    graph = g.Graph(op, version)
    graph.node("Gather", ["input", graph.ints([2, 1, 0], "order")], ["output"], axis=order.index("C"))
    shape = _dims(order, C=3)
    call = g.call_text(op, dict(layout=order, dtype=name))
    return graph.model(call, [g.tensor("input", name, shape)], [g.tensor("output", name, shape)], version)


@g.operator
def grayscale(channels: int = 1, *, layout: str = "NCHW", dtype: Any = "float32", opset: int | None = None) -> Operator:
    """RGB to luma with the BT.601 weights (0.299, 0.587, 0.114), as Pillow's
    ``convert("L")``; ``channels=3`` repeats it into three channels (torchvision's
    ``num_output_channels``). uint8 input is rounded back to uint8."""
    op = "grayscale"
    out_channels = g.integer(op, "channels", channels)
    if out_channels not in (1, 3):
        raise g.fail(op, f"channels must be 1 or 3, got {out_channels}")
    order = g.image_layout(op, layout)
    name, elem = g.dtype(op, dtype, ("uint8",) + g.FLOATS)
    version = g.opset(op, opset)
    axis = order.index("C")
    work = "float32" if name == "uint8" else name
    graph = g.Graph(op, version)
    x = graph.node("Cast", ["input"], to=g.FLOAT) if name == "uint8" else "input"
    weights = graph.const(list(LUMA), work, [3 if a == "C" else 1 for a in order], "luma")
    luma = graph.reduce("ReduceSum", graph.node("Mul", [x, weights]), [axis], keepdims=1)
    if name == "uint8":
        # Round half up and clamp, as Pillow's fixed-point conversion does.
        rounded = graph.node("Floor", [graph.node("Add", [luma, graph.scalar(0.5)])])
        luma = graph.node("Cast", [graph.node("Clip", [rounded, graph.scalar(0), graph.scalar(255)])], to=elem)
    if out_channels == 3:
        graph.node("Concat", [luma, luma, luma], ["output"], axis=axis)
    else:
        graph.node("Identity", [luma], ["output"])
    call = g.call_text(op, dict(channels=out_channels, layout=order, dtype=name))
    return graph.model(
        call,
        [g.tensor("input", name, _dims(order, C=3))],
        [g.tensor("output", name, _dims(order, C=out_channels))],
        version,
    )


@g.operator
def normalize(
    mean: float | Sequence[float] = IMAGENET_MEAN,
    std: float | Sequence[float] = IMAGENET_STD,
    *,
    layout: str = "NCHW",
    dtype: Any = "float32",
    opset: int | None = None,
) -> Operator:
    """``(x - mean) / std`` per channel (ImageNet's statistics by default). ``mean`` and
    ``std`` are one number or one per channel; ``layout`` is any axis string with a ``C``
    (``"NC"`` for feature vectors)."""
    op = "normalize"
    m = g.numbers(op, "mean", mean)
    s = g.numbers(op, "std", std, nonzero=True)
    if len(m) != len(s) and 1 not in (len(m), len(s)):
        raise g.fail(op, f"mean has {len(m)} values and std {len(s)}: give one per channel, or one for all")
    order = g.letters(op, "layout", layout)
    if "C" not in order:
        raise g.fail(op, f"layout must have a channel axis 'C', got {order!r}")
    name, _ = g.dtype(op, dtype, g.FLOATS)
    g.held_in(op, "mean", m, name)
    g.held_in(op, "std", s, name, nonzero=True)
    # (x - mean) / std is x * (1/std) - mean/std: both must be finite in the model's dtype,
    # whatever the Python floats say (1e-45 is not 0, but 1/1e-45 is inf in float32).
    channels = max(len(m), len(s))
    for mv, sv in zip(m * (channels // len(m)), s * (channels // len(s))):
        held_m, held_s = g.in_dtype(mv, name), g.in_dtype(sv, name)
        g.finite(op, "std", 1 / held_s, name, "(x - mean) / std", f"1 / {sv!r}")
        g.finite(op, "std", -held_m / held_s, name, "(x - mean) / std", f"(0 - {mv!r}) / {sv!r}")
    g.normal(op, "std", s, name)
    version = g.opset(op, opset)
    bshape = [channels if a == "C" else 1 for a in order]
    graph = g.Graph(op, version)
    # One value for all channels is repeated to one per channel.
    mean_c = graph.const(m * (channels // len(m)), name, bshape, "mean")
    std_c = graph.const(s * (channels // len(s)), name, bshape, "std")
    graph.node("Div", [graph.node("Sub", ["input", mean_c]), std_c], ["output"])
    shape = _dims(order, C=channels) if channels > 1 else list(order)
    call = g.call_text(op, dict(mean=tuple(m), std=tuple(s), layout=order, dtype=name))
    return graph.model(call, [g.tensor("input", name, shape)], [g.tensor("output", name, shape)], version)


def _aspect(op: str, value: Any) -> str | None:
    if value is False or value is None:
        return None
    if value is True:
        return "not_smaller"
    return g.choice(op, "keep_aspect", value, ASPECT)


def _resize_nodes(
    graph: g.Graph,
    order: str,
    hw: tuple[int, int],
    mode: str,
    aspect: str | None,
    antialias: bool,
    cubic_coeff: float,
    dtype: str,
    elem: int,
    out: str,
) -> str | None:
    """Adds Shape..Resize from ``input`` to ``out``; returns the scale's name when the
    aspect ratio is kept (the factor applied to both sides), else None."""
    ha, wa = order.index("H"), order.index("W")
    shape = graph.node("Shape", ["input"])
    scale = None
    if aspect is None:
        target = graph.ints(hw, "size")
    else:
        in_hw = graph.node("Cast", [graph.node("Gather", [shape, graph.ints([ha, wa], "hw_axes")])], to=g.FLOAT)
        ratios = graph.node("Div", [graph.const(list(hw), "float32", [2], "size"), in_hw])  # [2]
        rh, rw = (graph.node("Gather", [ratios, graph.ints(i, "index")]) for i in (0, 1))
        scale = graph.node("Max" if aspect == "not_smaller" else "Min", [rh, rw])
        rounded = graph.node("Floor", [graph.node("Add", [graph.node("Mul", [in_hw, scale]), graph.scalar(0.5)])])
        target = graph.node("Cast", [graph.node("Max", [rounded, graph.scalar(1)])], to=g.INT64)

    def dims(start: int, end: int) -> str:
        return graph.node("Slice", [shape, graph.ints([start], "start"), graph.ints([end], "end")])

    parts = [dims(0, 2), target] if order == "NCHW" else [dims(0, 1), target, dims(3, 4)]
    sizes = graph.node("Concat", parts, axis=0)
    attrs: dict[str, Any] = dict(mode=mode, coordinate_transformation_mode="half_pixel")
    if mode == "nearest":
        # With half_pixel, round_prefer_ceil picks floor((x + 0.5) / scale): Pillow's and
        # torch's "nearest-exact" source pixel.
        attrs["nearest_mode"] = "round_prefer_ceil"
    if mode == "cubic":
        attrs["cubic_coeff_a"] = cubic_coeff
    if antialias:
        attrs["antialias"] = 1
    if mode == "cubic" or antialias:
        # Weights that fall outside the image are dropped and the rest renormalised, as
        # Pillow and torchvision's antialiased resize do (ONNX Runtime allows it only here).
        attrs["exclude_outside"] = 1
    if mode == "cubic" and not antialias and (order == "NHWC" or elem != g.FLOAT):
        # ONNX Runtime's CPU Resize shrinks with cubic only float32 channels-first images:
        # go through them, rounding back to the integer type.
        x = graph.node("Cast", ["input"], to=g.FLOAT) if elem != g.FLOAT else "input"
        if order == "NHWC":
            # The Reshape (to the shape it already has) keeps ONNX Runtime's transpose
            # optimiser from moving the Transpose back past the Resize.
            nchw_shape = graph.node("Gather", [shape, graph.ints([0, 3, 1, 2], "perm")])
            x = graph.node("Reshape", [graph.node("Transpose", [x], perm=[0, 3, 1, 2]), nchw_shape])
            sizes = graph.node("Gather", [sizes, graph.ints([0, 3, 1, 2], "perm")])
        y = graph.resize(x, sizes, **attrs)
        if order == "NHWC":
            y = graph.node("Transpose", [y], perm=[0, 2, 3, 1])
        if elem != g.FLOAT:
            lo, hi = (graph.scalar(v) for v in g.INT_RANGE[dtype])
            y = graph.node("Cast", [graph.node("Clip", [graph.node("Round", [y]), lo, hi])], to=elem)
        graph.node("Identity", [y], [out])
    else:
        graph.resize("input", sizes, [out], **attrs)
    return scale


def _resize_options(
    op: str, size: Any, mode: Any, antialias: Any, cubic_coeff: Any, layout: Any, dtype: Any, opset: Any
) -> tuple[tuple[int, int], str, bool, float, str, str, int, int]:
    hw = g.size2(op, size)
    chosen = g.choice(op, "mode", mode, MODES, MODE_ALIASES)
    aa = g.flag(op, "antialias", antialias)
    if aa and chosen == "nearest":
        raise g.fail(op, "antialias=True needs mode 'linear' or 'cubic' (nearest picks pixels, it does not filter)")
    coeff = g.number(op, "cubic_coeff", cubic_coeff)
    order = g.image_layout(op, layout)
    name, elem = g.dtype(op, dtype, RESIZE_DTYPES)
    version = g.opset(op, opset, 18 if aa else g.MIN_OPSET, "antialias=True")
    return hw, chosen, aa, coeff, order, name, elem, version


@g.operator
def resize(
    size: int | Sequence[int],
    mode: str = "linear",
    keep_aspect: bool | str = False,
    antialias: bool = False,
    *,
    cubic_coeff: float = -0.5,
    layout: str = "NCHW",
    dtype: Any = "float32",
    opset: int | None = None,
) -> Operator:
    """Resizes every image of the batch to ``size`` (an int for a square, or
    ``(height, width)``), with pixel centres aligned (``half_pixel``, like Pillow and
    torch's ``align_corners=False``).

    ``mode``: ``"nearest"``, ``"linear"`` (bilinear) or ``"cubic"`` (bicubic, with
    ``cubic_coeff``: -0.5 as Pillow and torchvision's antialiased resize, -0.75 as torch's
    ``interpolate`` and OpenCV). ``keep_aspect``: ``False``
    stretches to ``size``; ``True`` or ``"not_smaller"`` scales both sides by one factor so
    that the image covers ``size`` (``resize(256, keep_aspect=True)`` sets the shorter side
    to 256, like torchvision's ``Resize(256)``; follow with :func:`center_crop`);
    ``"not_larger"`` fits the image inside ``size``. Sides are rounded to the nearest
    pixel. ``antialias=True`` filters when shrinking, as Pillow does (needs opset 18, which
    becomes the default then). ``dtype``: float32, uint8, int8 or int32."""
    op = "resize"
    hw, chosen, aa, coeff, order, name, elem, version = _resize_options(
        op, size, mode, antialias, cubic_coeff, layout, dtype, opset
    )
    aspect = _aspect(op, keep_aspect)
    graph = g.Graph(op, version)
    _resize_nodes(graph, order, hw, chosen, aspect, aa, coeff, name, elem, "output")
    out_hw = dict(H=hw[0], W=hw[1]) if aspect is None else dict(H="resized_H", W="resized_W")
    call = g.call_text(
        op,
        dict(
            size=hw, mode=chosen, keep_aspect=aspect or False, antialias=aa, cubic_coeff=coeff, layout=order, dtype=name
        ),
    )
    return graph.model(
        call, [g.tensor("input", name, list(order))], [g.tensor("output", name, _dims(order, **out_hw))], version
    )


def _pad_centred(graph: g.Graph, order: str, x: str, have: str, want: str, fill: str, out: str) -> tuple[str, str]:
    """Pads ``x`` (height and width ``have``, int64 [2]) to ``want`` with ``fill``, half on
    each side (the odd pixel after); returns the [h, w] pads before and after."""
    missing = graph.int_max(graph.node("Sub", [want, have]), graph.ints([0, 0], "zeros"))
    # Integer Div on non-negative values is floor division.
    before = graph.node("Div", [missing, graph.ints(2, "two")])
    after = graph.node("Sub", [missing, before])
    # Pad's pads: the starts of every axis, then the ends.
    if order == "NCHW":
        two = graph.ints([0, 0], "zeros")
        pads = [two, before, two, after]
    else:
        one, two = graph.ints([0], "zeros"), graph.ints([0, 0], "zeros")
        pads = [one, before, two, after, one]
    graph.node("Pad", [x, graph.node("Concat", pads, axis=0), fill], [out])
    return before, after


@g.operator
def center_crop(
    size: int | Sequence[int], *, layout: str = "NCHW", dtype: Any = "float32", opset: int | None = None
) -> Operator:
    """Cuts the central ``size`` (an int for a square, or ``(height, width)``) out of every
    image: the top-left corner is at ``((H - height) // 2, (W - width) // 2)``. An image
    smaller than ``size`` is padded with zeros around it first, as torchvision does."""
    op = "center_crop"
    hw = g.size2(op, size)
    order = g.image_layout(op, layout)
    name, _ = g.dtype(op, dtype, g.INTEGERS + g.FLOATS)
    version = g.opset(op, opset)
    graph = g.Graph(op, version)
    axes = graph.ints([order.index("H"), order.index("W")], "hw_axes")
    in_hw = graph.node("Gather", [graph.node("Shape", ["input"]), axes])
    target = graph.ints(hw, "size")
    start = graph.node("Div", [graph.int_max(graph.node("Sub", [in_hw, target]), graph.ints([0, 0])), graph.ints(2)])
    # Slice stops at the edge: an image smaller than size comes out whole, then is padded.
    cropped = graph.node("Slice", ["input", start, graph.node("Add", [start, target]), axes])
    cropped_hw = graph.node("Gather", [graph.node("Shape", [cropped]), axes])
    _pad_centred(graph, order, cropped, cropped_hw, target, graph.scalar(0, name, "zero"), "output")
    call = g.call_text(op, dict(size=hw, layout=order, dtype=name))
    return graph.model(
        call,
        [g.tensor("input", name, list(order))],
        [g.tensor("output", name, _dims(order, H=hw[0], W=hw[1]))],
        version,
    )


@g.operator
def letterbox(
    size: int | Sequence[int],
    fill: float = 0.0,
    *,
    mode: str = "linear",
    antialias: bool = False,
    cubic_coeff: float = -0.5,
    layout: str = "NCHW",
    dtype: Any = "float32",
    opset: int | None = None,
) -> Operator:
    """Fits every image inside ``size`` keeping its aspect ratio (``resize(size,
    keep_aspect="not_larger")``), then pads it to exactly ``size`` with ``fill``, centred,
    as detectors (YOLO) expect.

    Outputs ``output``; ``scale`` (float32 scalar: the factor applied to both sides) and
    ``padding`` (int64 ``[top, left, bottom, right]``) to map detections back:
    ``x_original = (x - left) / scale``."""
    op = "letterbox"
    hw, chosen, aa, coeff, order, name, elem, version = _resize_options(
        op, size, mode, antialias, cubic_coeff, layout, dtype, opset
    )
    value = g.number(op, "fill", fill)
    if name != "float32":
        low, high = g.INT_RANGE[name]
        if value != int(value) or not low <= value <= high:
            raise g.fail(op, f"fill must be an integer in [{low}, {high}] for {name} images, got {fill!r}")
    graph = g.Graph(op, version)
    resized = f"{op}/resized"
    scale = _resize_nodes(graph, order, hw, chosen, "not_larger", aa, coeff, name, elem, resized)
    assert scale is not None  # an aspect kept: the scale it was resized by
    axes = graph.ints([order.index("H"), order.index("W")], "hw_axes")
    resized_hw = graph.node("Gather", [graph.node("Shape", [resized]), axes])
    fill_value = graph.scalar(value, name, "fill")
    before, after = _pad_centred(graph, order, resized, resized_hw, graph.ints(hw, "size"), fill_value, "output")
    graph.node("Identity", [scale], ["scale"])
    graph.node("Concat", [before, after], ["padding"], axis=0)
    call = g.call_text(
        op, dict(size=hw, fill=fill, mode=chosen, antialias=aa, cubic_coeff=coeff, layout=order, dtype=name)
    )
    return graph.model(
        call,
        [g.tensor("input", name, list(order))],
        [
            g.tensor("output", name, _dims(order, H=hw[0], W=hw[1])),
            g.tensor("scale", "float32", []),
            g.tensor("padding", "int64", [4]),
        ],
        version,
    )
