"""The parts of a pipeline description: a stage, an edge, an exposed output."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

IoMap = Sequence[tuple[str, str]]
# (name, dtype, dims) as the core's summary gives them
IoInfo = tuple[str, str, list[str]]

# Model fields that `metadata` may set (onnx.compose.merge_models' keyword arguments).
META_KEYS = ("name", "doc_string", "producer_name", "producer_version", "domain")


@dataclass(frozen=True)
class Stage:
    """One model of a pipeline: its ``name`` (None in a chain, where the source names it),
    any source ``ONNXSequential`` takes, and an optional expected sha256 digest."""

    name: str | None
    source: Any
    sha256: str | None = None


@dataclass(frozen=True)
class Edge:
    """``src.output -> dst.input``: an output of one stage feeding an input of another."""

    src: str
    output: str
    dst: str
    input: str

    def __str__(self) -> str:
        return f"{self.src}.{self.output} -> {self.dst}.{self.input}"


@dataclass(frozen=True)
class Exposed:
    """A graph output: ``stage.output`` exposed under ``name``."""

    name: str
    stage: str
    output: str

    def __str__(self) -> str:
        return f"{self.stage}.{self.output}" if self.name == self.output else f"{self.name}={self.stage}.{self.output}"
