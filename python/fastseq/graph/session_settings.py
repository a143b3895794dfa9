"""ONNX Runtime session options as plain data: a dict (pipeline files, pickling, Ray
actors) to ``ort.SessionOptions`` and back. onnxruntime is imported only when used."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastseq import _core

# SessionOptions attributes a pipeline file may set; enums are written by name.
# Config entries ONNX Runtime lets us read back by key (it has no way to list them): every
# key that onnxruntime 1.32 reads (its headers' and its library's), so that a copy of a
# caller's options (runtime/ort_options.py) and a pipeline sent to a Ray actor keep what is set;
# tests/runtime/test_ort_options.py checks the list against the installed onnxruntime.
_CONFIG_KEYS = (
    "ep.context_embed_mode",
    "ep.context_enable",
    "ep.context_file_path",
    "ep.context_model_external_initializers_file_name",
    "ep.context_source_model_path",
    "ep.cpu.qmoe_deferred_scale",
    "ep.cuda.fpa_intb_dequant_gemm_min_m",
    "ep.cuda.fpa_intb_gemm",
    "ep.cuda.fpa_intb_profile_m",
    "ep.cuda.gqa_workspace_max_total_sequence_length",
    "ep.cuda.matmul_nbits_m_chunk_size",
    "ep.cuda.moe_packed_gpu_experts",
    "ep.cuda.runtime_fusion.causal_conv_with_state",
    "ep.cuda.runtime_fusion.unit_swish",
    "ep.enable_weightless",
    "ep.enable_weightless_ep_context_nodes",
    "ep.enable_weightless_mode",
    "mlas.disable_kleidiai",
    "mlas.enable_gemm_fastmath_arm64_bfloat16",
    "mlas.kleidiai.conv_igemm_max_work",
    "mlas.nchwc_depthwise_sliding",
    "mlas.nchwc_pointwise_conv_max_input_channel_batch",
    "mlas.qnbit.force_fp32",
    "mlas.use_lut_gemm",
    "optimization.constant_folding_max_output_size_in_bytes",
    "optimization.disable_specified_optimizers",
    "optimization.enable_cast_chain_elimination",
    "optimization.enable_gelu_approximation",
    "optimization.minimal_build_optimizations",
    "session.allow_released_opsets_only",
    "session.collect_node_memory_stats_to_file",
    "session.compile_only",
    "session.debug_layout_transformation",
    "session.disable_aot_function_inlining",
    "session.disable_cpu_ep_fallback",
    "session.disable_double_qdq_remover",
    "session.disable_model_compile",
    "session.disable_prepacking",
    "session.disable_qdq_constant_folding",
    "session.disable_quant_qdq",
    "session.dynamic_block_base",
    "session.enable_cpu_mem_arena",
    "session.enable_dq_matmulnbits_fusion",
    "session.enable_mem_pattern",
    "session.enable_moe_expert_counting",
    "session.enable_moe_expert_statistics",
    "session.enable_profiling",
    "session.enable_quant_qdq_cleanup",
    "session.enable_saved_runtime_optimizations",
    "session.execution_mode",
    "session.external_data_loader.chunk_bytes",
    "session.external_data_loader.min_size_bytes",
    "session.external_data_loader.pinned_memory_bytes",
    "session.external_data_loader.threads",
    "session.fail_on_suboptimal_compiled_model",
    "session.force_spinning_stop",
    "session.function_expansion_byte_limit",
    "session.function_expansion_node_limit",
    "session.gqa_value_layout",
    "session.graph_optimization_level",
    "session.graph_optimizations_loop_level",
    "session.inter_op.allow_spinning",
    "session.inter_op.spin_backoff_max",
    "session.inter_op.spin_duration_us",
    "session.inter_op_num_threads",
    "session.intra_op.allow_spinning",
    "session.intra_op.spin_backoff_max",
    "session.intra_op.spin_duration_us",
    "session.intra_op_num_threads",
    "session.intra_op_thread_affinities",
    "session.kernel_dispatch_policy",
    "session.layer_assignment_settings",
    "session.load_model_format",
    "session.log_id",
    "session.log_severity_level",
    "session.log_verbosity_level",
    "session.max_shape_override",
    "session.moe.offload.allow_file_backing",
    "session.moe.offload.async_max_tokens",
    "session.moe.offload.budget_group",
    "session.moe.offload.cpu_execution",
    "session.moe.offload.cpu_threads",
    "session.moe.offload.derived_cache_dir",
    "session.moe.offload.device_expert_bytes",
    "session.moe.offload.device_working_bytes",
    "session.moe.offload.gpu_budget_bytes",
    "session.moe.offload.gpu_device_mem_limit",
    "session.moe.offload.host_expert_bytes",
    "session.moe.offload.host_working_bytes",
    "session.moe.offload.min_expert_weight",
    "session.moe.offload.mode",
    "session.moe.offload.node_overrides",
    "session.moe.offload.pinned_bytes",
    "session.moe.offload.placement",
    "session.moe.offload.popularity_file",
    "session.moe.offload.prefill_wave_experts",
    "session.moe.offload.reserve_device_bytes",
    "session.moe.offload.skip_tail_cold_only",
    "session.moe.offload.skip_zero_cold_doorbell",
    "session.moe.offload.source_root",
    "session.moe.offload.tail_substitution_min_rank",
    "session.moe.offload.tail_substitution_threshold",
    "session.moe_expert_counter_alpha",
    "session.moe_expert_counter_beta",
    "session.moe_expert_counter_state_file",
    "session.name_based_layer_assignment",
    "session.node_partition_config_file",
    "session.optimized_model_external_initializers_file_name",
    "session.optimized_model_external_initializers_min_size_in_bytes",
    "session.optimized_model_filepath",
    "session.prepack.enable_parallel",
    "session.qdq_matmulnbits_accuracy_level",
    "session.qdq_matmulnbits_block_size",
    "session.qdqisint8allowed",
    "session.record_ep_graph_assignment_info",
    "session.resource_cuda_partitioning_settings",
    "session.save_external_prepacked_constant_initializers",
    "session.save_model_format",
    "session.set_denormal_as_zero",
    "session.strict_shape_type_inference",
    "session.strict_workspace_verification",
    "session.use_deterministic_compute",
    "session.use_device_allocator_for_initializers",
    "session.use_env_allocators",
    "session.use_external_initializer_file_buffers_directly",
    "session.use_ort_model_bytes_directly",
    "session.use_ort_model_bytes_for_initializers",
    "session.use_per_session_threads",
    "session.x64quantprecision",
)

_ATTRIBUTES = (
    "intra_op_num_threads",
    "inter_op_num_threads",
    "graph_optimization_level",
    "execution_mode",
    "execution_order",
    "enable_cpu_mem_arena",
    "enable_mem_pattern",
    "enable_mem_reuse",
    "enable_profiling",
    "profile_file_prefix",
    "optimized_model_filepath",
    "use_deterministic_compute",
    "log_severity_level",
    "log_verbosity_level",
    "logid",
    "use_per_session_threads",
)


_PROFILE = "pipe.profile() (fastseq profile), which profiles into a folder of fastseq's own"
_OPTIMISED = "pipe.export(path, optimized=True) (fastseq merge --optimize), which writes through fastseq's writer"
_NO_FILES = "fastseq lets ONNX Runtime write no file of its own; export the model and run ONNX Runtime on it yourself"

#: Options that make ONNX Runtime write (or read) a file at a path they name, or in the
#: working folder: the value is what to use instead. Switches count only when on, paths
#: when not empty. Never taken from a pipeline file or a caller (see docs/security.md, "Files
#: that ONNX Runtime would write"): fastseq sets some on copies of its own (runtime/ort_options.py).
FILE_OPTIONS = {
    "optimized_model_filepath": _OPTIMISED,
    "session.optimized_model_filepath": _OPTIMISED,
    "session.optimized_model_external_initializers_file_name": _OPTIMISED,
    "enable_profiling": _PROFILE,
    "profile_file_prefix": _PROFILE,
    "session.enable_profiling": _PROFILE,
    "session.collect_node_memory_stats_to_file": _NO_FILES,
    "session.debug_layout_transformation": _NO_FILES,
    "ep.context_enable": _NO_FILES,
    "ep.context_file_path": _NO_FILES,
    "ep.context_model_external_initializers_file_name": _NO_FILES,
    "session.moe_expert_counter_state_file": _NO_FILES,
    "session.moe.offload.derived_cache_dir": _NO_FILES,
    "session.moe.offload.popularity_file": _NO_FILES,
    "session.node_partition_config_file": _NO_FILES,
}


def file_option(options: Any) -> tuple[str, str] | None:
    """The first of :data:`FILE_OPTIONS` that ``options`` (a dict as pipeline files give it,
    an ``ort.SessionOptions`` or None) sets, and what to use instead; None when it sets none
    (of an ``ort.SessionOptions``, attributes count where they differ from the defaults)."""
    if options is None:
        return None
    values = dict(options) if isinstance(options, Mapping) else session_options_dict(options)
    for key, value in values.items():
        if key not in FILE_OPTIONS:
            continue
        text = str(value).strip().lower()
        if text in ("", "0", "false", "off", "none"):
            continue
        return key, FILE_OPTIONS[key]
    return None


def refuse_file_options(options: Any, error: type[Exception] = ValueError) -> None:
    """An ``error`` naming the first of :data:`FILE_OPTIONS` that ``options`` for a pipeline
    file (shared input) set, and what to use instead."""
    if found := file_option(options):
        raise error(f"{found[0]}: a pipeline file cannot name a file for ONNX Runtime to write or read; use {found[1]}")


def _enums() -> dict[str, dict[str, Any]]:
    import onnxruntime as ort

    level, mode = ort.GraphOptimizationLevel, ort.ExecutionMode
    return {
        "graph_optimization_level": {
            "disabled": level.ORT_DISABLE_ALL,
            "basic": level.ORT_ENABLE_BASIC,
            "extended": level.ORT_ENABLE_EXTENDED,
            "all": level.ORT_ENABLE_ALL,
        },
        "execution_mode": {"sequential": mode.ORT_SEQUENTIAL, "parallel": mode.ORT_PARALLEL},
        "execution_order": {
            "default": ort.ExecutionOrder.DEFAULT,
            "priority_based": ort.ExecutionOrder.PRIORITY_BASED,
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
