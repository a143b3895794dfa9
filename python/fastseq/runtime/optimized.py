"""The optimised export: the model ONNX Runtime makes of a composed model after its graph
optimisations, written by the core beside a record of what it was optimised for."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import onnxruntime as ort

from fastseq import _core
from fastseq.runtime.options import default_options
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

    target.parent.mkdir(parents=True, exist_ok=True)
    options = session_options if session_options is not None else default_options()
    usable = usable_providers(providers)
    with _core.stage(str(target)) as stage:
        staged = stage.folder() / target.name
        with PrivateCopy.of(composed) as copy:
            new_session(copy.path, options, usable, save_to=staged, data_name=_core.LAYOUT.data_file(target.name))
        made_for = json.dumps({
            "onnxruntime": ort.__version__,
            "providers": [provider_name(p) for p in usable],
            "graph_optimization_level": int(options.graph_optimization_level),
        })
        return stage.commit(target.name, metadata=[(OPTIMIZED_FOR, made_for)])
