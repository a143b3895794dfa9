"""What every ``fastseq`` command shares on the terminal: the parser (each command's own
usage, near misses for misspelt flags), the one-line errors and warnings, the progress line,
the checks of the files a command will write, and the quiet that keeps other libraries' log
output (ONNX Runtime's logger, Ray's, Python ``logging`` and warnings from libraries) off the
terminal unless ``--verbose`` asks for it. Errors are never hidden: every failure reaches the
user as fastseq's own one ``fastseq: error:`` line, printed once."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn


def fail(message: str) -> SystemExit:
    """A usage mistake that argparse cannot see: the one ``fastseq: error:`` line, exit 1."""
    return SystemExit(f"fastseq: error: {message}")


def one_line(text: Any) -> str:
    """A message over several lines as one."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def error(error: BaseException | str, code: int = 1) -> int:
    """Prints the one ``fastseq: error:`` line; returns the exit code."""
    print(f"fastseq: error: {one_line(error)}", file=sys.stderr)
    return code


class Parser(argparse.ArgumentParser):
    """argparse's parser, its errors on the one ``fastseq: error: <command>: ...`` line after
    that command's own usage (exit code 2), with the near miss of a misspelt flag or command."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        command = self.prog.partition(" ")[2]
        self.exit(2, f"fastseq: error: {command + ': ' if command else ''}{one_line(message)}\n")

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and self.prog == "fastseq":
            # The top parser sees what a command's parser left: say it with that command's usage.
            command = self.commands.get(getattr(parsed, "command", None) or "", self)
            command.error(unrecognized(command, extras))
        return parsed, extras

    @property
    def commands(self) -> dict[str, Parser]:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices:
            from fastseq._core import did_you_mean

            choices = ", ".join(map(repr, action.choices))
            raise argparse.ArgumentError(
                action,
                f"invalid choice: {value!r}{did_you_mean(str(value), [str(c) for c in action.choices])} "
                f"(choose from {choices})",
            )


def unrecognized(parser: argparse.ArgumentParser, extras: Sequence[str]) -> str:
    """argparse's "unrecognized arguments" with the near miss among the command's flags."""
    from fastseq._core import did_you_mean

    flags = [s for a in parser._actions for s in a.option_strings]
    hints = ""
    for extra in extras:
        if extra.startswith("-"):
            flag = extra.partition("=")[0]
            hint = did_you_mean(flag, flags)
            if hint:
                hints = f"{hint}"
                break
    return f"unrecognized arguments: {' '.join(extras)}{hints}"


def verbose_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also show what other libraries log (ONNX Runtime, Ray, onnxruntime.quantization) and "
        "their Python warnings",
    )


@contextmanager
def progress(what: str, stream: Any = None) -> Iterator[None]:
    """Shows an elapsed-time line on a terminal when the work takes over a second, and a
    one-line summary in logs once it is done (nothing more when it fails: the error says)."""
    stream = stream or sys.stderr
    done = threading.Event()
    start = time.perf_counter()
    tty = stream.isatty()

    def tick() -> None:
        if done.wait(1.0):
            return
        frames = "|/-\\"
        i = 0
        while not done.wait(0.2):
            stream.write(f"\r{frames[i % 4]} {what} {time.perf_counter() - start:5.1f}s")
            stream.flush()
            i += 1

    thread = threading.Thread(target=tick, daemon=True)
    if tty:
        thread.start()
    try:
        yield
    finally:
        done.set()
        if tty:
            thread.join()
            stream.write("\r\033[K")
    elapsed = time.perf_counter() - start
    if elapsed >= 1.0 or not tty:
        stream.write(f"{what}: done in {elapsed:.2f}s\n")
        stream.flush()


def check_output(path: str | os.PathLike[str], *, folders: bool = False) -> None:
    """An ExportError naming ``path`` unless the core's writer can write it now (checked
    before the work whose result it is: nothing runs for a result that cannot be kept).
    ``folders``: missing folders above it will be made, so the nearest existing one is what
    must be writable."""
    from fastseq import _core

    target = Path(path).expanduser()
    if folders:
        above = target.parent
        while not above.exists() and above != above.parent:
            above = above.parent
        if above != target.parent:
            # The folders are made once the work is done; the writer checks where they go.
            _core.check_target(str(above / target.name))
            return
    _core.check_target(str(target))


def make_folders(path: str | os.PathLike[str]) -> list[Path]:
    """Makes the missing folders above ``path``; returns them, outermost first (to remove
    again if the write fails)."""
    made = []
    above = Path(path).expanduser().parent
    while not above.exists():
        made.append(above)
        above = above.parent
    for folder in reversed(made):
        folder.mkdir()
    return list(reversed(made))


# --- quiet -------------------------------------------------------------------------------------


def _from_fastseq() -> bool:
    """Whether the warning being shown was raised by fastseq's own code: the first frame
    outside the warnings machinery is the caller of ``warnings.warn``."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__") in ("warnings", __name__):
        frame = frame.f_back
    return frame is not None and str(frame.f_globals.get("__name__", "")).startswith("fastseq")


