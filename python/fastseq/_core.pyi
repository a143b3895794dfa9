"""Type stubs for the Rust extension module ``fastseq._core``."""

from collections.abc import Sequence

MAX_IR_VERSION: int
__version__: str

class FastseqError(Exception): ...
class LoadError(FastseqError): ...
class CompositionError(FastseqError): ...
class OpsetMismatchError(CompositionError): ...
class ExportError(FastseqError): ...

def compose_bytes(
    sources: Sequence[bytes | str],
    labels: Sequence[str],
    io_maps: Sequence[Sequence[tuple[str, str]]] | None = None,
    keep_outputs: bool | Sequence[str] | None = None,
    prefixes: Sequence[str | None] | None = None,
    inputs: Sequence[str] | None = None,
    outputs: Sequence[str] | None = None,
    ir_version: int | None = None,
    meta: dict[str, str] | None = None,
    model_version: int | None = None,
) -> bytes: ...
def compose_to_file(
    sources: Sequence[bytes | str],
    labels: Sequence[str],
    path: str,
    io_maps: Sequence[Sequence[tuple[str, str]]] | None = None,
    keep_outputs: bool | Sequence[str] | None = None,
    prefixes: Sequence[str | None] | None = None,
    inputs: Sequence[str] | None = None,
    outputs: Sequence[str] | None = None,
    ir_version: int | None = None,
    meta: dict[str, str] | None = None,
    model_version: int | None = None,
) -> int: ...
def external_data_locations(path: str) -> list[str]: ...
