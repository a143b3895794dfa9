"""The ``fastseq`` command: merge, inspect and run ONNX models in build pipelines.

Exit codes: 0 success, 1 a fastseq error (bad model, bad joint, failed download or write),
2 a usage error (after the command's own usage), 130 interrupted, 141 the reader of its
output left (``fastseq inspect x.onnx | head``: quietly, as a command that SIGPIPE ends). Every error goes to stderr
as one ``fastseq: error: ...`` line, never a traceback; fastseq's warnings as one
``fastseq: warning: ...`` line each. What other libraries log (ONNX Runtime, Ray,
onnxruntime.quantization) shows only with ``--verbose``.

One module per command group (:mod:`.merge`: merge and quantize, :mod:`.inspect`,
:mod:`.run`: run and profile, :mod:`.serve`, :mod:`.cache`, :mod:`.demo`), each adding its parsers;
:mod:`.console` holds what they share on the terminal, :mod:`.models` what they share to
read models and inputs, :mod:`.version` what ``--version`` prints.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from fastseq.cli import cache, demo, inspect, merge, run, serve
from fastseq.cli.console import Parser, Quiet, error
from fastseq.cli.demo import DEMO
from fastseq.cli.version import Version
from fastseq.errors import FastseqError

# Each command imports what it uses (numpy, onnxruntime, the loader) itself: `fastseq --help`
# and `fastseq inspect` stay fast.

__all__ = ["DEMO", "main", "parser"]


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="fastseq", description="Compose ONNX models into one graph and run it.")
    p.add_argument("--version", action=Version, help="show the version, the core's build and the runtime's, and exit")
    sub = p.add_subparsers(dest="command", required=True)
    for group in (merge, inspect, run, serve, cache, demo):
        group.add(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    with Quiet(getattr(args, "verbose", False)) as quiet:
        try:
            status = args.func(args, quiet)
            sys.stdout.flush()  # a reader that left (`| head`) shows here, not at exit
            return status
        except BrokenPipeError:
            return _reader_gone()
        except FastseqError as e:
            return error(e)
        except ModuleNotFoundError as e:
            from fastseq.errors import runtime_missing

            return error(runtime_missing(e) or e)
        except (OSError, ValueError) as e:
            return error(e)
        except KeyboardInterrupt:
            return error("interrupted", 130)
        except Exception as e:  # noqa: BLE001  (the last resort: still one line, never a traceback)
            return error(f"unexpected {type(e).__name__}: {e} (a bug in fastseq: please report it)")


#: The exit status of a command whose reader went away (as a command killed by SIGPIPE).
READER_GONE = 141


def _reader_gone() -> int:
    """``fastseq inspect x.onnx | head``: the reader took what it wanted and left. Quietly,
    as a command killed by SIGPIPE ends: what is still buffered goes nowhere (Python would
    print an error flushing it at exit)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # a stdout without a file descriptor (a test's capture)
        pass
    return READER_GONE
