"""Type stubs for the Rust extension module ``fastseq._core``."""

from collections.abc import Callable, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

MAX_IR_VERSION: int
PROTOBUF_LIMIT: int
__version__: str
#: what the extension was built for: "<arch>-<os>[-<env>] <profile>", e.g. "x86_64-linux-gnu release"
__build__: str

# The error classes are defined in fastseq/errors.py (so that they print and pickle as
# fastseq.<Name>); the core raises them and re-exports these five.
from fastseq.errors import CompositionError as CompositionError
from fastseq.errors import ExportError as ExportError
from fastseq.errors import FastseqError as FastseqError
from fastseq.errors import LoadError as LoadError
from fastseq.errors import OpsetMismatchError as OpsetMismatchError

Source = bytes | str | PathLike[str] | Composed

class Composed:
    """A model held by the core: large weights as ranges of the source files (copied in the
    kernel when the model is written, read where its bytes are asked for), the rest as
    slices of the sources' bytes read into memory the core owns; or slices of a private
    copy's data file once :func:`write_private_copy` has spilled them."""

    def encoded_len(self) -> int: ...
    def to_bytes(self) -> bytes: ...
    def graph_bytes(self) -> bytes: ...
    def with_prefix(
        self,
        prefix: str,
        nodes: bool = True,
        edges: bool = True,
        inputs: bool = True,
        outputs: bool = True,
        initializers: bool = True,
        value_infos: bool = True,
        functions: bool = True,
    ) -> tuple[Composed, list[tuple[str, str]]]:
        """A copy with the names ``onnx.compose.add_prefix`` would prefix prefixed, every
        reference in every scope renamed, and the value names renamed (old, new)."""
    def with_renamed(self, mapping: Sequence[tuple[str, str]]) -> Composed:
        """A copy with values renamed (old, new) in every scope but a subgraph's own."""
    def save(self, path: str, external_data: bool | None = None, threshold: int = 1024) -> dict[str, Any]: ...
    def check_sources(self) -> None: ...
    def stripped_bytes(self, threshold: int = 1024) -> bytes: ...
    def with_weights(self, stripped: bytes, label: str) -> Composed: ...
    def with_metadata(self, pairs: Sequence[tuple[str, str]]) -> Composed: ...
    def metadata(self) -> list[tuple[str, str]]: ...
    def summary(self) -> dict[str, Any]: ...
    def plan(self) -> dict[str, Any]:
        """The plan as the core decided it, as plain data: ``form`` ("graph" or "chain");
        ``stages`` in graph order, dicts of ``label``, ``given`` (position in the given
        order), ``inputs`` and ``outputs`` (the stage's own, as :meth:`summary` gives them)
        and ``pruned``; ``edges`` in the caller's order, (from, output, to, input, edge
        index); ``inputs``, the merged model's graph inputs in order, (name, [(stage,
        input), ...]); ``outputs``, its graph outputs, (name, stage, output); ``pruned``
        (stage labels); ``unused_outputs`` ([(stage, output)], in the given order);
        ``adapters`` ([(edge index, description)]). A loaded model is a plan of one stage."""
    def report(self) -> dict[str, Any]:
        """What the composition did besides merging: ``pruned`` (``stages`` (labels),
        ``nodes``, ``initializers``, ``inputs``), ``deduped_initializers``, ``deduped_bytes``,
        ``adapters`` ([(edge index, description)]) and ``unused_outputs`` ([(stage, output)])."""
    def origins(self) -> tuple[list[tuple[str, int, int]], dict[str, tuple[int, str]]]:
        """Per stage (label, first node, end node) in the merged graph, and every renamed
        value or node name of the merged graph -> (stage index, original name)."""

    def inserted_nodes(self) -> list[int]:
        """Per stage, how many nodes at the start of its range in :meth:`origins` the merge
        inserted (adapters on its incoming edges; 0 for a loaded model)."""

    def nodes(self) -> list[tuple[str, str, str, int]]:
        """Every top-level node in order: (name, op_type, domain, stage index into
        :meth:`origins`' stages, or -1 for an adapter the merge inserted between stages, or a
        model without stages)."""

    def stage_map_note(self) -> str | None:
        """Why the stage map in the model's metadata was ignored (it does not fit its nodes),
        or None."""

    def for_file(self) -> Composed:
        """A copy with the model as fastseq writes it to a file: its stage map in its
        metadata (two stages or more)."""

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
    rules: str = "fastseq",
    adapt_remedy: str | None = None,
) -> Composed:
    """Loads and composes ``sources`` (``labels`` name them in errors). The linear form:
    ``io_maps[i]`` joins model i to i + 1 (by position without it). The graph form:
    ``edges`` (from stage, output, to stage, input), stages and edges in any order (the
    stages are put in an order where every edge goes forward, the given one where the edges
    allow; a cycle is an error); ``graph_inputs`` (name, [(stage, input), ...]) and
    ``graph_outputs`` (name, stage, output) expose values under the caller's names (without
    ``graph_outputs``: every output no edge consumes, under its own name when unique among
    them, else ``stage.output``). Errors name the caller's keys (``edges[2]: ...``).
    ``prune`` and ``dedupe`` default to on in the graph form, off in the linear one;
    ``adapt``: True or a list of edge indices; ``rules="onnx.compose"``: two models as
    ``onnx.compose.merge_models`` merges them; ``adapt_remedy``: what an edge an adapter
    would fix says to do where adapters are off (the entry point's own remedy, ``{}``
    standing for the adapter). :meth:`Composed.plan` says what was decided."""
