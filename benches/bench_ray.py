"""Rows per second for one pipeline over the same images, side by side in one run:

- plain loop: each row through each model's own ONNX Runtime session, one after the other
  (what running separate .onnx files looks like without composing them);
- ONNXSequential, row by row and over batches, in this process (with ONNX Runtime's
  threads, and with one, as each actor gets);
- Ray Data with 2 actors (``pipe.map_batches``) on a local two-CPU cluster, end to end
  (actor start included) and less the time of a 4-row run (the fixed cost of a run).

The pipeline is the four built-in operators (to_float -> resize -> normalize ->
color_head) over uint8 images. Needs ``pip install 'fastseq-onnx[ray]'``.

    python benches/bench_ray.py [--rows 20000] [--batch-size 256]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import onnxruntime as ort

import fastseq
from fastseq.ops import shipped as operators

CHAIN = ["builtin:shipped/to_float", "builtin:shipped/resize", "builtin:shipped/normalize", "builtin:color_head"]


def plain_loop(images: np.ndarray) -> float:
    sessions = [
        ort.InferenceSession(str(operators.path(name.split(":")[1])), providers=["CPUExecutionProvider"])
        for name in CHAIN
    ]
    start = time.perf_counter()
    for image in images:
        value = image[None]
        for s in sessions:
            value = s.run(None, {s.get_inputs()[0].name: value})[0]
    return time.perf_counter() - start


def sequential_rows(pipe: fastseq.ONNXSequential, images: np.ndarray) -> float:
    start = time.perf_counter()
    for image in images:
        pipe(image[None])
    return time.perf_counter() - start


def sequential_batches(pipe: fastseq.ONNXSequential, images: np.ndarray, batch: int) -> float:
    start = time.perf_counter()
    for lo in range(0, len(images), batch):
        pipe(images[lo : lo + batch])
    return time.perf_counter() - start


def ray_actors(pipe: fastseq.ONNXSequential, images: np.ndarray, batch: int) -> float:
    import ray

    parts = np.array_split(images, max(2, len(images) // batch // 2))
    ds = ray.data.from_numpy(list(parts)).materialize()  # the data in the object store first
    start = time.perf_counter()
    out = pipe.map_batches(
        ds,
        input_columns={"input": "data"},
        drop_columns=True,
        compute=ray.data.ActorPoolStrategy(size=2),
        num_cpus=1,
        batch_size=batch,
    )
    rows = sum(len(b["output"]) for b in out.iter_batches(batch_size=None))
    assert rows == len(images)
    return time.perf_counter() - start


def one_thread() -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return options


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=20000)
    p.add_argument("--batch-size", type=int, default=256)
    args = p.parse_args()

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    sample = np.load(operators.sample())[0]
    rng = np.random.default_rng(0)
    images = np.clip(sample[None] + rng.integers(-20, 20, (args.rows, *sample.shape)), 0, 255).astype(np.uint8)
    pipe = fastseq.ONNXSequential(*CHAIN)

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        ray_actors(pipe, images[:4], args.batch_size)  # starts Ray's worker processes
        start = ray_actors(pipe, images[:4], args.batch_size)  # the fixed cost of a run
        timings = {
            "plain loop (4 sessions, row by row)": plain_loop(images),
            "ONNXSequential, row by row": sequential_rows(pipe, images),
            f"ONNXSequential, batches of {args.batch_size}": sequential_batches(pipe, images, args.batch_size),
            f"ONNXSequential, batches of {args.batch_size}, 1 thread (an actor's share)": sequential_batches(
                fastseq.ONNXSequential(*CHAIN, session_options=one_thread()), images, args.batch_size
            ),
        }
        ray_total = ray_actors(pipe, images, args.batch_size)
    finally:
        ray.shutdown()
    timings["Ray Data, 2 actors, end to end"] = ray_total
    timings[f"Ray Data, 2 actors, less a 4-row run ({start:.1f} s: actors, sessions, scheduling)"] = ray_total - start

    print(
        f"{args.rows} images {list(images.shape[1:])} uint8 through {' -> '.join(CHAIN)}; "
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"ray {ray.__version__}, onnxruntime {ort.__version__}\n"
    )
    print("| how | s | rows/s |\n|---|---|---|")
    for how, seconds in timings.items():
        print(f"| {how} | {seconds:.2f} | {args.rows / seconds:,.0f} |")


if __name__ == "__main__":
    main()
