"""ONNX Runtime session options as plain data: a dict (pipeline files, pickling, Ray
actors) to ``ort.SessionOptions`` and back. onnxruntime is imported only when used."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastseq import _core


# SessionOptions attributes a pipeline file may set; enums are written by name.
# Config entries ONNX Runtime lets us read back by key (it has no way to list them).
_CONFIG_KEYS = (
    "session.disable_prepacking",
    "session.intra_op.allow_spinning",
    "session.inter_op.allow_spinning",
    "session.set_denormal_as_zero",
    "session.use_env_allocators",
    "session.disable_cpu_ep_fallback",
    "session.use_device_allocator_for_initializers",
    "session.disable_quant_qdq",
    "session.disable_double_qdq_remover",
    "session.enable_quant_qdq_cleanup",
    "session.qdqisint8allowed",
    "session.x64quantprecision",
    "optimization.enable_gelu_approximation",
    "optimization.minimal_build_optimizations",
    "session.dynamic_block_base",
    "mlas.enable_gemm_fastmath_arm64_bfloat16",
)

_ATTRIBUTES = (
    "intra_op_num_threads", "inter_op_num_threads", "graph_optimization_level", "execution_mode",
    "execution_order",
    "enable_cpu_mem_arena", "enable_mem_pattern", "enable_mem_reuse", "enable_profiling",
    "profile_file_prefix", "optimized_model_filepath", "use_deterministic_compute",
    "log_severity_level", "log_verbosity_level", "logid",
)


def _enums() -> dict[str, dict[str, Any]]:
    import onnxruntime as ort

    level, mode = ort.GraphOptimizationLevel, ort.ExecutionMode
    return {
        "graph_optimization_level": {
            "disabled": level.ORT_DISABLE_ALL, "basic": level.ORT_ENABLE_BASIC,
            "extended": level.ORT_ENABLE_EXTENDED, "all": level.ORT_ENABLE_ALL,
        },
        "execution_mode": {"sequential": mode.ORT_SEQUENTIAL, "parallel": mode.ORT_PARALLEL},
        "execution_order": {
            "default": ort.ExecutionOrder.DEFAULT, "priority_based": ort.ExecutionOrder.PRIORITY_BASED,
            "memory_efficient": ort.ExecutionOrder.MEMORY_EFFICIENT,
        },
    }


def session_options(options: Any) -> Any:
    """An ``ort.SessionOptions`` from a dict of attributes (enums by name: ``"all"``,
    ``"parallel"``) and dotted config entries (``"session.disable_prepacking" = "1"``); an
    ``ort.SessionOptions`` or None is returned as it is."""
    if options is None or not isinstance(options, Mapping):
        return options
    import onnxruntime as ort

    result = ort.SessionOptions()
    enums = _enums()
    for key, value in options.items():
        if "." in key:
            result.add_session_config_entry(key, str(value).lower() if isinstance(value, bool) else str(value))
        elif key in enums:
            if value not in enums[key]:
                raise ValueError(f"{key}: '{value}' is not one of {', '.join(enums[key])}")
            setattr(result, key, enums[key][value])
        elif key in _ATTRIBUTES:
            try:
                setattr(result, key, value)
            except TypeError as e:
                raise ValueError(f"{key}: {value!r} has the wrong type ({e})") from None
        else:
            raise ValueError(f"'{key}' is not a session option{_core.did_you_mean(key, list(_ATTRIBUTES))}")
    return result


def session_options_dict(options: Any) -> dict[str, Any]:
    """The attributes of an ``ort.SessionOptions`` that differ from the defaults, and the
    config entries among ``_CONFIG_KEYS`` that are set, as :func:`session_options` reads
    them (ONNX Runtime cannot list config entries: only known keys travel)."""
    if options is None or isinstance(options, Mapping):
        return dict(options or {})
    import onnxruntime as ort

    default = ort.SessionOptions()
    names = {kind: {v: k for k, v in values.items()} for kind, values in _enums().items()}
    out: dict[str, Any] = {}
    for key in _ATTRIBUTES:
        value = getattr(options, key)
        if value != getattr(default, key):
            out[key] = names[key][value] if key in names else value
    for key in _CONFIG_KEYS:
        try:
            out[key] = options.get_session_config_entry(key)
        except RuntimeError:  # not set
            pass
    return out
