"""Type stubs for the Rust extension module ``fastseq._core``, written by
``tools/gen_stubs.py`` from the extension itself (the signatures, types and docstrings
PyO3 records in it, and the module's own names): do not edit by hand; run the tool after
changing the bindings (``tests/base/test_core_stub.py`` fails when this file drifts)."""

import _typeshed
import collections.abc
import os
import pathlib
import typing

MAX_IR_VERSION: int
PROTOBUF_LIMIT: int
MAX_BATCH_SIZE: int
__version__: str
__build__: str
LAYOUT: Layout

# The error classes are defined in fastseq/errors.py (so that they print and pickle as
# fastseq.<Name>); the core raises them and re-exports these.
from fastseq.errors import FastseqError as FastseqError
from fastseq.errors import LoadError as LoadError
from fastseq.errors import CompositionError as CompositionError
from fastseq.errors import OpsetMismatchError as OpsetMismatchError
from fastseq.errors import ExportError as ExportError

Source = bytes | str | os.PathLike[str] | tuple[str | os.PathLike[str], str | os.PathLike[str]] | Composed


@typing.final
class Composed:
    """A model held by the core (`fastseq::Composed`): decoded once, large weights as ranges of
    the source files until a session's private copy holds them, the rest as slices of the
    sources' bytes read into memory the core owns, with its composition's plan, report and
    origins (a loaded model is a composition of one).
    """

    def check_sources(self) -> None:
        """Raises LoadError naming the file if a source file this model still refers to (weights
        left in it, external data kept for `external_data="reuse"`) is no longer the file
        loaded. Other sources were read into memory and cannot change. For the runtime to
        call before it creates a session.
        """

    def dynamic_batch(
        self,
    ) -> tuple[Composed | None, list[tuple[int | None, str, str, str | None, str]]]:
        """The same model with a symbolic batch axis in place of its inputs' fixed first axis
        of 1, where the core's analysis proves the rows stay apart: (the new model, []), or
        (None, the reasons, as :meth:`row_mixing` gives them).
        """

    def encoded_len(self) -> int:
        """Size of the serialized model in bytes (weights inline)."""

    def for_file(self) -> Composed:
        """A copy with the model as fastseq writes it to a file: its stage map in its metadata
        (two stages or more; see the core's `merge::stage_map`), for the writes that go
        through onnx.save.
        """

    def graph_bytes(self) -> bytes:
        """The model's graph alone, serialized (a `GraphProto`)."""

    def inserted_nodes(self) -> list[int]:
        """Per stage, how many nodes at the start of its range in :meth:`origins` the merge
        inserted (adapters on its incoming edges; 0 for a loaded model).
        """

    def metadata(self) -> list[tuple[str, str]]:
        """The model's metadata_props, as (key, value) pairs in order."""

    def naming_problem(self) -> str | None:
        """The first naming rule of `onnx.checker` the model breaks (a name defined twice, read
        before it is defined, an undefined graph output), or None: what a rename or a merge
        can break in models that pass the checker.
        """

    def nodes(self) -> list[tuple[str, str, str, int]]:
        """Every top-level node of the graph, in order: (name, op_type, domain, stage), the
        stage an index into :meth:`origins`' stages, -1 for a node the merge inserted between
        stages (an adapter) or of a model without stages (loaded, without a stage map that
        fits). How a profile attributes ONNX Runtime's kernels to the stages.
        """

    def origins(self) -> tuple[list[tuple[str, int, int]], dict[str, tuple[int, str]]]:
        """Where the merged graph came from: a list, per stage, of (label, first node index,
        end node index) in the merged graph, and a dict from every renamed value or node
        name of the merged graph to (stage index, original name).
        """

    def plan(self) -> dict[str, typing.Any]:
        """The plan as the core decided it, as plain data: `form` ("graph" or "chain");
        `stages` in graph order, dicts of `label`, `given` (position in the given order),
        `inputs` and `outputs` (the stage's own, as :meth:`summary` gives them) and `pruned`;
        `edges` in the caller's order, (from, output, to, input, edge index); `inputs`, the
        merged model's graph inputs in order, (name, [(stage, input), ...]); `outputs`, its
        graph outputs, (name, stage, output); `pruned` (stage labels); `unused_outputs`
        ([(stage, output)], in the given order); `adapters` ([(edge index, description)]).
        A loaded model is a plan of one stage.
        """

    def report(self) -> dict[str, typing.Any]:
        """What the composition did besides merging: `pruned` (dict: `stages` (labels),
        `nodes`, `initializers`, `inputs`), `deduped_initializers`, `deduped_bytes`,
        `adapters` (list of (edge index, description)), `unused_outputs` (list of
        (stage index, output name)) and, under onnx.compose's rules, `unproven` (why the
        merge cannot vouch that the result passes onnx's checker; empty when it can).
        """

    def row_mixing(self) -> list[tuple[int | None, str, str, str | None, str]]:
        """Why the rows of a batch run through this model may depend on other rows (see the
        core's `merge::rows`): per reason, (top-level node index or None, the node's name in
        the merged graph, its op type, the node inside it at fault (a function's or a
        branch's) or None, the reason). Empty when every output keeps each row apart.
        """

    def save(
        self,
        path: str | os.PathLike[str],
        external_data: bool | None = None,
        threshold: typing.SupportsIndex | None = None,
    ) -> Saved:
        """Writes the model to `path` atomically. `external_data`: True puts tensors of at
        least `threshold` bytes in a data file beside it, False keeps them inline, None
        decides by size (external above the 2 GB protobuf limit); a model composed with
        `link_external` links its sources' data files beside it. `threshold`: None stands for
        `LAYOUT.threshold`. Returns what was written.
        """

    def stage_map_note(self) -> str | None:
        """Why the stage map in the model's metadata was ignored (it does not fit its nodes: the
        file was changed after fastseq wrote it), or None.
        """

    def stripped_bytes(self, threshold: typing.SupportsIndex | None = None) -> bytes:
        """The model serialized without its initializers of at least `threshold` bytes (None:
        `LAYOUT.threshold`).
        """

    def summary(self) -> dict[str, typing.Any]:
        """Inputs, outputs, opsets, counts and sizes. Element types use numpy's spelling
        (float32, as `TensorInfo` prints them); dimensions are ints when static, the
        parameter's name when symbolic, None when unknown (as `TensorInfo.shape`): `ir_version`,
        `producer`, `opsets` ([(domain, version)]), `inputs` and `outputs` ([(name, dtype,
        dims)]), `nodes`, `initializers`, `weight_bytes`, `functions`, `encoded_len`.
        """

    def to_bytes(self) -> bytes:
        """The serialized model."""

    def with_metadata(self, pairs: _typeshed.SupportsGetItem[int, tuple[str, str]]) -> Composed:
        """A copy with `pairs` (key, value) set in its metadata_props: a key keeps its first
        position and takes its last value. Nodes and weights are shared, not copied.
        """

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
        """A copy with the names `onnx.compose.add_prefix` would prefix prefixed (its flags),
        every reference renamed in every scope, and the value names renamed as (old, new).
        """

    def with_renamed(self, mapping: _typeshed.SupportsGetItem[int, tuple[str, str]]) -> Composed:
        """A copy with values renamed as `mapping` says (old, new): see `rename::rename_values`."""

    def with_weights(self, stripped: bytes, label: str) -> Composed:
        """`stripped` (a transformed copy of `stripped_bytes()`) with this model's weights put back."""


