"""Real models, batched: the corpus of benches/corpus.py (built offline), each model's verdict
(batched, or why not), its parity (the composed pipeline against the model run as given,
``pipe.verify``) and its rows/s served one row a request: 16 threads through the batcher
against one caller calling ``pipe(x)`` row after row. Writes the table into
docs/real-models.md between its markers.

    python benches/bench_models.py [--folder /tmp/corpus] [--only NAME ...] [--requests 48]

Needs torch, torchvision, transformers and onnxscript (pip); rapidocr-onnxruntime's wheel is
fetched with ``pip download --no-deps``."""

from __future__ import annotations

import argparse
import re
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import corpus  # noqa: E402

import fastseq  # noqa: E402

PAGE = HERE.parent / "docs" / "real-models.md"
START, END = "<!-- corpus table: start -->", "<!-- corpus table: end -->"


def one_by_one(pipe: fastseq.ONNXSequential, requests: list[list]) -> float:
    """Rows/s of one caller, one row a call."""
    pipe(*requests[0])
    t = time.perf_counter()
    for xs in requests:
        pipe(*xs)
    return len(requests) / (time.perf_counter() - t)


def batched(pipe: fastseq.ONNXSequential, requests: list[list], threads: int = 16) -> float:
    """Rows/s of ``threads`` callers sending one-row requests through the batcher."""
    with pipe.batcher(max_batch_size=threads) as b:
        b(*requests[0])
        share = [requests[k::threads] for k in range(threads)]
        t = time.perf_counter()
        workers = [threading.Thread(target=lambda mine: [b(*xs) for xs in mine], args=(mine,)) for mine in share]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return len(requests) / (time.perf_counter() - t)


def reason(text: str) -> str:
    """The refusal's first reason, short: the node and why."""
    line = next((ln for ln in text.splitlines() if ln.startswith("- ")), text.splitlines()[0])
    line = re.sub(r"stage '[^']*', ", "", line[2:])
    return line.replace("|", "/")[:160]


def row(e: corpus.Entry, requests: int) -> str:
    pipe = fastseq.ONNXSequential(e.path, dynamic_batch=e.batch_one)
    xs = e.rows(1 if e.batch_one else 2, 1)  # the stages as given: a batch-1 export takes one row
    parity = pipe.verify(*xs)
    diff = max(d.max_abs for d in parity.outputs)
    try:
        pipe.batcher().close()
        verdict = "batched" + (" (--dynamic-batch)" if e.batch_one else "")
    except fastseq.CompositionError as error:
        verdict = "refused: " + reason(str(error))
    truth = corpus.alone_vs_together(pipe.get_session(), e.rows)
    rows_alone = "mix" if truth > corpus.MIXES else "apart"
    reqs = [e.rows(1, k) for k in range(requests)]
    alone = one_by_one(pipe, reqs)
    together = f"{batched(pipe, reqs):,.0f}" if verdict.startswith("batched") else "-"
    return f"| {e.name} | {e.exporter} | {rows_alone} | {verdict} | {diff:.2g} | {together} | {alone:,.0f} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", type=Path, default=Path("/tmp/fastseq-corpus"))
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--requests", type=int, default=48, help="one-row requests measured per model (default 48)")
    ap.add_argument("--no-write", action="store_true", help="print the table without writing the page")
    args = ap.parse_args()
    skipped: dict[str, str] = {}
    entries = corpus.build(args.folder, args.only, skipped)
    lines = [
        "| model | exporter | rows alone vs together | fastseq | parity (max abs diff) | rows/s batched "
        "(16 callers) | rows/s one row a call |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        lines.append(row(e, args.requests))
        print(lines[-1], flush=True)
    lines += [f"| {name} | - | - | not built here: {why[:120]} | - | - | - |" for name, why in skipped.items()]
    table = "\n".join(lines)
    if not args.no_write:
        text = PAGE.read_text()
        start, end = text.index(START) + len(START), text.index(END)
        PAGE.write_text(text[:start] + "\n" + table + "\n" + text[end:])
        print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
