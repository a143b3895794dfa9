"""ONNX Runtime sessions: providers in priority order, SessionOptions, availability."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import onnxruntime as ort

Provider = str | tuple[str, dict[str, Any]]


def provider_name(p: Provider) -> str:
    return p if isinstance(p, str) else p[0]


def default_options() -> ort.SessionOptions:
    """kornia's default: extended graph optimizations."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    return options


def usable_providers(providers: Sequence[Provider] | None) -> list[Provider]:
    """The requested providers that this onnxruntime build has, in order. Each missing one
    is a warning naming it and what is available, never a silent fallback."""
    requested = list(providers) if providers else ["CPUExecutionProvider"]
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
                stacklevel=3,
            )
    return usable or ["CPUExecutionProvider"]


def create(
    model: bytes | str,
    providers: Sequence[Provider] | None = None,
    session_options: ort.SessionOptions | None = None,
) -> ort.InferenceSession:
    """A session over serialized model bytes or a model path (needed above 2 GB, where the
    weights live in external data beside it)."""
    return ort.InferenceSession(
        model,
        sess_options=session_options if session_options is not None else default_options(),
        providers=usable_providers(providers),
    )
