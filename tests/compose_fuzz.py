"""A seeded generator of onnx.compose calls, and the side-by-side run of one call through
onnx.compose and fastseq.onnx_compose (fastseq's own, in the spirit of onnx's fuzz harness
for compose, onnx/fuzz/fuzz_compose.py: small structured models rather than raw bytes, so
that most calls reach the merge).

A case is two small models (random DAGs of unary and binary ops, names drawn from a small
shared pool so that they collide or not, initializers, value_info, If subgraphs reading
outer names, local functions, metadata, IR versions and opsets that agree or not) and one
call: ``merge_models`` (io_map derived, partial, shuffled or wrong; prefixes; ``inputs`` /
``outputs``), ``merge_graphs``, ``add_prefix`` or ``expand_out_dim``. Some models get odd
bytes where protobuf accepts them: non-UTF-8 ``dim_param`` and domains, unknown fields,
external-data locations, duplicate names, a missing graph, IR version 0.

:func:`compare` runs one case through both, onnx's result checked as onnx's harness checks
it (``check_model(full_check=True)``), and every model fastseq returns checked the same way.
``tests/peers/test_onnx_compose_fuzz.py`` runs a few hundred cases; ``benches/fuzz_compose.py``
runs 20,000 and prints the summary.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import onnx
import onnx.compose as onnx_compose
from onnx import TensorProto, helper, numpy_helper

import fastseq.onnx_compose as fast_compose

UNARY = ("Relu", "Neg", "Abs", "Sigmoid", "Tanh", "Identity", "Exp")
BINARY = ("Add", "Mul", "Sub")
POOL = ("x", "y", "t", "a", "b", "c", "w", "In", "Out", "node", "cond")
OPSETS = (7, 9, 11, 13, 15, 17, 18, 21)
#: a placeholder of the same length as the odd bytes that replace it after serializing
ODD_DIM, ODD_DIM_BYTES = b"ODDDIM", b"\xff\xfeDDIM"
ODD_DOMAIN, ODD_DOMAIN_BYTES = b"odd.dom", b"\xffdd.dom"
UNKNOWN_FIELD = b"\xb8\x3e\x2a"  # field 999, varint 42: no ONNX message has it


def _min_ir(opset: int) -> int:
    return helper.find_min_ir_version_for([helper.make_opsetid("", opset)], ignore_unknown=True)


@dataclass
class Case:
    seed: int
    fn: str
    args: tuple
    kwargs: dict = field(default_factory=dict)

    def describe(self) -> str:
        kw = {k: v for k, v in self.kwargs.items()}
        return f"seed {self.seed}: {self.fn}(..., {kw})"


class _Builder:
    """One model, its names drawn from the shared pool (probability ``clash``) or its own."""

    def __init__(self, rng: random.Random, tag: str, opset: int, ir: int, clash: float):
        self.rng, self.tag, self.opset, self.ir, self.clash = rng, tag, opset, ir, clash
        self.used: set[str] = set()
        self.odd_dim = False

    def fresh(self, hint: str) -> str:
        r = self.rng
        for _ in range(20):
            name = r.choice(POOL) if r.random() < self.clash else f"{hint}{self.tag}_{r.randrange(100)}"
            if name not in self.used:
                self.used.add(name)
                return name
        name = f"{hint}{self.tag}_{len(self.used)}_u"
        self.used.add(name)
        return name

    def shape(self):
        r = self.rng
        dims = r.choice([["N"], [2, 3], ["batch", 3], [4]])
        if dims and r.random() < 0.04:
            dims = [ODD_DIM.decode()] + dims[1:]
            self.odd_dim = True
        return dims

    def node_name(self, k: int) -> str | None:
        r = self.rng.random()
        if r < 0.45:
            return None  # unset
        if r < 0.55:
            return ""  # set, empty
        if r < 0.65:
            return self.rng.choice(POOL)
        return f"n{self.tag}_{k}"

    def model(self) -> onnx.ModelProto:
        r = self.rng
        elem = TensorProto.FLOAT if r.random() < 0.93 else TensorProto.DOUBLE
        shape = self.shape()
        inputs = [self.fresh("in") for _ in range(r.randint(1, 3))]
        # Each value's shape: the inputs' own, [1] for weights; a node's follows its inputs.
        shape_of = {i: shape for i in inputs}
        inits = []
        for _ in range(r.choice([0, 0, 1, 2])):
            name = self.fresh("w")
            t = helper.make_tensor(name, elem, [1], [r.random()])
            if r.random() < 0.5:  # the same value as raw_data
                t = numpy_helper.from_array(numpy_helper.to_array(t), name)
            inits.append(t)
            shape_of[name] = [1]
        nodes, value_info, funcs = [], [], []

        def add(node, out, ins):
            nodes.append(node)
            shapes = [shape_of[i] for i in ins]
            shape_of[out] = shape if shape in shapes else shapes[0]
            if r.random() < 0.3:
                value_info.append(helper.make_tensor_value_info(out, elem, shape_of[out]))

        for k in range(r.randint(0, 5)):
            out, values = self.fresh("v"), list(shape_of)
            if r.random() < 0.35 and len(values) > 1:
                op, ins = r.choice(BINARY), r.sample(values, 2)
            else:
                op, ins = r.choice(UNARY), [r.choice(values)]
            kw = {}
            name = self.node_name(k)
            if name is not None:
                kw["name"] = name
            add(helper.make_node(op, ins, [out], **kw), out, ins)
        if r.random() < 0.12 and self.opset >= 11:
            outer = r.choice(list(shape_of))
            cond, if_node = self._if(outer, elem, shape_of[outer])
            nodes.append(cond)
            add(if_node, if_node.output[0], [outer])
        domain = None
        if r.random() < 0.08 and self.ir >= 8:
            domain, fname = "local.fn", r.choice(["Fn", f"Fn{self.tag}"])
            body = [helper.make_node("Relu", ["X"], ["Y"])]
            funcs.append(helper.make_function(domain, fname, ["X"], ["Y"], body, [helper.make_opsetid("", self.opset)]))
            out, src = self.fresh("v"), r.choice(list(shape_of))
            add(helper.make_node(fname, [src], [out], domain=domain), out, [src])
        odd_domain = False
        if r.random() < 0.03:
            out, src = self.fresh("v"), r.choice(list(shape_of))
            nodes.append(helper.make_node("Custom", [src], [out], domain=ODD_DOMAIN.decode()))
            shape_of[out] = None  # a custom op: no shape to infer
            odd_domain = True
        produced = [o for n in nodes for o in n.output if shape_of.get(o) is not None or r.random() < 0.3]
        outs = r.sample(produced, min(len(produced), r.randint(1, 2))) if produced else []
        if not outs or r.random() < 0.06:
            outs.append(r.choice(inputs))  # an output that is a graph input
        outs = list(dict.fromkeys(outs))
        g = helper.make_graph(
            nodes,
            self.fresh("g") if r.random() < 0.8 else "g",
            [helper.make_tensor_value_info(i, elem, shape) for i in inputs],
            [helper.make_tensor_value_info(o, elem, shape_of.get(o) or shape) for o in outs],
            initializer=inits,
            value_info=value_info,
            doc_string=r.choice(["", "", f"doc {self.tag}"]),
        )
        if self.ir < 4:  # weights listed as inputs too
            g.input.extend(helper.make_tensor_value_info(t.name, elem, [1]) for t in inits)
        opsets = [helper.make_opsetid("", self.opset)]
        if domain:
            opsets.append(helper.make_opsetid(domain, 1))
        if odd_domain:
            opsets.append(helper.make_opsetid(ODD_DOMAIN.decode(), 1))
        m = helper.make_model(g, opset_imports=opsets, functions=funcs, ir_version=self.ir)
        if r.random() < 0.15:
            key = r.choice(["author", "k"])
            helper.set_model_props(m, {key: r.choice(["v1", "v2"])})
        self._hostile(m)
        return m

    def _if(self, outer, elem, shape):
        """A Constant condition and an If whose branches read an outer value (an
        initializer, an input or a node output) and may reuse each other's names."""
        r = self.rng
        cond = self.fresh("cond")
        c = helper.make_node("Constant", [], [cond], value=helper.make_tensor("cv", TensorProto.BOOL, [], [True]))

        def branch(tag):
            out = r.choice(["bo", f"bo{tag}"])
            node = helper.make_node(r.choice(UNARY), [outer], [out], name=r.choice(["", f"b{tag}"]))
            return helper.make_graph([node], f"br{tag}", [], [helper.make_tensor_value_info(out, elem, shape)])

        out = self.fresh("v")
        if_node = helper.make_node("If", [cond], [out], then_branch=branch("t"), else_branch=branch("e"))
        if r.random() < 0.6:
            if_node.name = f"if{self.tag}"
        return c, if_node

    def _hostile(self, m: onnx.ModelProto) -> None:
        """Now and then, a model that protobuf accepts and onnx's checker may not."""
        r, g = self.rng, m.graph
        roll = r.random()
        if roll < 0.02 and g.initializer:
            g.initializer.append(g.initializer[0])  # a duplicate initializer
        elif roll < 0.04 and len(g.node) >= 2 and g.node[0].output:
            g.node[-1].output[0] = g.node[0].output[0]  # two nodes write one output
        elif roll < 0.06:
            g.input.append(g.input[0])  # a duplicate graph input
        elif roll < 0.09 and g.initializer:
            t = g.initializer[0]
            t.ClearField("raw_data")
            t.ClearField("float_data")
            t.ClearField("double_data")
            t.data_location = TensorProto.EXTERNAL
            t.external_data.add(key="location", value=r.choice(["../x.bin", "/abs/x.bin", "/dev/zero", "w.bin"]))
        elif roll < 0.10:
            m.ir_version = 0
        elif roll < 0.11:
            m.ClearField("graph")
        elif roll < 0.14 and g.node and g.node[0].output:
            g.node[0].output.append(g.node[0].output[0] + "_2")  # an extra output Relu lacks


