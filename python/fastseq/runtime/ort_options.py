"""ONNX Runtime's options, the caller's and fastseq's own. A caller's ``SessionOptions`` and
``RunOptions`` are theirs: fastseq never changes them. What it sets for one session or one
call (optimisation off for a session cache entry, where ONNX Runtime writes an optimised
model, profiling, a call's ``terminate`` flag, log level and tag) goes on a copy, made
here, so that threads sharing one options object never see each other's settings.

ONNX Runtime cannot copy an options object and lets a program read back only its attributes
and its config entries by key: the copy carries every attribute and every config key that
onnxruntime reads (:data:`fastseq.graph.session_settings._CONFIG_KEYS`, the one description of
session options; run options' keys below). What it cannot read back is not carried: custom
operator libraries (a session that needs one fails loudly on the copy, see
:func:`fastseq.runtime.session.make`), initializers added with ``add_initializer``, free
dimension overrides, and a ``RunOptions``' active LoRA adapters."""

from __future__ import annotations

from typing import Any

import onnxruntime as ort

from fastseq.errors import InputError

#: RunOptions attributes, all readable
_RUN_ATTRIBUTES = ("log_severity_level", "log_verbosity_level", "logid", "only_execute_path_to_fetches", "terminate")
#: RunOptions config keys that onnxruntime reads (onnxruntime_run_options_config_keys.h)
_RUN_CONFIG_KEYS = (
    "memory.enable_memory_arena_shrinkage",
    "disable_synchronize_execution_providers",
    "gpu_graph_id",
    "qnn.htp_perf_mode",
    "qnn.htp_perf_mode_post_run",
    "qnn.rpc_control_latency",
    "qnn.lora_config",
)


def default_options() -> ort.SessionOptions:
    """kornia's default: extended graph optimizations."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    return options


def session_copy(options: ort.SessionOptions | None) -> ort.SessionOptions:
    """A ``SessionOptions`` of fastseq's own with the settings of ``options`` (the defaults
    for None): what fastseq changes for one session goes on it."""
    if options is None:
        return default_options()
    from fastseq.graph.session_settings import session_options, session_options_dict

    return session_options(session_options_dict(options))


def quiet_run_options() -> ort.RunOptions:
    """Run options whose log shows no errors: fastseq raises each one itself, in the stages'
    names (:func:`fastseq.runtime.explain.explain`), and ONNX Runtime would print it on stderr
    first. Its warnings (an output of another shape than declared, for one) come from the
    session's log and still show."""
    options = ort.RunOptions()
    options.log_severity_level = 4
    return options


def run_copy(options: ort.RunOptions | None) -> ort.RunOptions:
    """``RunOptions`` of fastseq's own for one call: a copy of the caller's ``options``
    (attributes and config entries, ``terminate`` included), or quiet ones for None. Setting
    its ``terminate`` stops this call only."""
    if options is None:
        return quiet_run_options()
    copy = ort.RunOptions()
    for name in _RUN_ATTRIBUTES:
        setattr(copy, name, getattr(options, name))
    for key in _RUN_CONFIG_KEYS:
        try:
            value = options.get_run_config_entry(key)
        except Exception:  # noqa: BLE001 - onnxruntime raises for an entry that was never set
            continue
        copy.add_run_config_entry(key, value)
    return copy


def check_log_level(level: Any) -> None:
    """``log_level=`` is None or one of ONNX Runtime's severities, 0 (verbose) .. 4 (fatal)."""
    if level is not None and (isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= 4):
        raise InputError(f"log_level must be an int from 0 (verbose) to 4 (fatal) or None, got {level!r}")
