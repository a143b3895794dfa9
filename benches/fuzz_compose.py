"""onnx.compose and fastseq.onnx_compose side by side on seeded generated cases
(tests/compose_fuzz.py), with the full checker on every model either returns.

    python benches/fuzz_compose.py --count 20000          # the summary, by category
    python benches/fuzz_compose.py --seed 1234 -v         # one case, what each side did
    python benches/fuzz_compose.py --harness --count 100000   # onnx's own harness's inputs

``--harness`` draws the inputs of onnx's own harness (onnx/fuzz/fuzz_compose.py: its
structured path, and its raw path on mutated bytes; tests/compose_harness.py) instead;
inputs protobuf refuses are counted apart (the harness stops before merging them).

The categories are compose_fuzz.compare's; the three the issue counts are
onnx_raises_fastseq_invalid, onnx_returns_fastseq_raises and bytes_differ.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import compose_fuzz
import compose_harness


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--start", type=int, default=0, help="first seed")
    ap.add_argument("--seed", type=int, help="run this one case and show it")
    ap.add_argument("--examples", type=int, default=3, help="seeds shown per category and detail")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--harness", action="store_true", help="onnx's own harness's inputs")
    args = ap.parse_args()
    make_case = compose_harness.make_case if args.harness else compose_fuzz.make_case
    if args.seed is not None:
        case = make_case(args.seed)
        if case is None:
            print("protobuf refuses this input: no case")
            return 0
        print(case.describe())
        verdict = compose_fuzz.compare(case)
        print(verdict.category, verdict.detail)
        return 0
    counts: collections.Counter[str] = collections.Counter()
    details: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    seeds: dict[tuple[str, str], list[int]] = collections.defaultdict(list)
    by_fn: collections.Counter[tuple[str, str]] = collections.Counter()
    why: collections.Counter[tuple[str, str]] = collections.Counter()
    t0 = time.perf_counter()
    refused = 0
    for seed in range(args.start, args.start + args.count):
        case = make_case(seed)
        if case is None:
            refused += 1
            continue
        verdict = compose_fuzz.compare(case)
        counts[verdict.category] += 1
        by_fn[(case.fn, verdict.category)] += 1
        reason = compose_fuzz.deliberate(case, verdict)
        if reason:
            why[(verdict.category, reason)] += 1
        key = _group(verdict.detail)
        details[verdict.category][key] += 1
        if len(seeds[(verdict.category, key)]) < args.examples:
            seeds[(verdict.category, key)].append(seed)
        if args.verbose and (seed - args.start) % 1000 == 999:
            print(f"{seed - args.start + 1} cases, {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    took = time.perf_counter() - t0
    print(
        f"{args.count} inputs (seeds {args.start}..{args.start + args.count - 1}) in {took:.0f} s"
        + (f"; {refused} refused by protobuf, {args.count - refused} cases" if args.harness else "")
    )
    for cat, n in counts.most_common():
        known = sum(k for (c, _), k in why.items() if c == cat)
        print(f"  {cat:32} {n:6}" + (f"   ({known} deliberate, {n - known} not)" if known else ""))
        if cat != "same":
            for key, k in details[cat].most_common(12):
                print(f"      {k:6}  {key}   e.g. seeds {seeds[(cat, key)]}")
    print("deliberate differences (README), by reason:")
    for (cat, reason), n in sorted(why.items()):
        print(f"  {cat:32} {n:6}  {reason}")
    print("by function:")
    for (fn, cat), n in sorted(by_fn.items()):
        print(f"  {fn:16} {cat:32} {n:6}")
    return 0


def _group(detail: str) -> str:
    """A detail with its names blurred, so that one cause is one line."""
    import re

    return re.sub(r"'[^']*'|\"[^\"]*\"|\b\w*\d\w*\b", "_", detail)[:150]


if __name__ == "__main__":
    sys.exit(main())