@typing.final
class Staging:
    """A staging folder beside a target (made by `stage`) for another program to write a model
    into; `commit` puts that model in place. Removed on `close()` or leaving a `with` block
    (or by the next write into that folder if the process is killed).
    """

    def __enter__(self) -> Staging: ...

    def __exit__(self, _exc_type: typing.Any, _exc: typing.Any, _tb: typing.Any) -> None: ...

    def close(self) -> None:
        """Removes the folder and what it holds."""

    def commit(
        self,
        model_file: str,
        metadata: _typeshed.SupportsGetItem[int, tuple[str, str]] | None = None,
        encode: collections.abc.Callable[[bytes], bytes] | None = None,
    ) -> Saved:
        """Commits the protobuf model `model_file` of the folder (and the external data files it
        refers to there) to the target; `metadata` pairs are set in its metadata_props;
        `encode(bytes) -> bytes` turns the final model into another format. Returns what was
        written.
        """

    def folder(self) -> pathlib.Path:
        """The folder to write into."""


@typing.final
class Saved:
    """What a write produced: the model's size, its data files' sizes together, and the data
    files it refers to, relative to its folder (`fastseq::Saved`). Every writer returns one.
    """

    def __repr__(self) -> str: ...

    @property
    def data_bytes(self) -> int: ...

    @property
    def data_files(self) -> list[str]: ...

    @property
    def model_bytes(self) -> int: ...


