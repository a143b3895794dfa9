"""``fastseq cache``: list, prune or empty the session cache."""

from __future__ import annotations

import argparse
import time
from typing import Any

from fastseq.cli.console import Quiet, verbose_option
from fastseq.errors import FastseqError, human_size


def add(sub: Any) -> None:
    c = sub.add_parser("cache", help="list, prune or empty the session cache")
    c.add_argument(
        "action",
        choices=["list", "prune", "clear"],
        help="list: what each entry is for (its stages and their sources, the model's digest), its "
        "size, when made and last used, its hits; prune: remove entries by age and least recent "
        "use; clear: remove every entry",
    )
    c.add_argument("--dir", help="the cache folder (default: $FASTSEQ_SESSION_CACHE or ~/.cache/fastseq/sessions)")
    c.add_argument(
        "--max-size",
        metavar="SIZE",
        help="prune: remove the least recently used entries until the rest fit in SIZE (e.g. 1G, 500M; "
        "default with no --older-than: the cache's limit, $FASTSEQ_SESSION_CACHE_MAX or 2G)",
    )
    c.add_argument(
        "--older-than",
        metavar="DURATION",
        help="prune: remove entries last used more than DURATION ago (e.g. 30d, 12h, 90m)",
    )
    c.add_argument("--dry-run", action="store_true", help="clear, prune: say what would be removed, remove nothing")
    verbose_option(c)
    c.set_defaults(func=cmd_cache)


def _entries(n: int) -> str:
    return f"{n} entr{'y' if n == 1 else 'ies'}"


def cmd_cache(args: argparse.Namespace, quiet: Quiet) -> int:
    from fastseq.runtime.cache import SessionCache, parse_duration, parse_size, root_from

    cache = SessionCache(args.dir) if args.dir else (root_from(None) or SessionCache())
    if args.action != "prune" and (args.max_size or args.older_than):
        raise FastseqError(f"cache {args.action}: --max-size and --older-than go with prune")
    if args.action == "list":
        if args.dry_run:
            raise FastseqError("cache list: --dry-run goes with clear and prune")
        found = cache.entries()
        total = sum(e["bytes"] for e in found)
        print(
            f"{cache.path}: {_entries(len(found))}, {human_size(total)} (limit {human_size(cache.max_size)}), "
            "least recently used first"
        )
        for e in found:
            print("  " + describe(e).replace("\n", "\n  "))
        return 0
    if args.action == "clear":
        removed = cache.clear(dry_run=args.dry_run)
    else:
        # Checked before anything is removed: a typo must not prune with a default.
        max_size = None if args.max_size is None else parse_size(args.max_size, "--max-size")
        older_than = None if args.older_than is None else parse_duration(args.older_than, "--older-than")
        removed = cache.prune(max_size, older_than, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for e in removed:
        print(
            f"{verb} {cache.path / e['key']}"
            + (" (left by a process that was killed)" if e.get("leftover") else f": {describe(e, short=True)}")
        )
    entries = [e for e in removed if not e.get("leftover")]
    print(f"{verb} {_entries(len(entries))} ({human_size(sum(e['bytes'] for e in entries))}) from {cache.path}")
    kept = [] if args.dry_run or args.action == "prune" else cache.entries()
    if kept:
        print(f"kept {_entries(len(kept))} that another process is loading or that fastseq did not make")
    return 0


def describe(e: dict[str, Any], short: bool = False) -> str:
    """An entry, told apart from the others at a glance: its key (the folder), size, last
    use and hits, the composed model's digest, the providers; then, on a line of its own and
    in full, its stages and what each was built from (``short``: one line, the stages cut)."""

    def when(t: float | None) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "?"

    head = f"{e['key']}  {human_size(e['bytes']):>9}"
    if e.get("refused"):
        return f"{head}  not used: {e['refused']}"
    if e.get("damaged"):
        return f"{head}  damaged (its manifest cannot be read; rebuilt on next use)"
    stages = " -> ".join(e["labels"] or []) or "?"
    providers = ", ".join(p.removesuffix("ExecutionProvider") for p in e["providers"] or [])
    digest = (e.get("model") or "?")[:12]
    made_by = (
        f"onnx {e.get('onnx')}"
        if e.get("kind") == "converted stage"
        else f"{providers}; onnxruntime {e['onnxruntime']}"
    )
    head += (
        f"  created {when(e['created'])}, last used {when(e['used'])}, {e['hits']} hit{'s' * (e['hits'] != 1)}"
        f"  model {digest}  [{made_by}]"
    )
    if short:
        return f"{head}  {stages if len(stages) <= 60 else stages[:57] + '...'}"
    return f"{head}\n  {stages}"