def _odd_bytes(m: onnx.ModelProto, b: _Builder, r: random.Random) -> onnx.ModelProto:
    """Unknown fields in some messages; the placeholders replaced by non-UTF-8 bytes."""
    if r.random() < 0.06:
        where = r.choice(["model", "graph", "node", "input", "initializer", "opset", "function", "output"])
        target = {
            "model": m,
            "graph": m.graph if m.HasField("graph") else None,
            "node": m.graph.node[0] if m.graph.node else None,
            "input": m.graph.input[0] if m.graph.input else None,
            "output": m.graph.output[0] if m.graph.output else None,
            "initializer": m.graph.initializer[0] if m.graph.initializer else None,
            "opset": m.opset_import[0] if m.opset_import else None,
            "function": m.functions[0] if m.functions else None,
        }[where]
        if target is not None:
            target.MergeFromString(UNKNOWN_FIELD)
    data = m.SerializeToString()
    if b.odd_dim:
        data = data.replace(ODD_DIM, ODD_DIM_BYTES)
    data = data.replace(ODD_DOMAIN, ODD_DOMAIN_BYTES)
    return onnx.ModelProto.FromString(data)


def make_case(seed: int) -> Case:
    r = random.Random(seed)
    opset = r.choice(OPSETS)
    ir = max(_min_ir(opset), r.choice([3, 7, 8, 9, 10]))
    opset2 = opset if r.random() < 0.9 else r.choice(OPSETS)
    ir2 = ir if r.random() < 0.9 else max(_min_ir(opset2), r.choice([3, 7, 8, 10]))
    clash = r.choice([0.0, 0.0, 0.3, 0.8])
    b1, b2 = _Builder(r, "1", opset, ir, clash), _Builder(r, "2", opset2, ir2, clash)
    m1, m2 = _odd_bytes(b1.model(), b1, r), _odd_bytes(b2.model(), b2, r)
    roll = r.random()
    if roll < 0.08:
        return Case(seed, "add_prefix", (m1, r.choice(["p/", "g1_", "x"])), _flags(r))
    if roll < 0.16:
        return Case(seed, "expand_out_dim", (m1, r.choice([0, 1, -1, 2, -2])))
    outs = [o.name for o in m1.graph.output]
    ins = [i.name for i in m2.graph.input]
    kind = r.random()
    if kind < 0.55:
        io_map = list(zip(outs, ins))
    elif kind < 0.8:
        r.shuffle(outs)
        r.shuffle(ins)
        n = r.randint(0, min(len(outs), len(ins)))
        io_map = list(zip(outs[:n], ins[:n]))
    elif kind < 0.9:
        io_map = [(o, i) for o, i in zip(outs, ins)] + [(r.choice(POOL), r.choice(POOL))]
    else:
        io_map = []
    kw = {}
    p = r.random()
    if p < 0.35:
        kw.update(prefix1="g1_", prefix2="g2_")
    elif p < 0.45:
        kw[r.choice(["prefix1", "prefix2"])] = "p_"
    elif p < 0.5:
        kw.update(prefix1="p_", prefix2="p_")
    if r.random() < 0.06:
        kw["outputs"] = [o.name for o in m2.graph.output][:1]
    if r.random() < 0.1:
        kw["name"] = "merged"
    fn = "merge_graphs" if roll < 0.24 else "merge_models"
    if fn == "merge_graphs":
        return Case(seed, fn, (m1.graph, m2.graph, io_map), kw)
    return Case(seed, fn, (m1, m2, io_map), kw)