@typing.final
class PrivateCopyInfo:
    """What a private copy moved: `copied`, the bytes the kernel copied from the sources (of
    those, `by_sendfile` across file systems); `written`, the bytes written from memory;
    `mapped`, the bytes the spilled copies map (see `fastseq::private_copy`).
    """

    def __repr__(self) -> str: ...

    @property
    def by_sendfile(self) -> int: ...

    @property
    def copied(self) -> int: ...

    @property
    def mapped(self) -> int: ...

    @property
    def written(self) -> int: ...


@typing.final
class Layout:
    """How fastseq lays out a model with external data (`fastseq::LAYOUT`): tensors of at
    least `threshold` bytes go to the data file, which is named after the model
    (`data_file`), and a tensor's location must stay inside the model's folder
    (`allows_location`).
    """

    def __repr__(self) -> str: ...

    def allows_location(self, location: str) -> bool:
        """Whether `location` may name a data file: a relative path inside the model's folder."""

    def check_location(self, location: str) -> None:
        """Raises LoadError unless `location` may name a data file (see `allows_location`)."""

    def data_file(self, model_file: str) -> str:
        """The data file's name for the model file named `model_file`."""

    @property
    def data_suffix(self) -> str:
        """The data file of a model file is its name followed by this."""

    @property
    def threshold(self) -> int:
        """Tensors of at least this many bytes go to the data file."""


@typing.final
class Server:
    """A running server."""

    def drain(self) -> None:
        """Stops taking requests; those open go on."""

    def mark_ready(self) -> None:
        """Ready without a warm-up run."""

    @property
    def open(self) -> int:
        """Requests open now (arriving, queued or running)."""

    @property
    def ready(self) -> bool: ...

    def shutdown(self, grace_s: typing.SupportsFloat | typing.SupportsIndex) -> bool:
        """Drains, waits up to `grace_s` for the open requests, closes. True where all ended in time."""

    def warm_up(self) -> None:
        """Runs a row of zeros through each model, then marks the server ready; a RuntimeError
        saying which model failed and why.
        """


@typing.final
class TensorData:
    """A tensor's bytes, read-only, as Python's buffer protocol hands them to numpy."""

    def __len__(self) -> int: ...


@typing.final
class ServedSpec:
    """A served model as the protocol checks requests against it: its name and version, its
    inputs and outputs (name, KServe datatype, shape with -1 for a dynamic axis or None), and
    its batching.
    """

    @property
    def name(self) -> str: ...


def start_server(
    models: _typeshed.SupportsGetItem[int, tuple[ServedSpec, typing.Any]],
    http_fd: typing.SupportsIndex,
    grpc_fd: typing.SupportsIndex | None,
    options: dict[typing.Any, typing.Any],
    log: typing.Any,
) -> Server:
    """Serves `models` (pairs of a served spec and an engine callable) on the listening socket
    `http_fd` (and `grpc_fd`), both taken over; `options` as fastseq.serving sets them;
    `log(error, line)` receives one line per failure.
    """


