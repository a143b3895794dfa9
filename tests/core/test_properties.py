"""Property test: random valid chains of random graphs, merged, against running the parts
one after another in ONNX Runtime. Names come from a small pool (odd Unicode included) so
that models clash with each other in every way."""

from __future__ import annotations

import numpy as np
import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import fastseq
from conftest import session

NAMES = ["x", "y", "t", "c", "out", "m1/x", "m0/t", "名前", "ü", "a b", "😀", "x_1", "/Relu_output_0", "0"]
UNARY = ["Relu", "Neg", "Abs", "Tanh", "Sigmoid"]
BINARY = ["Add", "Mul", "Sub", "Max"]
SHAPE = [2, 3]


def vi(name):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, SHAPE)


@st.composite
def models(draw, index: int):
    """A random model of elementwise ops over [2, 3] float tensors, maybe with an If whose
    branches read outer-scope names."""
    pool = iter(draw(st.permutations(NAMES)))
    inputs = [next(pool) for _ in range(draw(st.integers(1, 2)))]
    inits = [next(pool) for _ in range(draw(st.integers(0, 2)))]
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    initializers = [numpy_helper.from_array(rng.uniform(-1, 1, SHAPE).astype(np.float32), n) for n in inits]
    available = inputs + inits
    nodes = []
    for k in range(draw(st.integers(1, 5))):
        out = next(pool, None)
        if out is None:
            break
        kind = draw(st.sampled_from(["unary", "binary", "if"]))
        if kind == "unary":
            nodes.append(
                helper.make_node(
                    draw(st.sampled_from(UNARY)),
                    [draw(st.sampled_from(available))],
                    [out],
                    name=f"{draw(st.sampled_from(NAMES))}{k}",
                )
            )
        elif kind == "binary":
            a, b = draw(st.sampled_from(available)), draw(st.sampled_from(available))
            nodes.append(helper.make_node(draw(st.sampled_from(BINARY)), [a, b], [out], name=f"n{k}"))
        else:
            outer = draw(st.sampled_from(available))
            then_g = helper.make_graph(
                [helper.make_node("Relu", [outer], [f"then_{k}"])], "then", [], [vi(f"then_{k}")]
            )
            else_g = helper.make_graph([helper.make_node("Neg", [outer], [f"else_{k}"])], "else", [], [vi(f"else_{k}")])
            cond = f"cond_{index}_{k}"
            initializers.append(numpy_helper.from_array(np.array(draw(st.booleans())), cond))
            nodes.append(helper.make_node("If", [cond], [out], then_branch=then_g, else_branch=else_g))
        available.append(out)
    produced = [n.output[0] for n in nodes]
    if not produced:
        produced = [next(iter(NAMES))]
        nodes.append(helper.make_node("Identity", [inputs[0]], produced))
        if produced[0] in inputs:
            return draw(models(index))
    outputs = [produced[-1]] + [o for o in produced[:-1] if draw(st.booleans())][:1]
    graph = helper.make_graph(nodes, f"g{index}", [vi(n) for n in inputs], [vi(n) for n in outputs], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@st.composite
def chains(draw):
    count = draw(st.integers(1, 4))
    ms = [draw(models(i)) for i in range(count)]
    io_maps = []
    for a, b in zip(ms, ms[1:]):
        outs = [o.name for o in a.graph.output]
        pairs = []
        for i, inp in enumerate(b.graph.input):
            if i == 0 or draw(st.booleans()):  # at least one connection per joint
                pairs.append((draw(st.sampled_from(outs)), inp.name))
        io_maps.append(pairs)
    return ms, io_maps


def run_parts(ms, io_maps, feeds_per_model):
    """Each model in its own session; joint inputs from upstream, the rest from feeds."""
    upstream = {}
    for k, m in enumerate(ms):
        fed = {i: o for o, i in (io_maps[k - 1] if k else [])}
        feeds = {
            i.name: (upstream[fed[i.name]] if i.name in fed else feeds_per_model[k][i.name]) for i in m.graph.input
        }
        s = session(m)
        upstream = dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))
    return list(upstream.values())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(chains(), st.integers(0, 2**16))
def test_random_chains_match_running_the_parts(chain, seed):
    ms, io_maps = chain
    merged = fastseq.compose(ms, io_maps=io_maps)
    onnx.checker.check_model(merged)
    rng = np.random.default_rng(seed)
    feeds_per_model, merged_feeds, order = [], {}, []
    for k, m in enumerate(ms):
        fed = {i for _, i in (io_maps[k - 1] if k else [])}
        feeds = {i.name: rng.uniform(-2, 2, SHAPE).astype(np.float32) for i in m.graph.input}
        feeds_per_model.append(feeds)
        order += [feeds[i.name] for i in m.graph.input if i.name not in fed]
    # The merged graph's inputs are the unfed inputs of each model, in model order.
    assert len(merged.graph.input) == len(order)
    merged_feeds = {vi.name: value for vi, value in zip(merged.graph.input, order)}
    # The first model's inputs keep their names.
    assert [i.name for i in merged.graph.input[: len(ms[0].graph.input)]] == [i.name for i in ms[0].graph.input]
    got = session(merged).run(None, merged_feeds)
    want = run_parts(ms, io_maps, feeds_per_model)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
