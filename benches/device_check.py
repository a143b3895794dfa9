"""The checks that need a GPU, in one short run: the CUDA provider, IO binding with device
tensors, results against the CPU, per-call time with and without binding, and the host<->device
copies that binding avoids. Prints a markdown table (and writes it to $OUT/device_check.md when
OUT is set).

    pip install 'fastseq-onnx[gpu]' torch    # onnxruntime-gpu, never beside onnxruntime
    python benches/device_check.py

Skips with a message (exit 0) where no CUDA provider or no CUDA torch is available.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import bench  # xy_model, the model helper the benchmarks share


def model(dim: int = 1024, layers: int = 8):
    """An MLP of ``layers`` MatMul+Relu on [N, dim]: big enough for the GPU to matter."""
    import numpy as np
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for k in range(layers):
        inits.append(numpy_helper.from_array((rng.standard_normal((dim, dim)) / dim**0.5).astype(np.float32), f"w{k}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{k}"], [f"m{k}"]))
        out = "y" if k == layers - 1 else f"h{k}"
        nodes.append(helper.make_node("Relu", [f"m{k}"], [out]))
        prev = out
    return bench.xy_model(nodes, "mlp", inits, ["N", dim])


def timed(fn, n: int = 200) -> float:
    """Median microseconds per call over ``n`` calls (after a warm-up)."""
    for _ in range(10):
        fn()
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


def main() -> int:
    import numpy as np
    import onnxruntime as ort

    import fastseq

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        print(f"no CUDAExecutionProvider in this onnxruntime ({ort.get_available_providers()}): skipped")
        return 0
    try:
        import torch
    except ImportError:
        print("torch is not installed: skipped")
        return 0
    if not torch.cuda.is_available():
        print("torch sees no CUDA device: skipped")
        return 0

    m = model()
    half = [m, m]  # two stages: a composed pipeline
    cpu = fastseq.ONNXSequential(*half, io_maps=[[("y", "x")]], providers=["CPUExecutionProvider"])
    gpu = fastseq.ONNXSequential(*half, io_maps=[[("y", "x")]], providers=["CUDAExecutionProvider"])
    rows = [("providers", ", ".join(gpu.providers), "")]
    x = np.random.default_rng(1).standard_normal((64, 1024)).astype(np.float32)
    ref = cpu(x)[0]
    out = gpu(x)[0]
    rows.append(
        (
            "CUDA vs CPU (numpy in/out)",
            f"max abs diff {np.abs(out - ref).max():.2e}",
            "ok" if np.allclose(out, ref, rtol=1e-3, atol=1e-3) else "MISMATCH",
        )
    )

    xt = torch.from_numpy(x).cuda()
    bound = gpu.bind(xt, outputs="torch")
    (yt,) = bound()
    torch.cuda.synchronize()
    rows.append(
        (
            "bound torch CUDA in/out",
            f"output on {yt.device}, max abs diff {np.abs(yt.cpu().numpy() - ref).max():.2e}",
            "ok" if yt.is_cuda and np.allclose(yt.cpu().numpy(), ref, rtol=1e-3, atol=1e-3) else "MISMATCH",
        )
    )
    (yt2,) = bound()
    rows.append(("output buffer reused", str(yt2.data_ptr() == yt.data_ptr()), ""))

    def unbound():  # the unbound path: device -> host, run (host -> device -> host), host -> device
        return torch.from_numpy(gpu(xt.cpu().numpy())[0]).cuda()

    def with_binding():
        bound.run()
        torch.cuda.synchronize()

    t_plain = timed(lambda: gpu(x))
    t_unbound = timed(unbound)
    t_bound = timed(with_binding)
    copies_mb = 2 * x.nbytes * 2 / 2**20
    rows += [
        ("pipe(x), numpy in/out", f"{t_plain:.0f} us/call", ""),
        ("torch CUDA tensor through numpy", f"{t_unbound:.0f} us/call", ""),
        ("pipe.bind(cuda tensor).run()", f"{t_bound:.0f} us/call", f"{t_unbound / t_bound:.1f}x faster"),
        ("host<->device copies avoided per call", f"4 ({copies_mb:.2f} MB)", ""),
    ]
    table = ["| check | result | |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    text = (
        f"device_check on {torch.cuda.get_device_name(0)}, onnxruntime {ort.__version__}, "
        f"{time.strftime('%Y-%m-%d')}\n\n" + "\n".join(table)
    )
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "device_check.md").write_text(text + "\n")
    return 0 if "MISMATCH" not in text else 1


if __name__ == "__main__":
    sys.exit(main())