class Quiet:
    """While a command runs: fastseq's own warnings as one ``fastseq: warning:`` line each;
    other libraries' warnings and log records (Python ``logging`` without a handler of its
    own, ONNX Runtime's logger once it is loaded: :meth:`runtime`, Ray's: :meth:`ray`) only
    with ``verbose``. Everything is put back on exit (``cli.main`` may run in a process
    that goes on)."""

    def __init__(self, verbose: bool) -> None:
        self.verbose = verbose
        self._undo: list[Any] = []

    def __enter__(self) -> Quiet:
        shown = warnings.showwarning

        def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
            if _from_fastseq():
                print(f"fastseq: warning: {one_line(message)}", file=sys.stderr)
            elif self.verbose:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        self._undo.append(lambda: setattr(warnings, "showwarning", shown))
        if not self.verbose:
            # Records of loggers with no handler would reach logging's last resort (stderr).
            null = logging.NullHandler()
            root = logging.getLogger()
            root.addHandler(null)
            self._undo.append(lambda: root.removeHandler(null))
        return self

    def __exit__(self, *exc: object) -> None:
        while self._undo:
            self._undo.pop()()

    def runtime(self) -> None:
        """ONNX Runtime's logger (C++, straight to stderr) shows nothing but with
        ``verbose``: each failure it would log is raised, and fastseq says it once."""
        if self.verbose:
            return
        import onnxruntime as ort

        ort.set_default_logger_severity(4)
        self._undo.append(lambda: ort.set_default_logger_severity(2))  # its default

    def ray(self) -> None:
        """Ray's logs (the driver's log lines, Ray Data's warnings and progress bars) only
        with ``verbose``; a failure in Ray is raised and said once. Call before Ray is
        imported: its log level is read then."""
        if self.verbose:
            return
        for name, value in (("RAY_LOGGER_LEVEL", "critical"),):
            if name not in os.environ:
                os.environ[name] = value
                self._undo.append(lambda name=name: os.environ.pop(name, None))
        import ray.data

        consoles = [
            h
            for h in logging.getLogger("ray.data").handlers
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
        ]
        levels = [h.level for h in consoles]
        for h in consoles:  # its file log stays as it is
            h.setLevel(logging.CRITICAL)

        def restore_levels() -> None:
            for h, level in zip(consoles, levels):
                h.setLevel(level)

        self._undo.append(restore_levels)
        context = ray.data.DataContext.get_current()
        bars = context.enable_progress_bars
        context.enable_progress_bars = False
        self._undo.append(lambda: setattr(context, "enable_progress_bars", bars))
        # The driver's core worker (C++) logs straight to stderr; its level can only be
        # raised by an environment variable that makes it log that it was raised.
        self._undo.append(_StderrFilter(_RAY_LOG_LINE).close)


#: A log line of Ray's C++ core: ``[2026-12-04 18:15:39,800 E 19718 19718] core_worker.cc:2465: ...``
_RAY_LOG_LINE = re.compile(rb"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [DIWEF] \d+ \d+\] [\w./-]+\.(cc|h):\d+: ")


class _StderrFilter:
    """Passes what is written to file descriptor 2 (Python's and native code's alike, in
    order) on to the real stderr, less the lines that ``drop`` matches."""

    def __init__(self, drop: re.Pattern[bytes]) -> None:
        sys.stderr.flush()
        self._real = os.dup(2)
        read, write = os.pipe()
        os.dup2(write, 2)
        os.close(write)
        self._thread = threading.Thread(target=self._pump, args=(read, drop), daemon=True)
        self._thread.start()

    def _pump(self, read: int, drop: re.Pattern[bytes]) -> None:
        with os.fdopen(read, "rb", buffering=0) as pipe:
            pending = b""
            while chunk := pipe.read(65536):
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                kept = b"".join(line + b"\n" for line in lines if not drop.match(line))
                if kept:
                    os.write(self._real, kept)
            if pending and not drop.match(pending):
                os.write(self._real, pending)

    def close(self) -> None:
        """Puts the real stderr back and waits for what is still in the pipe (a process
        that kept a copy of the pipe would hold it open: then the wait ends after 5 s)."""
        sys.stderr.flush()
        os.dup2(self._real, 2)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            os.close(self._real)
