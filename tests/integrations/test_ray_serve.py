"""Pipelines on Ray Serve, on a real local Ray cluster (two CPUs), answered by the same client
as ``fastseq serve`` (``tritonclient.http``): fastseq's batching and Ray Serve's own, each
caller's rows as ``pipe(x)`` gives them, errors in the pipeline's names, the model shipped
through the object store, a pipeline whose rows mix served request by request."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
http = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

from netserving import cnn, mixing, pipe, several, wait_ready, wrong_answers  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield port
    serve.shutdown()
    ray.shutdown()


def tensor(name: str, a: np.ndarray) -> http.InferInput:
    from tritonclient.utils import np_to_triton_dtype

    x = http.InferInput(name, list(a.shape), np_to_triton_dtype(a.dtype))
    x.set_data_from_numpy(a)
    return x


@pytest.mark.parametrize("batching", ["fastseq", "ray"])
def test_ray_serve_answers_the_triton_client(cluster, batching):
    import fastseq.ray_serve

    port = cluster
    models = {"cnn": pipe(cnn()), "several": pipe(several()), "mix": pipe(mixing())}
    app = fastseq.ray_serve.application(
        models, batching=batching, max_batch_size=8, max_delay_ms=2, ray_actor_options={"num_cpus": 1}
    )
    serve.run(app, name=f"fastseq-{batching}", route_prefix="/", blocking=False)
    try:
        # serve.run returned: the replicas are up and warmed, and the first request is an infer
        c = http.InferenceServerClient(f"127.0.0.1:{port}")
        x = np.ones((1, 3, 20, 20), np.float32)
        np.testing.assert_allclose(
            c.infer("cnn", [tensor("image", x)]).as_numpy("logits"), models["cnn"](x)[0], rtol=1e-5, atol=1e-6
        )
        wait_ready(f"http://127.0.0.1:{port}", timeout=120)
        assert c.is_model_ready("cnn") and c.get_model_metadata("cnn")["inputs"][0]["name"] == "image"
        rng = np.random.default_rng(0)
        rows = rng.standard_normal((8, 12, 1, 3, 20, 20)).astype(np.float32)
        assert not wrong_answers(lambda: http.InferenceServerClient(f"127.0.0.1:{port}"), tensor, models["cnn"], rows)
        x, k = np.ones((2, 4), np.float32), np.array([[1], [2]], np.int64)
        got = c.infer("several", [tensor("x", x), tensor("k", k)])
        np.testing.assert_array_equal(got.as_numpy("doubled"), models["several"](x, k)[1])
        m = rng.standard_normal((3, 4)).astype(np.float32)
        np.testing.assert_allclose(c.infer("mix", [tensor("x", m)]).as_numpy("y"), models["mix"](m)[0], rtol=1e-6)
        with pytest.raises(InferenceServerException, match="input 'image' expects size 20 on axis 3"):
            c.infer("cnn", [tensor("image", np.zeros((1, 3, 20, 21), np.float32))])
        with pytest.raises(InferenceServerException, match="'x' is not an input of model 'cnn'"):
            c.infer("cnn", [tensor("x", np.zeros((1, 3, 20, 20), np.float32))])
    finally:
        serve.delete(f"fastseq-{batching}")


def test_ray_serve_refuses_unknown_settings(cluster):
    import fastseq.ray_serve

    with pytest.raises(fastseq.InputError, match="batching must be 'fastseq' or 'ray'"):
        fastseq.ray_serve.application(pipe(cnn()), batching="both")
    with pytest.raises(fastseq.InputError, match="'max_batch' is not a serving option"):
        fastseq.ray_serve.application(pipe(cnn()), max_batch=4)