def _flags(r: random.Random) -> dict:
    names = (
        "rename_nodes",
        "rename_edges",
        "rename_inputs",
        "rename_outputs",
        "rename_initializers",
        "rename_value_infos",
        "rename_functions",
    )
    return {k: False for k in names if r.random() < 0.15}


@dataclass
class Outcome:
    """What one implementation did: ``value`` (a proto) or ``error`` (the exception)."""

    value: object = None
    error: BaseException | None = None
    invalid: BaseException | None = None  # what check_model(full_check=True) raised on value


def _copy(x):
    if isinstance(x, (onnx.ModelProto, onnx.GraphProto)):
        return type(x).FromString(x.SerializeToString())
    if isinstance(x, list):
        return [_copy(v) for v in x]
    return x


def run(module, case: Case) -> Outcome:
    fn = getattr(module, case.fn)
    try:
        value = fn(*[_copy(a) for a in case.args], **_copy(case.kwargs))
    except Exception as e:  # noqa: BLE001  (any class counts; it is compared)
        return Outcome(error=e)
    out = Outcome(value=value)
    if isinstance(value, onnx.ModelProto):
        try:
            onnx.checker.check_model(value, full_check=True)
        except Exception as e:  # noqa: BLE001
            out.invalid = e
    return out


def _same_class(ours: BaseException, ref: BaseException) -> bool:
    return isinstance(ours, type(ref))


