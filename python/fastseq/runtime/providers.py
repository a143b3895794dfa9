"""Execution providers: which of those asked for this onnxruntime build has, in order, and
the options each running one takes."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import onnxruntime as ort

from fastseq import _core
from fastseq.errors import ProviderError

Provider = str | tuple[str, dict[str, Any]]


def provider_name(p: Provider) -> str:
    return p if isinstance(p, str) else p[0]


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


def check_provider_options(providers: Sequence[Any] | None, made: ort.InferenceSession) -> None:
    """A ProviderError for an option that a running provider does not have (ONNX Runtime
    passes the options on and ignores a key it does not know: a misspelt ``devcie_id``
    would silently run on device 0); a provider's options are the ones its session reports.
    A provider that reports none (the CPU provider) ignores every option it is given: a
    warning says so. A provider that did not start is warned about where it is chosen."""
    from fastseq.ops._graph import user_stacklevel

    running = made.get_provider_options()
    for p in providers or []:
        if isinstance(p, str) or not isinstance(p, (tuple, list)) or len(p) != 2 or p[0] not in running:
            continue
        name, options = p
        known = list(running[name])
        unknown = [str(k) for k in options if str(k) not in known]
        if unknown and known:
            raise ProviderError(
                f"{name} has no option '{unknown[0]}'{_core.did_you_mean(unknown[0], known)}; "
                f"its options: {', '.join(sorted(known))}"
            )
        if unknown:
            warnings.warn(
                f"{name} takes no options in this onnxruntime build: {', '.join(unknown)} "
                f"{'is' if len(unknown) == 1 else 'are'} ignored",
                RuntimeWarning,
                stacklevel=user_stacklevel(),
            )
