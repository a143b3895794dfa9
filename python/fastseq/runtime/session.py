"""The runner: one ONNX Runtime session over a composed model, with its providers, its
inputs described once, and calls checked on that description."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from fastseq import _core
from fastseq.errors import InputError, ProviderError

Provider = str | tuple[str, dict[str, Any]]

# onnxruntime's type strings -> numpy dtypes
_ORT_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int8)": np.int8,
    "tensor(int16)": np.int16,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(uint8)": np.uint8,
    "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64,
    "tensor(bool)": np.bool_,
    "tensor(string)": np.str_,
}


@dataclass(frozen=True)
class TensorInfo:
    """A graph input or output: its name, numpy dtype (None if not a plain tensor) and
    shape (ints for static dimensions, strings or None for dynamic ones)."""

    name: str
    dtype: np.dtype | None
    shape: tuple[int | str | None, ...] | None

    @classmethod
    def of(cls, arg: ort.NodeArg) -> TensorInfo:
        """The description of one of a session's inputs or outputs."""
        dtype = _ORT_DTYPES.get(arg.type)
        shape = tuple(arg.shape) if arg.shape is not None else None
        return cls(arg.name, np.dtype(dtype) if dtype is not None else None, shape)

    def __str__(self) -> str:
        dims = "?" if self.shape is None else ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.dtype if self.dtype is not None else '?'}[{dims}]"


def provider_name(p: Provider) -> str:
    return p if isinstance(p, str) else p[0]


