"""Type stubs for the Rust extension module ``fastseq._core``."""

from collections.abc import Sequence
from os import PathLike
from typing import Any

MAX_IR_VERSION: int
PROTOBUF_LIMIT: int
__version__: str

class FastseqError(Exception): ...
class LoadError(FastseqError): ...
class CompositionError(FastseqError): ...
class OpsetMismatchError(CompositionError): ...
class ExportError(FastseqError): ...

Source = bytes | str | PathLike[str] | Composed

class Composed:
    """A model held by the core: large weights as ranges of the source files (copied in the
    kernel when the model is written, read where its bytes are asked for), the rest as
    slices of the sources' bytes read into memory the core owns; or slices of a private
    copy's data file once :func:`write_private_copy` has spilled them."""

    def encoded_len(self) -> int: ...
    def to_bytes(self) -> bytes: ...
    def save(self, path: str, external_data: bool | None = None, threshold: int = 1024) -> dict[str, Any]: ...
    def check_sources(self) -> None: ...
    def stripped_bytes(self, threshold: int = 1024) -> bytes: ...
    def with_weights(self, stripped: bytes, label: str) -> Composed: ...
    def with_metadata(self, pairs: Sequence[tuple[str, str]]) -> Composed: ...
    def metadata(self) -> list[tuple[str, str]]: ...
    def summary(self) -> dict[str, Any]: ...
    def report(self) -> dict[str, Any]:
        """What the composition did besides merging: ``pruned`` (``stages`` (labels),
        ``nodes``, ``initializers``, ``inputs``), ``deduped_initializers``, ``deduped_bytes``,
        ``adapters`` ([(edge index, description)]) and ``unused_outputs`` ([(stage, output)])."""
    def origins(self) -> tuple[list[tuple[str, int, int]], dict[str, tuple[int, str]]]:
        """Per stage (label, first node, end node) in the merged graph, and every renamed
        value or node name of the merged graph -> (stage index, original name)."""

def compose(
    sources: Sequence[Source],
    labels: Sequence[str],
    io_maps: Sequence[Sequence[tuple[str, str]]] | None = None,
    edges: Sequence[tuple[int, str, int, str]] | None = None,
    graph_inputs: Sequence[tuple[str, Sequence[tuple[int, str]]]] | None = None,
    graph_outputs: Sequence[tuple[str, int, str]] | None = None,
    keep_outputs: bool | Sequence[str] | None = None,
    prefixes: Sequence[str | None] | None = None,
    inputs: Sequence[str] | None = None,
    outputs: Sequence[str] | None = None,
    ir_version: int | None = None,
    meta: dict[str, str] | None = None,
    model_version: int | None = None,
    link_external: bool = False,
    prune: bool | None = None,
    dedupe: bool | None = None,
    adapt: bool | Sequence[int] | None = None,
) -> Composed:
    """Loads and composes ``sources`` (``labels`` name them in errors). The linear form:
    ``io_maps[i]`` joins model i to i + 1 (by position without it). The graph form:
    ``edges`` (from stage, output, to stage, input), any earlier stage to any later one;
    ``graph_inputs`` (name, [(stage, input), ...]) and ``graph_outputs`` (name, stage,
    output) expose values under the caller's names. ``prune`` and ``dedupe`` default to on in
    the graph form, off in the linear one; ``adapt``: True or a list of edge indices."""
def load_model(source: Source, label: str | None = None) -> Composed: ...
def load_models(sources: Sequence[Source], labels: Sequence[str]) -> list[Composed]: ...
def external_data_locations(path: str) -> list[str]: ...
def did_you_mean(name: str, candidates: Sequence[str]) -> str: ...
def check_external_location(location: str) -> None: ...
def file_digest(path: str | PathLike[str]) -> str: ...
def write_private_copy(
    models: Sequence[Composed], path: str | PathLike[str], spill_min: int | None = None, digest: bool = True
) -> tuple[str | None, dict[str, int], list[Composed] | None]: ...