def served_spec(
    name: str,
    version: str,
    inputs: _typeshed.SupportsGetItem[int, tuple[str, str, _typeshed.SupportsGetItem[int, typing.SupportsIndex] | None]],
    outputs: _typeshed.SupportsGetItem[int, tuple[str, str, _typeshed.SupportsGetItem[int, typing.SupportsIndex] | None]],
    max_batch_size: typing.SupportsIndex = 0,
    max_delay_us: typing.SupportsIndex = 0,
) -> ServedSpec:
    """The protocol's description of a served model (see [`ServedSpec`]): each tensor as (name,
    KServe datatype, shape or None).
    """


def served_documents(spec: ServedSpec) -> tuple[bytes, bytes]:
    """The model's metadata and Triton configuration documents (JSON), as the protocol writes them."""


def decode_http(
    spec: ServedSpec,
    body: typing.Any,
    header_length: typing.SupportsIndex | None = None,
    every_input: bool = True,
) -> tuple[str | None, list[tuple[str, str, list[int], typing.Any]], list[tuple[int, bool]], float | None]:
    """The HTTP infer request in `body` for `spec` (see `fastseq_serve::protocol::decode_http`):
    `(id, inputs in the model's order, outputs as (index, binary), timeout in seconds)`; a
    `fastseq.RequestError` for a request the protocol refuses. `every_input=False` leaves
    missing inputs to the caller's input rule.
    """


def encode_http(
    spec: ServedSpec,
    id: str | None,
    items: _typeshed.SupportsGetItem[int, tuple[typing.SupportsIndex, bool, str, _typeshed.SupportsGetItem[int, typing.SupportsIndex], typing.Any]],
) -> tuple[bytes, int | None]:
    """The answer to a request for `spec` (its `id`): `items` as (output index, binary, datatype,
    shape, values), values a C-contiguous uint8 view of the array, or a list of str or bytes
    for BYTES. Returns `(body, header_length)` (None: the body is JSON alone).
    """


def error_json(message: str) -> bytes:
    """`{"error": message}`, always valid JSON."""


def compose(
    sources: _typeshed.SupportsGetItem[int, Source],
    labels: _typeshed.SupportsGetItem[int, str],
    io_maps: _typeshed.SupportsGetItem[int, _typeshed.SupportsGetItem[int, tuple[str, str]] | None] | None = None,
    edges: _typeshed.SupportsGetItem[int, tuple[typing.SupportsIndex, str, typing.SupportsIndex, str]] | None = None,
    graph_inputs: _typeshed.SupportsGetItem[int, tuple[str, _typeshed.SupportsGetItem[int, tuple[typing.SupportsIndex, str]]]] | None = None,
    graph_outputs: _typeshed.SupportsGetItem[int, tuple[str, typing.SupportsIndex, str]] | None = None,
    keep_outputs: bool | collections.abc.Sequence[str] | None = None,
    prefixes: _typeshed.SupportsGetItem[int, str | None] | None = None,
    inputs: _typeshed.SupportsGetItem[int, str] | None = None,
    outputs: _typeshed.SupportsGetItem[int, str] | None = None,
    ir_version: typing.SupportsIndex | None = None,
    meta: dict[str, str] | None = None,
    model_version: typing.SupportsIndex | None = None,
    link_external: bool = False,
    prune: bool | None = None,
    dedupe: bool | None = None,
    adapt: bool | collections.abc.Sequence[int] | None = None,
    rules: str = 'fastseq',
    adapt_remedy: str | None = None,
) -> Composed:
    """Loads and composes `sources` (`labels` name them in errors). The linear form:
    `io_maps[i]` joins model i to i + 1 (by position without it, or where it is None). The
    graph form: `edges` (from stage, output, to stage, input), stages and edges in any order (the stages are put
    in an order where every edge goes forward, the given one where the edges allow; a cycle
    is an error); `graph_inputs` (name, [(stage, input), ...]) and `graph_outputs` (name,
    stage, output) expose values under the caller's names (without `graph_outputs`: every
    output no edge consumes, under its own name when unique among them, else
    `stage.output`). Errors name the caller's keys (`edges[2]: ...`). `prune` and `dedupe`
    default to on in the graph form, off in the linear one; `adapt`: True or a list of edge
    indices; `rules="onnx.compose"`: two models as `onnx.compose.merge_models` merges them;
    `adapt_remedy`: what an edge an adapter would fix says to do where adapters are off (the
    entry point's own remedy, `{}` standing for the adapter); `link_external`: external
    tensors keep pointing at their files, which a save links. :meth:`Composed.plan` says
    what was decided.
    """