@dataclass
class Verdict:
    """One case's category, with what to show."""

    category: str
    detail: str = ""
    #: fastseq's result has names it made up (m0/..., m1/...): a clash it renamed
    renamed: bool = False


#: the functions whose results onnx.compose checks (merge_models) or whose results fastseq
#: promises pass the checker (expand_out_dim); the others (add_prefix, merge_graphs) rename
#: or join what they are given, valid or not, in both
CHECKED = ("merge_models", "expand_out_dim")

#: onnx.compose's refusals or broken results that fastseq deliberately does otherwise (the
#: README's table): a part of onnx's message, or of fastseq's, and the reason
DELIBERATE = (
    ("Cant merge two graphs with overlapping names", "clashing names are renamed"),
    ("IR version mismatch", "different IR versions merge"),
    ("overlapping local function names", "same-named functions are kept once or renamed"),
    ("is not an output of any model (did you mean", "an unknown name in outputs is refused"),
    ("is not an input of any model (did you mean", "an unknown name in inputs is refused"),
    ("op_type:Unsqueeze", "expand_out_dim writes the shape Unsqueeze produces"),
    ("schema(::Unsqueeze", "expand_out_dim writes the Unsqueeze of the model's opset"),
    ("AssertionError", "onnx's Extractor asserts (an unknown name in outputs: fastseq refuses or cuts down)"),
    ("is out of range for output", "expand_out_dim refuses a dim_idx outside what Unsqueeze takes"),
    ("is an output of several models", "merge_graphs refuses an output both graphs have (onnx lists it twice)"),
    ("initializer name is not unique", "a source repeating an initializer name is refused as the checker refuses it"),
)


#: where onnx.compose's result breaks a naming rule and fastseq's is valid (a verdict
#: ``onnx_raises_fastseq_returns``): onnx's message, and the README's row
BROKEN_BY_ONNX = (
    ("single static assignment", "clashing names are renamed (onnx's overlap check misses unread inputs)"),
    ("topologically sorted", "bodies reading outer names stay valid"),
    ("is not an output of any node", "an output that is an io_map-fed input is the value feeding it"),
)


def deliberate(case: Case, verdict: Verdict) -> str | None:
    """The README's deliberate difference that a verdict shows, if any."""
    cat, detail = verdict.category, verdict.detail
    if cat in ("same", "both_raise"):
        return None
    if case.fn == "merge_models" and _fed_outputs(case):
        return "an output that is an io_map-fed input is the value feeding it"
    if verdict.renamed and cat in ("bytes_differ", "onnx_raises_fastseq_returns"):
        return "clashing names are renamed"
    if cat == "bytes_differ":
        if case.fn == "expand_out_dim" and ".shape.dim[" in detail:
            return "expand_out_dim writes the shape Unsqueeze produces"
        if case.fn == "expand_out_dim" and "value_info" in detail:
            return "expand_out_dim renames an output's value_info with it"
        if detail.endswith(".name") and "node[" in detail:
            return "node names both graphs use are renamed"
        if case.fn == "merge_graphs":
            return "merge_graphs: clashing names renamed, io_map-fed outputs joined (onnx's graph is broken)"
        if case.fn == "add_prefix" and ".g.node[" in detail:
            return "bodies reading outer names stay valid"
    if cat in ("onnx_raises_fastseq_returns", "class_differs"):
        found = next((why for part, why in BROKEN_BY_ONNX if part in detail), None)
        if found:
            return found
    return next((why for part, why in DELIBERATE if part in detail), None)


