"""Sessions: ONNX Runtime sessions over a composed model's private copy, made directly or
through the session cache, and the settings one session needs (optimisation off for a cache
entry, the optimised model saved) given on a copy of the caller's options, never on theirs."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnxruntime as ort

from fastseq import _core
from fastseq.errors import LoadError, RunError
from fastseq.runtime.ort_options import default_options, session_copy
from fastseq.runtime.private_copy import PendingCopy, PrivateCopy
from fastseq.runtime.providers import Provider, usable_providers

if TYPE_CHECKING:
    from fastseq.runtime.cache import SessionCache

#: the metadata key an optimised export records what it was optimised for in
OPTIMIZED_FOR = "fastseq.optimized_for"


def open_copy(
    copy: PrivateCopy,
    providers: Sequence[Provider] | None = None,
    session_options: ort.SessionOptions | None = None,
) -> ort.InferenceSession:
    """A session over a private copy (see :class:`~fastseq.runtime.private_copy.PrivateCopy`)."""
    options = session_options if session_options is not None else default_options()
    return new_session(copy.path, options, usable_providers(providers))


def open_cached(
    models: Sequence[_core.Composed],
    spill_min: int | None,
    providers: Sequence[Provider] | None,
    session_options: ort.SessionOptions | None,
    cache: SessionCache,
    info: dict[str, Any],
    labels: Sequence[str],
    adopt: Callable[[PrivateCopy], None],
) -> ort.InferenceSession:
    """A session over ``models[0]`` (the models sharing its memory after it) through the
    session cache: the optimised model is stored there on the first start and loaded with
    optimisation off on later ones (see :mod:`fastseq.runtime.cache`; ``labels``, the stages,
    are recorded with the entry). ``info`` is filled with how the session was made:
    ``cache`` ("hit", "stored" or None) and the entry's folder.

    The private copy is still written (the pipeline must not depend on its sources), on a
    thread beside the rest: the key is the model's digest, read by the core from where the
    weights are while the kernel copies them; on a hit ONNX Runtime loads the entry
    meanwhile (unless the models hold ``spill_min`` bytes in memory, which the copy lets
    go of first), and on a miss it loads the copy once written. ``adopt`` receives the copy
    when it is written, before ONNX Runtime reads it (to swap in its spilled models); on a
    hit, before this returns."""
    from fastseq.runtime import cache_entry as session_cache
    from fastseq.runtime.cachedir import DATA

    options = session_options if session_options is not None else default_options()
    usable = usable_providers(providers)
    models = list(models)
    pending = PendingCopy(models, spill_min, adopt)

    def checked() -> str:
        """The copy, read back against the key: the key and the copy read the sources apart
        (each checking the files are the ones loaded), and a rewrite that no identity check
        sees (a write through a shared mapping) can fall between them. A store must not keep
        an entry under a key its weights do not have, and a hit must not run the key's
        weights while the pipeline keeps (``pipe.model``, exports) a copy that differs: what
        runs is what the key says, on a hit as on a store. The copy's digest is read on the
        copy's own thread, beside ONNX Runtime's load of the entry on a hit. Weights held in
        memory (nothing spilled) cannot have changed between the two."""
        path = pending.result().path
        if pending.digest is not None and pending.digest != digest:
            raise LoadError(
                "a source file changed while the pipeline was built (the weights copied differ from those the "
                "session cache's key read); nothing was cached or used from the cache: build the pipeline again"
            )
        return path

    def make(path: str, optimise: bool, save_to: str | None) -> ort.InferenceSession:
        return new_session(path, options, usable, optimise, save_to, DATA)

    try:
        digest = _core.model_digest(models[0])  # a source changed since it was loaded fails here, by name
        if spill_min is not None and _core.memory_bytes(models) >= spill_min:
            # The copy lets go of the weights the models hold in memory: ONNX Runtime loads
            # the entry after it, so that they do not count twice.
            pending.result()
        del models
        parts = session_cache.key_parts(digest, usable, options)
        made = session_cache.start(cache, parts, labels, info, make, checked)
        # A hit: the pipeline still takes the copy, or fails as the copy failed, or as the
        # copy differs from the key (checked() ran already where the copy was asked for).
        checked() if info.get("cache") == "hit" else pending.result()
        return made
    finally:
        pending.close()


def new_session(
    path: str,
    options: ort.SessionOptions,
    providers: list[Provider],
    optimise: bool = True,
    save_to: str | Path | None = None,
    data_name: str | None = None,
) -> ort.InferenceSession:
    """A session from a model file: with ``options`` as they are, or, where it needs other
    settings (``optimise`` off, the optimised model saved at ``save_to``), with a copy of
    them: the caller's options are never changed, so threads that share them never see each
    other's settings."""
    if optimise and save_to is None:
        made = ort.InferenceSession(path, sess_options=options, providers=providers)
    else:
        own = session_copy(options)
        if not optimise:
            own.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        if save_to is not None:
            own.optimized_model_filepath = str(save_to)
            own.add_session_config_entry("session.optimized_model_external_initializers_file_name", data_name)
            own.add_session_config_entry(
                "session.optimized_model_external_initializers_min_size_in_bytes", str(_core.LAYOUT.threshold)
            )
        made = on_copy(lambda: ort.InferenceSession(path, sess_options=own, providers=providers))
    warn_if_optimized_elsewhere(made, providers)
    return made


def on_copy(make: Callable[[], Any]) -> Any:
    """``make()`` of a session on a copy of the caller's options; an operator that the copy
    cannot run for want of the caller's custom operator library (ONNX Runtime cannot copy
    one) is a RunError that says so."""
    try:
        return make()
    except Exception as e:
        text = str(e)
        if "not a registered function/op" not in text and "No Op registered" not in text:
            raise
        raise RunError(
            "ONNX Runtime cannot copy the custom operator libraries registered on your SessionOptions, and fastseq "
            "sets what this needs (a session cache entry, a profile, an optimised export) on a copy of them, never "
            "on yours: a pipeline that needs a custom operator library starts without the session cache, and cannot "
            f"be profiled or exported optimised ({text.strip().splitlines()[0]})"
        ) from e


def warn_if_optimized_elsewhere(started: ort.InferenceSession, providers: Sequence[Provider]) -> None:
    """A model exported with ``optimized=True`` for other providers or another onnxruntime
    may hold operators those cannot run or run slowly: say so."""
    import json

    meta = started.get_modelmeta().custom_metadata_map.get(OPTIMIZED_FOR)
    if not meta:
        return
    try:
        made = json.loads(meta)
    except ValueError:
        return
    now = {"onnxruntime": ort.__version__, "providers": started.get_providers()}
    if made.get("onnxruntime") != now["onnxruntime"] or made.get("providers") != now["providers"]:
        warnings.warn(
            f"this model was optimised by onnxruntime {made.get('onnxruntime')} for "
            f"{', '.join(made.get('providers') or [])}; it is running on onnxruntime {now['onnxruntime']} with "
            f"{', '.join(now['providers'])}: re-export it with optimized=True for this setup",
            RuntimeWarning,
            stacklevel=4,
        )
