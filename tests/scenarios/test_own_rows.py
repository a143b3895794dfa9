"""Every caller gets its own rows, whatever the mix of row counts (0 included), through the
batcher (threads and coroutines), ``batches.run_all`` (Ray Serve's batches), and the server
over HTTP (JSON and binary) and gRPC: a seeded generator of row counts and concurrency, each
answer compared with its request run alone (shape and values)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import fastseq
from fastseq.runtime import batches
from netserving import _model, pipe, running, wrong_answers


def tabular() -> fastseq.ONNXSequential:
    """x [N, 4] -> y = x @ w + b [N, 3]: every row's answer differs from every other's."""
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b")
    return pipe(
        _model(
            [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])],
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
            [w, b],
        )
    )


def requests(seed: int, callers: int, each: int, most: int = 4) -> list[list[np.ndarray]]:
    """``callers`` lists of ``each`` requests of 0 to ``most`` rows, every row distinct."""
    rng = np.random.default_rng(seed)
    return [
        [rng.standard_normal((int(rng.integers(0, most + 1)), 4)).astype(np.float32) for _ in range(each)]
        for _ in range(callers)
    ]


def same(got: list[np.ndarray], expected: list[np.ndarray]) -> bool:
    return len(got) == len(expected) and all(
        g.shape == e.shape and np.allclose(g, e, rtol=1e-5, atol=1e-6) for g, e in zip(got, expected)
    )


def test_a_request_of_no_rows_beside_one_of_two_takes_none_of_its_rows():
    p = tabular()
    runner = p.runner
    for counts in ([0, 2], [2, 0], [0, 1, 1], [1, 0, 1], [0, 0, 2], [3, 0, 0], [0, 0]):
        xs = [np.arange(k * 4, dtype=np.float32).reshape(k, 4) + 10 * i for i, k in enumerate(counts)]
        reqs = [batches.joinable(runner, runner.check_feeds({"x": x})) for x in xs]
        batches.run(runner, reqs)
        for x, r in zip(xs, reqs):
            assert same(r.answer, p(x)), counts


@pytest.mark.parametrize("seed", range(4))
def test_run_all_gives_each_request_its_own_rows(seed):
    p = tabular()
    runner = p.runner
    (xs,) = requests(seed, 1, 40)
    answers = batches.run_all(runner, [{"x": x} for x in xs], max_rows=int(np.random.default_rng(seed).integers(1, 9)))
    for x, a in zip(xs, answers):
        assert same(a, p(x))


@pytest.mark.parametrize("seed", range(3))
def test_batcher_threads_and_coroutines_get_their_own_rows(seed):
    p = tabular()
    rng = np.random.default_rng(100 + seed)
    callers = requests(seed, int(rng.integers(8, 33)), 12)
    expected = [[p(x) for x in mine] for mine in callers]
    wrong: list = []
    half = len(callers) // 2

    with p.batcher(max_batch_size=int(rng.integers(2, 17)), max_delay_ms=float(rng.choice([0, 1]))) as b:

        def thread(k: int) -> None:
            for j, x in enumerate(callers[k]):
                if not same(b(x), expected[k][j]):
                    wrong.append((k, j))

        def loop() -> None:
            async def caller(k: int) -> None:
                for j, x in enumerate(callers[k]):
                    if not same(await b.run_async(x), expected[k][j]):
                        wrong.append((k, j))

            async def main() -> None:
                await asyncio.gather(*(caller(k) for k in range(half, len(callers))))

            asyncio.run(main())

        workers = [threading.Thread(target=thread, args=(k,)) for k in range(half)] + [threading.Thread(target=loop)]
        for t in workers:
            t.start()
        for t in workers:
            t.join(120)
    assert not wrong


pytest.importorskip("uvicorn")
from tritonclient import grpc as tg  # noqa: E402
from tritonclient import http as th  # noqa: E402


@pytest.fixture(scope="module")
def server():
    p = tabular()
    with running({"tab": p}, grpc_port=0, max_batch_size=8) as s:
        yield s, p


def _http_input(binary: bool):
    def make(name: str, a: np.ndarray) -> th.InferInput:
        x = th.InferInput(name, list(a.shape), "FP32")
        x.set_data_from_numpy(a, binary_data=binary)
        return x

    return make


def _grpc_input(name: str, a: np.ndarray) -> tg.InferInput:
    x = tg.InferInput(name, list(a.shape), "FP32")
    x.set_data_from_numpy(a)
    return x


@pytest.mark.parametrize("transport", ["http-binary", "http-json", "grpc"])
def test_server_answers_hold_only_their_own_rows(server, transport):
    s, p = server
    callers = requests({"http-binary": 1, "http-json": 2, "grpc": 3}[transport], 16, 15)
    if transport == "grpc":
        connect, make = (lambda: tg.InferenceServerClient(f"127.0.0.1:{s.grpc_port}")), _grpc_input
    else:
        connect = lambda: th.InferenceServerClient(f"127.0.0.1:{s.port}", network_timeout=60)  # noqa: E731
        make = _http_input(transport == "http-binary")
    assert not wrong_answers(connect, make, p, callers, model="tab", input_name="x", output="y")