def _made_up_names(value) -> bool:
    """Whether a result has names fastseq made up for a clash (the generator's never start
    with m0/ or m1/)."""
    g = value.graph if isinstance(value, onnx.ModelProto) else value
    names = [v.name for v in (*g.input, *g.output, *g.value_info, *g.initializer)]
    names += [o for n in g.node for o in (*n.input, *n.output)]
    # protobuf hands a name that is not UTF-8 back as bytes
    return any((n if isinstance(n, str) else n.decode("utf-8", "replace")).startswith(("m0/", "m1/")) for n in names)


def _fed_outputs(case: Case) -> set[str]:
    """The second model's outputs that are also inputs the io_map feeds."""
    m2, io_map = case.args[1], case.args[2]
    return {i for _, i in io_map} & {o.name for o in m2.graph.output}


def compare(case: Case) -> Verdict:
    """The category of one case:

    - ``same``: both return the same bytes (and fastseq's passes the checker);
    - ``bytes_differ``: both return, not the same bytes (onnx's passing the checker);
    - ``onnx_returns_fastseq_raises``: onnx's result passes its checker, fastseq raises;
    - ``onnx_raises_fastseq_invalid``: onnx raises (or, for merge_models and
      expand_out_dim, its result fails ``check_model(full_check=True)``) and fastseq returns
      a model that fails it too;
    - ``onnx_raises_fastseq_returns``: onnx raises, fastseq returns a valid model (what the
      deliberate differences give; ``detail`` has onnx's message);
    - ``both_raise`` / ``class_differs``: both raise, the same class or not;
    - ``fastseq_invalid``: onnx returns a valid model, fastseq an invalid one.
    """
    ref, ours = run(onnx_compose, case), run(fast_compose, case)
    checked = case.fn in CHECKED
    ref_error = ref.error or (ref.invalid if checked else None)
    if ours.value is not None and ours.invalid is not None and (checked or ref.invalid is None):
        cat = "onnx_raises_fastseq_invalid" if ref_error or ref.invalid else "fastseq_invalid"
        return Verdict(cat, f"{type(ours.invalid).__name__}: {str(ours.invalid)[:200]}")
    if ref_error is None:
        if ours.error is not None:
            return Verdict("onnx_returns_fastseq_raises", f"{type(ours.error).__name__}: {str(ours.error)[:200]}")
        if ref.value.SerializeToString() == ours.value.SerializeToString():
            return Verdict("same")
        return Verdict("bytes_differ", _first_difference(ref.value, ours.value), _made_up_names(ours.value))
    if ours.error is None:
        detail = f"{type(ref_error).__name__}: {str(ref_error)[:160]}"
        return Verdict("onnx_raises_fastseq_returns", detail, _made_up_names(ours.value))
    if _same_class(ours.error, ref_error):
        return Verdict("both_raise", type(ref_error).__name__)
    return Verdict(
        "class_differs",
        f"onnx {type(ref_error).__name__}: {str(ref_error)[:120]} | fastseq {type(ours.error).__name__}: "
        f"{str(ours.error)[:120]}",
    )


def _first_difference(a, b, path: str = "") -> str:
    """Where two messages first differ (field path), for the report."""
    if a.SerializeToString() == b.SerializeToString():
        return ""
    fa, fb = dict(a.ListFields()), dict(b.ListFields())
    for f in sorted(set(fa) | set(fb), key=lambda f: f.number):
        va, vb = fa.get(f), fb.get(f)
        if va == vb:
            continue
        if va is None or vb is None:
            return f"{path}{f.name} (present in {'fastseq' if va is None else 'onnx'} only)"
        if f.message_type is not None and f.is_repeated and len(va) == len(vb):
            for k, (x, y) in enumerate(zip(va, vb)):
                if x.SerializeToString() != y.SerializeToString():
                    return _first_difference(x, y, f"{path}{f.name}[{k}].")
        if f.message_type is not None and not f.is_repeated:
            return _first_difference(va, vb, f"{path}{f.name}.")
        return f"{path}{f.name}"
    return f"{path}(unknown fields or encoding)"
