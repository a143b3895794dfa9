"""Writing a composed model to a file, with ``onnx.save``'s keywords (kornia's ``export``
passes its keywords to ``onnx.save``) mapped onto the core's writer.

The core writes one model file, atomically, with its weights inline or in one data file
beside it (``<name>.data``). What it cannot lay out itself (a data file of the caller's
name, one file per tensor, attribute tensors kept inline, a text format with external data)
is written by ``onnx.save`` on a copy of the model into a staging folder that the core
made beside the target; the core then commits it, as it commits every model file: data
files first under names that cannot collide with the user's, the model last. The pipeline
itself is never changed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastseq import _core
from fastseq.errors import ExportError

if TYPE_CHECKING:
    import onnx

#: onnx.save's keywords and their defaults there (onnx 1.16 to 1.23); its size_threshold
#: (1024) is the core's layout's, which fastseq's own writes use.
ONNX_SAVE_DEFAULTS: dict[str, Any] = {
    "format": None,
    "save_as_external_data": False,
    "all_tensors_to_one_file": True,
    "location": None,
    "size_threshold": _core.LAYOUT.threshold,
    "convert_attribute": False,
}


def export(
    composed: _core.Composed,
    file_path: str | os.PathLike[str],
    external_data: bool | None = None,
    **kwargs: Any,
) -> Path:
    """Writes ``composed`` to ``file_path``; see :meth:`fastseq.runtime.runnable.Runnable.export`."""
    unknown = sorted(set(kwargs) - set(ONNX_SAVE_DEFAULTS))
    if unknown:
        raise TypeError(
            f"export() got an unexpected keyword argument '{unknown[0]}' "
            f"(it takes onnx.save's: {', '.join(ONNX_SAVE_DEFAULTS)})"
        )
    target = Path(os.fspath(file_path)).expanduser()
    external = external_data
    if "save_as_external_data" in kwargs:
        asked = bool(kwargs["save_as_external_data"])
        if external_data is not None and bool(external_data) != asked:
            raise TypeError(
                f"export(): external_data={external_data!r} and save_as_external_data={asked!r} disagree; pass one"
            )
        external = asked
    threshold = int(kwargs.get("size_threshold", ONNX_SAVE_DEFAULTS["size_threshold"]))
    if threshold < 0:
        raise ValueError(f"export(): size_threshold must be >= 0, got {threshold}")
    fmt = kwargs.get("format")
    needs_onnx = fmt not in (None, "protobuf") or (
        external
        and (
            kwargs.get("location") is not None
            or not kwargs.get("all_tensors_to_one_file", True)
            # Explicitly False: attribute tensors stay inline, as onnx.save keeps them; the
            # core's writer moves them out with the initializers (convert_attribute=True).
            or kwargs.get("convert_attribute", True) is False
        )
    )
    if not needs_onnx:
        composed.save(str(target), external_data=external, threshold=threshold)
        return target
    # The model as the core writes files (its stage map in its metadata), for onnx.save.
    return _export_with_onnx(composed.for_file(), target, external, threshold, kwargs)


def _export_with_onnx(
    composed: _core.Composed, target: Path, external: bool | None, threshold: int, kwargs: dict[str, Any]
) -> Path:
    import onnx

    location = kwargs.get("location")
    if location is not None and utf8_name(location) != location:
        raise ExportError(f"export(location={location!r}): a location is text in the model, which must be UTF-8")
    if location is not None and not _core.LAYOUT.allows_location(location):  # the loader's rule
        raise ExportError(f"export(location={location!r}): expected a relative path inside {target.parent}")
    if external is None:
        external = composed.encoded_len() >= _core.PROTOBUF_LIMIT
    encode = _encoder(kwargs.get("format"), target)
    if not external:  # a text format with the weights inline: the text is the file
        data = composed.to_bytes()
        _core.commit_bytes(encode(data) if encode else data, str(target))
        return target
    one_file = kwargs.get("all_tensors_to_one_file", True)
    name = utf8_name(target.name)
    with _core.stage(str(target)) as stage, utf8_folder(stage.folder()) as folder:
        try:
            if location is not None:  # onnx.save makes no folder; the core makes it beside the target
                (Path(folder) / location).parent.mkdir(parents=True, exist_ok=True)
            model = _as_proto(composed, Path(folder))
            onnx.save(
                model,
                os.path.join(folder, name),
                format="protobuf",  # the core reads it; `encode` writes the format asked for
                save_as_external_data=True,
                all_tensors_to_one_file=one_file,
                location=(location or _core.LAYOUT.data_file(name)) if one_file else None,
                size_threshold=threshold,
                convert_attribute=bool(kwargs.get("convert_attribute", False)),
            )
        except (OSError, ValueError, RuntimeError, onnx.checker.ValidationError) as e:
            raise ExportError(f"cannot write {target}: {e}") from e
        del model
        stage.commit(name, encode=encode)
    return target


def utf8_name(name: str) -> str:
    """A file name as other programs' bindings take it (onnx's and ONNX Runtime's take UTF-8
    only), and as an external data ``location`` must be (a protobuf string): a name that is
    not UTF-8 (``b"\\xff.onnx"``) gets U+FFFD for its bad bytes, as the core names it."""
    return os.fsencode(name).decode("utf-8", "replace")


@contextlib.contextmanager
def utf8_folder(folder: Path) -> Iterator[str]:
    """``folder`` as a path other programs' bindings take: itself, or, when its path is not
    UTF-8 (a parent named ``b"\\xff"``), ``/proc/self/fd/N`` of it held open meanwhile."""
    text = str(folder)
    if utf8_name(text) == text or not os.path.isdir("/proc/self/fd"):
        yield text
        return
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _encoder(fmt: str | None, target: Path) -> Callable[[bytes], bytes] | None:
    """What turns the model's protobuf bytes into ``fmt`` (as ``onnx.save`` reads it, from
    the file's extension when not given), or None for protobuf itself."""
    from onnx import ModelProto, serialization

    fmt = fmt or serialization.registry.get_format_from_file_extension(target.suffix) or "protobuf"
    try:
        serializer = serialization.registry.get(fmt)
    except ValueError as e:
        raise ExportError(f"cannot write {target}: {e}") from e
    if fmt == "protobuf":
        return None
    return lambda data: serializer.serialize_proto(ModelProto.FromString(data))


def _as_proto(composed: _core.Composed, staging: Path) -> onnx.ModelProto:
    """A fresh ``onnx.ModelProto`` of ``composed``. Over the protobuf limit it cannot come
    from bytes: the core writes it with external data first, and onnx loads that back."""
    import onnx

    if composed.encoded_len() < _core.PROTOBUF_LIMIT:
        return onnx.ModelProto.FromString(composed.to_bytes())
    scratch = staging / ".core"
    scratch.mkdir()
    path = scratch / "model.onnx"
    composed.save(str(path), external_data=True)
    return onnx.load(str(path), load_external_data=True)
