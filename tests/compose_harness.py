"""onnx's own fuzz harness for compose (``onnx/fuzz/fuzz_compose.py`` in the onnx repository),
its two paths driven by a seeded generator instead of atheris, each input run through
onnx.compose and fastseq.onnx_compose side by side (:func:`compose_fuzz.compare`).

The harness reads a toggle byte: prefixes ``g1_``/``g2_`` or none, a derived or a shuffled
io_map, and one of two paths:

- structured: two linear graphs of unary ops (``In1 -> ... -> Out1``, ``In2 -> ... ->
  Out2``) on one opset, so that most inputs reach the merge;
- raw: two serialized models parsed by protobuf (``onnx.load_model_from_string``). Here the
  bytes are valid models (the structured ones, or :mod:`compose_fuzz`'s) with a few bytes
  flipped, set, inserted or cut, as a mutating fuzzer makes them: protobuf accepts many
  (a known field with another wire type, an unknown field), and the merge must then be
  onnx's.

An input protobuf refuses is no case (the harness returns before merging)."""

from __future__ import annotations

import random

import onnx
from onnx import TensorProto, helper

import compose_fuzz

UNARY = ("Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Identity")
#: the opsets the structured path draws from (7 to onnx's newest)
MAX_OPSET = onnx.defs.onnx_opset_version()


def _linear(r: random.Random, tag: int, opset: int) -> onnx.ModelProto:
    """A linear graph In<tag> -> unary ops -> Identity -> Out<tag>, float [N]."""
    last, nodes = f"In{tag}", []
    for i in range(r.randint(0, 4)):
        nodes.append(helper.make_node(r.choice(UNARY), [last], [f"v{tag}_{i}"]))
        last = f"v{tag}_{i}"
    nodes.append(helper.make_node("Identity", [last], [f"Out{tag}"]))
    vi = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N"])  # noqa: E731
    graph = helper.make_graph(nodes, f"g{tag}", [vi(f"In{tag}")], [vi(f"Out{tag}")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _mutated(r: random.Random, data: bytes) -> bytes:
    """``data`` with one to three bytes flipped, set, inserted or cut."""
    out = bytearray(data)
    for _ in range(r.randint(1, 3)):
        if not out:
            out.append(r.randrange(256))
            continue
        at = r.randrange(len(out))
        kind = r.random()
        if kind < 0.4:
            out[at] ^= 1 << r.randrange(8)
        elif kind < 0.7:
            out[at] = r.randrange(256)
        elif kind < 0.85:
            out.insert(at, r.randrange(256))
        else:
            del out[at]
    return bytes(out)


def make_case(seed: int) -> compose_fuzz.Case | None:
    """The harness's input for ``seed`` as a case, or None where protobuf refuses a model."""
    r = random.Random(seed)
    toggles = r.randrange(256)
    prefixed, structured, shuffled = bool(toggles & 0x01), bool(toggles & 0x04), bool(toggles & 0x08)
    if structured:
        opset = r.randint(7, MAX_OPSET)
        m1, m2 = _linear(r, 1, opset), _linear(r, 2, opset)
    else:
        if r.random() < 0.5:
            opset = r.randint(7, MAX_OPSET)
            sources = [_linear(r, 1, opset), _linear(r, 2, opset)]
        else:  # compose_fuzz's richer models (clashing names, subgraphs, functions)
            sources = list(compose_fuzz.make_case(r.randrange(1 << 30)).args[:2])
            if not all(isinstance(m, onnx.ModelProto) for m in sources):
                return None
        data = [m.SerializeToString() for m in sources]
        which = r.choice([[0], [1], [0, 1]])  # the models mutated
        data = [_mutated(r, d) if k in which else d for k, d in enumerate(data)]
        try:
            m1, m2 = (onnx.load_model_from_string(d) for d in data)
        except Exception:  # noqa: BLE001 - protobuf refused it: the harness stops here
            return None
    outs = [o.name for o in m1.graph.output]
    ins = [i.name for i in m2.graph.input]
    if shuffled:
        r.shuffle(outs)
        r.shuffle(ins)
        n = r.randint(0, min(len(outs), len(ins))) if outs and ins else 0
        io_map = list(zip(outs[:n], ins[:n]))
    else:
        io_map = list(zip(outs, ins))
    kwargs = {"prefix1": "g1_", "prefix2": "g2_"} if prefixed else {}
    return compose_fuzz.Case(seed, "merge_models", (m1, m2, io_map), kwargs)