def load_model(source: Source, label: str | None = None) -> Composed:
    """Loads one model (external data resolved) without composing it."""


def load_models(
    sources: _typeshed.SupportsGetItem[int, Source],
    labels: _typeshed.SupportsGetItem[int, str],
) -> list[Composed]:
    """Loads several models in parallel (external data resolved), one Composed each: the
    stages a pipeline keeps so that it can be composed again without reading its sources.
    """


def decode(data: bytes, label: str = 'model', graph: bool = False) -> Composed:
    """Decodes a serialized model (a `GraphProto` with `graph=True`) as it is: tensors in
    external data stay references, nothing is read from disk.
    """


def overlapping_names(
    g1: Composed,
    g2: Composed,
    io_map_inputs: _typeshed.SupportsGetItem[int, str],
) -> list[tuple[str, list[str]]]:
    """The names the graphs of `g1` and `g2` share, by kind: see `Composed::overlapping_names`."""


def external_data_locations(path: str | os.PathLike[str]) -> list[str]:
    """The external-data files that the model at `path` refers to (not opened)."""


def did_you_mean(name: str, candidates: _typeshed.SupportsGetItem[int, str]) -> str:
    """The hint ` (did you mean 'x'?)` for `name` among `candidates`, or an empty string."""


def name_text(data: bytes) -> str:
    """A name's bytes as the core's text of it: UTF-8 as it is, each byte that is not kept as an
    escape character (protobuf hands Python a `string` field that is not UTF-8 as `bytes`).
    """


def file_digest(path: str | os.PathLike[str]) -> str:
    """The XXH3-128 digest of a file's bytes, as hex."""


def open_input(path: str | os.PathLike[str]) -> int:
    """Opens a file named by input for reading (`fastseq::open_input`: what is not a regular
    file is refused without blocking) and returns its descriptor, for `os.fdopen`. A FIFO, a
    device, a socket or a directory is a LoadError naming it; an OS error an `OSError` with
    its errno and the path, as Python's `open` raises it.
    """


def write_private_copy(
    models: _typeshed.SupportsGetItem[int, Composed],
    path: str | os.PathLike[str],
    spill_min: typing.SupportsIndex | None = None,
) -> tuple[PrivateCopyInfo, list[Composed] | None]:
    """Writes the session's private copy of `models[0]` at `path`; with `spill_min`, also the
    copies of `models` spilled onto it, or None (see `fastseq::private_copy`).
    """


def model_digest(model: Composed) -> str:
    """The digest of the composed model as it is written for a session (the session cache's
    key), read where its weights are without writing or keeping them: see
    `Composed::digest`. A source file that is no longer the one loaded is a LoadError.
    """


def memory_bytes(models: _typeshed.SupportsGetItem[int, Composed]) -> int:
    """The bytes `models` hold in memory of their own (see `fastseq::memory_bytes`)."""


def merge_metadata(
    existing: _typeshed.SupportsGetItem[int, tuple[str, str]],
    pairs: _typeshed.SupportsGetItem[int, tuple[str, str]],
) -> list[tuple[str, str]]:
    """`existing` metadata pairs with `pairs` set: each key once, where it first appeared, with
    its last value (see `fastseq::merge_metadata`).
    """


def commit_bytes(data: bytes, path: str | os.PathLike[str], owner: str | None = None) -> Saved:
    """Writes `data` (a model without external data, in any format, or any other file) to
    `path`; `owner`: the name of the file it is written beside (see `fastseq::commit_bytes`).
    """


def stage(target: str | os.PathLike[str]) -> Staging:
    """A staging folder beside `target` (see `Staging`)."""


def check_target(path: str | os.PathLike[str], owner: str | None = None) -> None:
    """Checks that `path` can be written (see `fastseq::check_target`): an ExportError naming
    it if not.
    """
