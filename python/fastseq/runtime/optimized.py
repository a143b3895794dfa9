"""The optimised export: the model ONNX Runtime makes of a composed model after its graph
optimisations, written by the core beside a record of what it was optimised for."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import onnxruntime as ort

from fastseq import _core
from fastseq.errors import ExportError, RunError
from fastseq.runtime.export import utf8_folder, utf8_name
from fastseq.runtime.ort_options import default_options
from fastseq.runtime.private_copy import PrivateCopy
from fastseq.runtime.providers import Provider, provider_name, usable_providers
from fastseq.runtime.session import OPTIMIZED_FOR, new_session


def export_optimized(
    composed: _core.Composed,
    target: Path,
    providers: Sequence[Provider] | None,
    session_options: ort.SessionOptions | None,
) -> _core.Saved:
    """Writes the model ONNX Runtime makes of ``composed`` after its graph optimisations,
    with what it was optimised for in its metadata; returns what the core wrote (see
    ``_core.Staging.commit``). Its weights are in a data file beside it (``<name>.data``
    unless a file fastseq did not write has that name): ONNX Runtime maps external data
    instead of parsing it out of the model, so sessions start faster from it. ONNX Runtime
    writes into a staging folder beside the target; the core commits the model from there."""
    import json

    # A missing folder is an ExportError from the core's writer, as on every other path.
    options = session_options if session_options is not None else default_options()
    usable = usable_providers(providers)
    name = utf8_name(target.name)  # ONNX Runtime takes UTF-8 paths only
    with _core.stage(str(target)) as stage, utf8_folder(stage.folder()) as folder:
        staged = os.path.join(folder, name)
        with PrivateCopy.of(composed) as copy:
            try:
                new_session(copy.path, options, usable, save_to=staged, data_name=_core.LAYOUT.data_file(name))
            except Exception as e:
                if not type(e).__module__.startswith("onnxruntime"):
                    raise
                _why_not_saved(e, target, lambda: new_session(copy.path, options, usable))
        made_for = json.dumps(
            {
                "onnxruntime": ort.__version__,
                "providers": [provider_name(p) for p in usable],
                "graph_optimization_level": int(options.graph_optimization_level),
            }
        )
        return stage.commit(name, metadata=[(OPTIMIZED_FOR, made_for)])


def _why_not_saved(error: Exception, target: Path, unsaved: Callable[[], object]) -> None:
    """ONNX Runtime failed to start a session that saves its optimised model: if one that
    saves nothing starts, the saving failed (a full disk, a name too long): an ExportError
    naming the target, with ONNX Runtime's reason. Otherwise the model is at fault: a
    RunError (never the raw onnxruntime error, which the CLI would call a bug)."""
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
    try:
        unsaved()
    except Exception:  # noqa: BLE001 - failing without the save too: the model is what was refused
        raise RunError(f"ONNX Runtime refused the model while optimising it for {target}: {reason}") from error
    raise ExportError(f"cannot write {target}: ONNX Runtime could not save the optimised model: {reason}") from error