def default_options() -> ort.SessionOptions:
    """kornia's default: extended graph optimizations."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    return options


def usable_providers(providers: Sequence[Provider] | None) -> list[Provider]:
    """The requested providers that this onnxruntime build has, in order. Each missing one
    is a warning naming it and what is available, never a silent fallback; a name that no
    onnxruntime build knows (a typo) is a ProviderError with the near miss."""
    requested = list(providers) if providers else ["CPUExecutionProvider"]
    known = ort.get_all_providers()  # every provider any onnxruntime build has
    for p in requested:
        if provider_name(p) not in known:
            raise ProviderError(
                f"unknown execution provider '{provider_name(p)}'{_core.did_you_mean(provider_name(p), known)}; "
                f"this onnxruntime build has: {', '.join(ort.get_available_providers())}"
            )
    available = ort.get_available_providers()
    usable = [p for p in requested if provider_name(p) in available]
    for p in requested:
        if provider_name(p) not in available:
            warnings.warn(
                f"{provider_name(p)} is not available in this onnxruntime build "
                f"(available: {', '.join(available)}); "
                + (
                    f"using {', '.join(provider_name(u) for u in usable)}"
                    if usable
                    else "falling back to CPUExecutionProvider"
                ),
                RuntimeWarning,
                stacklevel=4,
            )
    return usable or ["CPUExecutionProvider"]


@dataclass
class PrivateCopy:
    """A composed model written for ONNX Runtime into a folder only this process uses (in
    the temporary folder, removed on exit): ``path``, and the ``digest`` of what was written
    when it was asked for (the session cache's key). It holds no reference to the model, so
    that a caller can let go of the model's memory while ONNX Runtime builds a session from
    the copy (:func:`open_copy`).

    ONNX Runtime gets the model as a file with its weights in a data file beside it, written
    by the core into a private folder (not synced: the page cache) and removed once the
    session exists: ONNX Runtime maps the weights instead of parsing them out of one
    serialized buffer (it starts faster from external data than from inline weights), and
    the session no longer depends on the source files. The weights go from the sources into
    the data file in the kernel (``copy_file_range``, or ``sendfile`` across file systems),
    never through this process's memory; only weights that exist in memory alone are
    written. ``info`` says how many bytes each way (``copied``, ``written``) and how many the
    spilled models map (``mapped``)."""

    folder: str
    path: str
    digest: str | None
    info: dict[str, int]
    #: with ``spill_min``: copies of the models given that map the copy's data file, or None
    spilled: list[_core.Composed] | None = None

    @classmethod
    def of(
        cls, models: _core.Composed | Sequence[_core.Composed], spill_min: int | None = None, digest: bool = False
    ) -> PrivateCopy:
        """Writes the copy of ``models`` (one composed model, or it followed by the models
        that share its memory), with its ``digest`` if asked. Its files are not synced: they
        live in the page cache, which the system can reclaim.

        With ``spill_min``, ``spilled`` holds copies of ``models`` that map the copy's data
        file instead of their sources: always when they still hold weights in the source
        files (a pipeline must not depend on them), and when they hold at least
        ``spill_min`` bytes of weights in memory. The caller swaps them in and lets the
        originals go before ONNX Runtime reads the copy, so the weights count once, not
        twice. The mapping keeps the data file alive, unlinked, once the folder is gone."""
        models = [models] if isinstance(models, _core.Composed) else list(models)
        models[0].check_sources()  # the files still referred to are the ones loaded
        folder = tempfile.mkdtemp(prefix="fastseq-session-")
        try:
            path = os.path.join(folder, "model.onnx")
            written, info, copies = _core.write_private_copy(models, path, spill_min, digest)
            del models  # the caller decides how long the originals live
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return cls(folder, path, written, dict(info), copies)

    def take_spilled(self) -> list[_core.Composed] | None:
        """The spilled copies (see :meth:`of`), handed over: the copy keeps no reference."""
        spilled, self.spilled = self.spilled, None
        return spilled

    def __enter__(self) -> PrivateCopy:
        return self

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def open_copy(
    copy: PrivateCopy,
    providers: Sequence[Provider] | None = None,
    session_options: ort.SessionOptions | None = None,
    cache_root: Path | None = None,
    info: dict[str, Any] | None = None,
) -> ort.InferenceSession:
    """A session over a private copy (see :class:`PrivateCopy`). With a ``cache_root``, the
    optimised model is stored there on the first start and loaded with optimisation off on
    later ones (see :mod:`fastseq.runtime.cache`). ``info``, when given, is filled with how the
    session was made: ``cache`` ("hit", "stored" or None) and the entry's folder."""
    options = session_options if session_options is not None else default_options()
    usable = usable_providers(providers)
    if cache_root is None:
        return _session(copy.path, options, usable)
    from fastseq.runtime import cache

    assert copy.digest is not None, "a copy for the session cache is made with its digest"
    parts = cache.key_parts(copy.digest, usable, options)
    key = cache.key_of(parts)
    info = info if info is not None else {}
    info.update(cache=None, key=key, entry=None)
    entry = cache.lookup(cache_root, key, parts)
    if entry is not None:
        info.update(cache="hit", entry=str(entry.folder))
        return _session(str(entry.model), options, usable, optimise=False)
    stage = cache.staging(cache_root)
    if stage is None:
        return _session(copy.path, options, usable)
    try:
        session = _session(copy.path, options, usable, save_to=stage / cache.MODEL, data_name=cache.DATA)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    stored = cache.commit(cache_root, key, parts, stage)
    if stored is not None:
        info.update(cache="stored", entry=str(stored.folder))
    return session


def _session(
    path: str,
    options: ort.SessionOptions,
    providers: list[Provider],
    optimise: bool = True,
    save_to: Path | None = None,
    data_name: str | None = None,
) -> ort.InferenceSession:
    """A session from a model file; the caller's options are changed only for the call."""
    level, saved_path = options.graph_optimization_level, options.optimized_model_filepath
    try:
        if not optimise:
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        if save_to is not None:
            options.optimized_model_filepath = str(save_to)
            options.add_session_config_entry("session.optimized_model_external_initializers_file_name", data_name)
            options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        made = ort.InferenceSession(path, sess_options=options, providers=providers)
        warn_if_optimized_elsewhere(made, providers)
        return made
    finally:
        options.graph_optimization_level = level
        options.optimized_model_filepath = saved_path


@dataclass(frozen=True)
class _Check:
    """One input's checks, computed once per session: what a call compares against."""

    name: str
    dtype: np.dtype | None
    ndim: int | None
    static: tuple[tuple[int, int], ...]  # (axis, size) for each fixed dimension


class Runner:
    """A session and the description of its inputs and outputs, read once. Calls check the
    feeds against that description (the checks are what give clear errors) and go straight to
    the session's compiled ``run``."""

    def __init__(self, session: ort.InferenceSession, explain: Callable[[Exception], Exception] | None = None) -> None:
        self.session = session
        self.inputs = [TensorInfo.of(a) for a in session.get_inputs()]
        self.outputs = [TensorInfo.of(a) for a in session.get_outputs()]
        self._by_name = {i.name: i for i in self.inputs}
        self._output_list = [o.name for o in self.outputs]
        self._output_names = set(self._output_list)
        self._checks = [
            _Check(
                i.name,
                i.dtype,
                len(i.shape) if i.shape is not None else None,
                tuple((axis, d) for axis, d in enumerate(i.shape or ()) if isinstance(d, int) and d > 0),
            )
            for i in self.inputs
        ]
        self._n = len(self._checks)
        # The compiled run, without InferenceSession.run's per-call Python checks (ours
        # replace them); a provider failure still goes through session.run's fallback.
        self._run = getattr(session, "_sess", session).run
        self._explain = explain

    def call(self, inputs: tuple[Any, ...], named: Mapping[str, Any]) -> list[np.ndarray]:
        """``pipe(x1, x2, ...)`` in input order, or ``pipe(name=array, ...)``."""
        if not named and len(inputs) == self._n:
            feeds = {}
            for check, x in zip(self._checks, inputs):
                if (
                    type(x) is not np.ndarray
                    or x.dtype != check.dtype
                    or x.ndim != check.ndim
                    or any(x.shape[axis] != size for axis, size in check.static)
                ):
                    break
                feeds[check.name] = x
            else:
                return self._call(self._output_list, feeds, None)
        if inputs and named:
            raise InputError("pass inputs either by position or by name, not both")
        if inputs or not named:
            if len(inputs) != self._n:
                n = self._n
                raise InputError(
                    f"expected {n} input{'s' if n != 1 else ''} "
                    f"({', '.join(str(i) for i in self.inputs)}), got {len(inputs)}"
                )
            feeds = {info.name: x for info, x in zip(self.inputs, inputs)}
        else:
            feeds = named
        return self.run(feeds, None)

    def run(
        self, feeds: Mapping[str, Any], output_names: Sequence[str] | None, run_options: ort.RunOptions | None = None
    ) -> list[np.ndarray]:
        checked = self.check_feeds(feeds)
        if output_names is not None:
            for name in output_names:
                if name not in self._output_names:
                    raise InputError(
                        f"'{name}' is not an output{_core.did_you_mean(name, self._output_list)}; "
                        f"outputs: {', '.join(self._output_list)}"
                    )
            output_names = list(output_names)
        return self._call(output_names or self._output_list, checked, run_options)

    def _call(self, output_names: list[str], feeds: dict[str, Any], run_options: ort.RunOptions | None) -> list:
        try:
            return self._run(output_names, feeds, run_options)
        except Exception as e:
            if type(e).__name__ == "EPFail":  # let onnxruntime fall back to its other providers
                return self.session.run(output_names, feeds, run_options)
            if self._explain is not None:
                raise self._explain(e) from e
            raise

    def check_feeds(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        by_name = self._by_name
        for name in feeds:
            if name not in by_name:
                raise InputError(
                    f"'{name}' is not an input{_core.did_you_mean(name, list(by_name))}; inputs: "
                    + ", ".join(map(str, self.inputs))
                )
        if len(feeds) != len(by_name):
            missing = [i.name for i in self.inputs if i.name not in feeds]
            raise InputError(f"missing input{'s' if len(missing) > 1 else ''}: {', '.join(missing)}")
        checked: dict[str, np.ndarray] = {}
        for name, value in feeds.items():
            info = by_name[name]
            array = _as_array(value, info.dtype)
            if info.dtype is not None and array.dtype != info.dtype and not (
                info.dtype.kind == "U" and array.dtype.kind in "UO"
            ):
                raise InputError(f"input '{name}' expects {info.dtype}, got {array.dtype}")
            if info.shape is not None and array.ndim != len(info.shape):
                raise InputError(
                    f"input '{name}' expects rank {len(info.shape)} {list(info.shape)}, got shape {list(array.shape)}"
                )
            for axis, (want, got) in enumerate(zip(info.shape or (), array.shape)):
                if isinstance(want, int) and want > 0 and want != got:
                    raise InputError(
                        f"input '{name}' expects size {want} on axis {axis} {list(info.shape)}, "
                        f"got shape {list(array.shape)}"
                    )
            checked[name] = array
        return checked


def _as_array(value: Any, dtype: np.dtype | None) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor, as kornia takes
        return value.detach().cpu().numpy()
    # Lists and scalars carry no dtype of their own: they take the input's.
    return np.asarray(value, dtype=dtype)


# --- errors in the stages' own names ----------------------------------------------------------
_PREFIXED = re.compile(r"\bm(\d+)/([^\s'\"\]\[,:;()]+)")
_TOKEN = re.compile(r"[^\s'\"\]\[,;()]+")


def explain(
    error: Exception, labels: Sequence[str], renamed: Mapping[str, tuple[int, str]] | None = None
) -> Exception:
    """An ONNX Runtime error as a :class:`RunError` whose message names the stage and its own
    node and tensor names. ``renamed`` is the core's map from every name it changed in the
    merged graph to (stage, original name); without it, the core's ``m<i>/`` prefix (given
    only where two stages clash) says the stage."""
    from fastseq.errors import RunError, RunTimeoutError

    text = str(error).strip()
    if "terminate flag" in text.lower():
        return RunTimeoutError(f"the call was stopped: {text}")
    stages: list[str] = []

    def named(stage: int, original: str) -> str:
        label = labels[stage] if stage < len(labels) else f"model {stage}"
        if label not in stages:
            stages.append(label)
        return f"{original} (in {label})"

    def token(m: re.Match[str]) -> str:
        word = m.group(0)
        for candidate in (word, word.rstrip(".:")):
            hit = renamed.get(candidate) if renamed else None
            if hit is not None:
                return named(*hit) + word[len(candidate):]
        return _PREFIXED.sub(lambda p: named(int(p.group(1)), p.group(2)), word)

    translated = _TOKEN.sub(token, text)
    where = f"stage {', '.join(stages)}" if stages else "the pipeline " + " -> ".join(labels)
    return RunError(f"{where}: onnxruntime {type(error).__name__}: {translated}")


def with_timeout(timeout: float, options: ort.RunOptions, call: Callable[[], Any]) -> Any:
    """Runs ``call`` and sets ``options.terminate`` if it takes more than ``timeout`` s."""
    import threading

    from fastseq.errors import RunTimeoutError

    fired = threading.Event()

    def stop() -> None:
        fired.set()
        options.terminate = True

    timer = threading.Timer(timeout, stop)
    timer.daemon = True
    timer.start()
    try:
        return call()
    except Exception as e:
        if fired.is_set():
            raise RunTimeoutError(f"the call ran past its timeout of {timeout:g} s and was stopped") from e
        raise
    finally:
        timer.cancel()
        options.terminate = False


# --- optimised artefacts ------------------------------------------------------------------------
OPTIMIZED_FOR = "fastseq.optimized_for"


def export_optimized(
    composed: _core.Composed,
    target: Path,
    providers: Sequence[Provider] | None,
    session_options: ort.SessionOptions | None,
) -> Path:
    """Writes the model ONNX Runtime makes of ``composed`` after its graph optimisations
    (weights in ``<name>.data`` beside it), with what it was optimised for in its metadata.
    The file appears whole or not at all."""
    import json

    import onnx

    target.parent.mkdir(parents=True, exist_ok=True)
    options = session_options if session_options is not None else default_options()
    usable = usable_providers(providers)
    stage = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        data_name = f"{target.name}.data"
        with PrivateCopy.of(composed) as copy:
            _session(copy.path, options, usable, save_to=stage / target.name, data_name=data_name)
        model = onnx.load(str(stage / target.name), load_external_data=False)
        entry = model.metadata_props.add()
        entry.key = OPTIMIZED_FOR
        entry.value = json.dumps({
            "onnxruntime": ort.__version__,
            "providers": [provider_name(p) for p in usable],
            "graph_optimization_level": int(options.graph_optimization_level),
        })
        onnx.save(model, str(stage / target.name))
        # The data file first: the model that refers to it appears last.
        if (stage / data_name).exists():
            os.replace(stage / data_name, target.parent / data_name)
        os.replace(stage / target.name, target)
        return target
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def warn_if_optimized_elsewhere(new_session: ort.InferenceSession, providers: Sequence[Provider]) -> None:
    """A model exported with ``optimized=True`` for other providers or another onnxruntime
    may hold operators those cannot run or run slowly: say so."""
    import json

    meta = new_session.get_modelmeta().custom_metadata_map.get(OPTIMIZED_FOR)
    if not meta:
        return
    try:
        made = json.loads(meta)
    except ValueError:
        return
    now = {"onnxruntime": ort.__version__, "providers": new_session.get_providers()}
    if made.get("onnxruntime") != now["onnxruntime"] or made.get("providers") != now["providers"]:
        warnings.warn(
            f"this model was optimised by onnxruntime {made.get('onnxruntime')} for "
            f"{', '.join(made.get('providers') or [])}; it is running on onnxruntime {now['onnxruntime']} with "
            f"{', '.join(now['providers'])}: re-export it with optimized=True for this setup",
            RuntimeWarning,
            stacklevel=4,
        )