def load_model(source: Source, label: str | None = None) -> Composed: ...
def load_models(sources: Sequence[Source], labels: Sequence[str]) -> list[Composed]: ...
def decode(data: bytes, label: str = "model", graph: bool = False) -> Composed:
    """A serialized model (a GraphProto with ``graph=True``) as it is: external tensors
    stay references."""
def overlapping_names(g1: Composed, g2: Composed, io_map_inputs: Sequence[str]) -> list[tuple[str, list[str]]]: ...
def external_data_locations(path: str) -> list[str]: ...
def did_you_mean(name: str, candidates: Sequence[str]) -> str: ...
def check_external_location(location: str) -> None: ...
def file_digest(path: str | PathLike[str]) -> str: ...
def model_digest(model: Composed) -> str:
    """The digest of ``model`` as :func:`write_private_copy` would write it for a session
    (the session cache's key), read where its weights are (memory, the sources, a private
    copy) without writing or keeping them."""
def commit_bytes(data: bytes, path: str | PathLike[str], owner: str | None = None) -> dict[str, Any]:
    """Writes ``data`` (a model without external data, in any format, or any other file) to
    ``path`` with the core's writer: atomically, under the export lock, never through a
    link. With ``owner`` (the name of a file in the same folder: a pipeline file), ``path``
    is a file written beside it: marked as the writer's, and a file there that the writer
    did not make for that owner is an ExportError, never replaced. Returns ``model_bytes``,
    ``data_bytes`` (0) and ``data_files`` ([])."""

def check_target(path: str | PathLike[str], owner: str | None = None) -> None:
    """An ExportError naming ``path`` unless :func:`commit_bytes` (with ``owner``) could write
    it now: the folder exists, the target is no folder, device, read-only file or (beside an
    owner) another's file, and a temporary file can be made beside it. Called before the
    work whose result is written."""

def stage(target: str | PathLike[str]) -> Staging:
    """A staging folder beside ``target`` for another program (onnx, ONNX Runtime) to write
    a model into, for :meth:`Staging.commit` to put in place."""

class Staging:
    """A staging folder beside a target, held by this process (a killed process's is
    removed by the next write into that folder). A context manager: leaving it removes the
    folder and what it still holds."""

    def folder(self) -> Path: ...
    def commit(
        self,
        model_file: str,
        metadata: Sequence[tuple[str, str]] | None = None,
        encode: Callable[[bytes], bytes] | None = None,
    ) -> dict[str, Any]:
        """Commits the protobuf model ``model_file`` (relative to the folder) and the external
        data files it refers to beside it to the target: each data file under the name it
        has here when that name is free or holds a file the writer made for this target,
        else under a token name, the model last, its locations rewritten to match.
        ``metadata`` pairs are set in its metadata_props; ``encode`` turns the final model's
        protobuf bytes into another format (a text format). Returns ``model_bytes``,
        ``data_bytes`` and ``data_files`` (relative to the target's folder)."""
    def close(self) -> None: ...
    def __enter__(self) -> Staging: ...
    def __exit__(self, _exc_type: object, _exc: object, _tb: object) -> None: ...

def memory_bytes(models: Sequence[Composed]) -> int:
    """The bytes ``models`` hold in memory of their own (not mapped from a private copy), each
    slice counted once: what :func:`write_private_copy` spills from ``spill_min`` on."""

def write_private_copy(
    models: Sequence[Composed], path: str | PathLike[str], spill_min: int | None = None
) -> tuple[dict[str, int], list[Composed] | None]: ...
