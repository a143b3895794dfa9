"""``fastseq --version``: the package, the Rust core's build, Python and ONNX Runtime."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from fastseq import __version__
from fastseq.errors import install_command


def version_text() -> str:
    """The package's version on the first line, then what the Rust core was built as (its
    version and target; a debug build is much slower), Python and the ONNX Runtime package
    found (read from its metadata: nothing is imported)."""
    import platform
    from importlib import metadata

    from fastseq import _core

    runtimes = []
    for dist in ("onnxruntime", "onnxruntime-gpu"):
        try:
            runtimes.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            pass
    none = f"none ({install_command('cpu')} or {install_command('gpu')})"
    return "\n".join(
        [
            f"fastseq {__version__}",
            f"core: {_core.__version__} ({_core.__build__})",
            f"python: {platform.python_version()} ({platform.python_implementation()}, {sys.platform})",
            f"runtime: {', '.join(runtimes) or none}",
        ]
    )


class Version(argparse.Action):
    """``--version``, its text made only when asked (argparse's own would be made for every
    command)."""

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str = argparse.SUPPRESS,
        default: Any = argparse.SUPPRESS,
        help: str | None = None,
    ) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> NoReturn:
        print(version_text())
        parser.exit()
