"""gRPC whole, and what Triton's own tools read: ModelConfig and ModelStatistics over gRPC and
``/v2/models[/{name}]/config`` and ``/stats`` over HTTP, checked with tritonclient (HTTP and
gRPC alike); Triton's ``perf_analyzer`` driving the server over HTTP and over gRPC (where it
is installed: ``benches/bench_netserve.py --setup``); ready only once every transport takes
connections (gRPC ServerReady right after HTTP ready answers 200, over 20 starts); and the
warm-up run not counted in ``nv_inference_count`` or the statistics."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from netserving import Process, cnn, get, metrics, pipe, running, several, wait_ready

tg = pytest.importorskip("tritonclient.grpc")
th = pytest.importorskip("tritonclient.http")

LABEL = '{model="cnn",version="1"}'


@pytest.fixture(scope="module")
def server():
    with running(
        {
            "cnn": pipe(cnn()),
            "several": pipe(
                several(),
            ),
        },
        grpc_port=0,
        max_batch_size=16,
        max_delay_ms=2,
    ) as s:
        yield s


def clients(server):
    return (
        th.InferenceServerClient(f"127.0.0.1:{server.port}"),
        tg.InferenceServerClient(f"127.0.0.1:{server.grpc_port}"),
    )


def test_model_config_over_both_transports(server):
    h, g = clients(server)
    http_config = h.get_model_config("cnn")
    grpc_config = g.get_model_config("cnn", as_json=True)["config"]
    assert http_config["name"] == grpc_config["name"] == "cnn"
    assert http_config["max_batch_size"] == int(grpc_config["max_batch_size"]) == 16
    assert http_config["input"] == [{"name": "image", "data_type": "TYPE_FP32", "dims": [3, 20, 20]}]
    assert [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in grpc_config["input"]] == [
        ("image", "TYPE_FP32", [3, 20, 20])
    ]
    assert http_config["output"] == [{"name": "logits", "data_type": "TYPE_FP32", "dims": [10]}]
    assert http_config["dynamic_batching"] == {"max_queue_delay_microseconds": 2000}
    assert int(grpc_config["dynamic_batching"]["max_queue_delay_microseconds"]) == 2000
    several = g.get_model_config("several").config
    assert [(t.name, t.data_type) for t in several.input] == [("x", 11), ("k", 9)]  # TYPE_FP32, TYPE_INT64
    # a model that is not there, and a version that is not
    for call in (
        lambda: h.get_model_config("cnm"),
        lambda: g.get_model_config("cnm"),
        lambda: g.get_model_config("cnn", "7"),
    ):
        with pytest.raises(Exception, match="no model 'cnm'|has no version '7'"):
            call()


def test_statistics_over_both_transports_count_what_ran(server):
    h, g = clients(server)
    before = h.get_inference_statistics("cnn")["model_stats"][0]
    x = np.random.default_rng(0).standard_normal((3, 3, 20, 20)).astype(np.float32)
    for _ in range(4):
        i = th.InferInput("image", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        h.infer("cnn", [i])
        j = tg.InferInput("image", list(x.shape), "FP32")
        j.set_data_from_numpy(x)
        g.infer("cnn", [j])
    over_http = h.get_inference_statistics("cnn")["model_stats"][0]
    over_grpc = g.get_inference_statistics("cnn", as_json=True)["model_stats"][0]
    assert over_http["inference_count"] - before["inference_count"] == 24  # 8 requests of 3 rows
    assert int(over_grpc["inference_count"]) == over_http["inference_count"]
    assert int(over_grpc["inference_stats"]["success"]["count"]) == over_http["inference_stats"]["success"]["count"]
    assert over_http["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == 8
    assert over_http["execution_count"] > before["execution_count"]
    assert over_http["batch_stats"] and all(b["batch_size"] >= 1 for b in over_http["batch_stats"])
    # every model at once, over HTTP's /v2/models/stats and gRPC's empty name
    every = json.loads(get(server.url + "/v2/models/stats")[1])["model_stats"]
    assert sorted(m["name"] for m in every) == ["cnn", "several"]
    assert sorted(m.name for m in g.get_inference_statistics("").model_stats) == ["cnn", "several"]
    status, body = get(server.url + "/v2/models/cnn/versions/1/stats")
    assert status == 200 and json.loads(body)["model_stats"][0]["name"] == "cnn"
    assert get(server.url + "/v2/models/cnn/versions/2/stats")[0] == 404


def test_the_warm_up_is_not_counted():
    with running({"cnn": pipe(cnn())}, grpc_port=0) as server:
        m = metrics(server.url)
        assert m["nv_inference_count" + LABEL] == 0
        assert m["nv_inference_exec_count" + LABEL] == 0
        assert m["nv_inference_request_success" + LABEL] == 0
        h, g = clients(server)
        stats = h.get_inference_statistics("cnn")["model_stats"][0]
        assert stats["inference_count"] == 0 and stats["execution_count"] == 0 and not stats["batch_stats"]
        x = np.zeros((3, 3, 20, 20), np.float32)
        i = th.InferInput("image", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        h.infer("cnn", [i])
        m = metrics(server.url)
        assert m["nv_inference_count" + LABEL] == 3 and m["nv_inference_exec_count" + LABEL] == 1
        assert int(g.get_inference_statistics("cnn", as_json=True)["model_stats"][0]["inference_count"]) == 3


def test_ready_means_every_transport_takes_connections():
    """20 starts in this process: the moment HTTP's ready answers 200, gRPC's ServerReady says
    true (its socket was bound, and served, before the server said ready)."""
    small = several()
    for _ in range(20):
        with running({"several": pipe(small)}, grpc_port=0) as server:
            g = tg.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
            assert g.is_server_ready() and g.is_model_ready("several")
            g.close()


def test_ready_means_every_transport_takes_connections_as_a_process(tmp_path):
    import onnx

    path = tmp_path / "several.onnx"
    onnx.save(several(), path)
    for _ in range(3):
        p = Process(str(path), "--name", "several", "--grpc-port", "0")
        try:
            wait_ready(p.url)
            g = tg.InferenceServerClient(f"127.0.0.1:{p.grpc_port}")
            assert g.is_server_ready()
            g.close()
        finally:
            assert p.stop() == 0


# --- perf_analyzer --------------------------------------------------------------------------------
def perf_analyzer() -> tuple[str | None, dict, str]:
    """perf_analyzer from the tritonclient==2.40.0 wheel (benches/bench_netserve.py --setup puts
    it in a venv of its own), the environment it needs, or why it is not here."""
    roots = [
        os.environ.get("FASTSEQ_PERF_VENV", ""),
        str(Path(__file__).resolve().parents[2] / "benches" / "out" / "venvs" / "perf"),
        "/work/wt-bench/benches/out/venvs/perf",
    ]
    for root in filter(None, roots):
        exe = Path(root) / "bin" / "perf_analyzer"
        libs = sorted(Path(root).glob("lib/python3*/site-packages/nvidia/cuda_runtime/lib"))
        if exe.exists() and libs:
            env = dict(os.environ, LD_LIBRARY_PATH=":".join([str(libs[0]), os.environ.get("LD_LIBRARY_PATH", "")]))
            return str(exe), env, ""
    return (
        None,
        {},
        (
            "perf_analyzer not found (run `python benches/bench_netserve.py --setup`, or set "
            "FASTSEQ_PERF_VENV to a venv with tritonclient==2.40.0 and nvidia-cuda-runtime-cu12)"
        ),
    )


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_drives_the_server(server, protocol, tmp_path):
    exe, env, why = perf_analyzer()
    if exe is None:
        pytest.skip(why)
    port = server.port if protocol == "http" else server.grpc_port
    csv = tmp_path / "pa.csv"
    cmd = [
        exe,
        "-m",
        "cnn",
        "-u",
        f"127.0.0.1:{port}",
        "-i",
        protocol,
        "-b",
        "1",
        "--concurrency-range",
        "4:4",
        "-p",
        "1500",
        "--max-trials",
        "4",
        "-s",
        "1000",
        "-f",
        str(csv),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180)
    text = out.stdout + out.stderr
    if "error while loading shared libraries" in text:
        pytest.skip("perf_analyzer cannot start here: " + text.strip().splitlines()[-1])
    assert out.returncode == 0, text[-2000:]
    assert csv.exists(), text[-2000:]
    throughput = re.search(r"Throughput: ([\d.]+) infer/sec", text)
    assert throughput and float(throughput.group(1)) > 0, text[-2000:]
    print(
        f"perf_analyzer over {protocol}: "
        + " / ".join(
            line.strip()
            for line in text.splitlines()
            if "Throughput" in line or "p99 latency" in line or "Avg latency" in line
        )
    )
