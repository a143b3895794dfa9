"""int8 exports through onnxruntime.quantization.

The model is first put through ONNX Runtime's own pre-processing (``quant_pre_process``:
symbolic shape inference and graph optimisation, which the quantizer needs to know tensor
shapes), then quantized: dynamically (weights int8, activations quantized at run time; no
data needed), or statically from calibration data (activations' ranges measured on real
inputs, in QDQ or QOperator form). Every step writes into a staging folder that the core
makes beside the output; the core then commits the result as it commits every model file
(its data file first, under a name that cannot collide with the user's, the model last): a
failure leaves no half-written file and no file of the user's is overwritten. Models above
2 GB keep their weights in a data file beside the output (protobuf's limit).

onnxruntime is imported only when a quantization runs."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Union, cast

from fastseq.errors import ConversionError, InputError, human_size
from fastseq.ops.operator import Operator

if TYPE_CHECKING:
    import numpy as np
    import onnx

#: Calibration data: a folder of ``.npy`` files (one batch each, for a single-input model)
#: or ``.npz`` files (one array per input name), or batches given directly: arrays (single
#: input) or mappings from input name to array.
Calibration = Union[str, "os.PathLike[str]", Iterable[Union["np.ndarray", Mapping[str, "np.ndarray"]]]]

_LIMIT = 2**31 - 1  # protobuf's 2 GB limit on one serialized model


@dataclass(frozen=True)
class QuantizeResult:
    """What :func:`quantize` wrote: the model, its data file (if the weights are external),
    and the sizes before and after (bytes, model and data file together)."""

    path: Path
    data_file: Path | None
    size_before: int
    size_after: int

    def __str__(self) -> str:
        return (
            f"{self.path} ({human_size(self.size_after)}, from {human_size(self.size_before)}: "
            f"{self.size_after / max(self.size_before, 1):.2f}x)"
        )


def quantize(
    model: str | os.PathLike[str] | bytes | onnx.ModelProto,
    output: str | os.PathLike[str],
    *,
    static: bool = False,
    calibration: Calibration | None = None,
    per_channel: bool = False,
    format: Literal["qdq", "qoperator"] | None = None,
    preprocess: bool = True,
    progress: bool | None = None,
    label: str | None = None,
) -> QuantizeResult:
    """Writes an int8 version of ``model`` (a path, an ``http(s)://`` URL, an ``hf://`` id,
    ``builtin:NAME``, bytes or an ``onnx.ModelProto``) to ``output`` and returns what was
    written.

    Without ``static`` the quantization is dynamic: weights become int8, activations are
    quantized at run time (ONNX Runtime's integer MatMul/Conv operators; ``format`` can only
    be ``"qoperator"``). With ``static=True``, ``calibration`` (a folder of ``.npy``/``.npz``
    files or an iterable of batches) sets the activation ranges, and ``format`` chooses
    QDQ (QuantizeLinear/DequantizeLinear pairs around float operators, the default) or
    QOperator (integer operators). ``per_channel`` quantizes weights per output channel
    (more accurate for convolutions). ``preprocess`` runs ONNX Runtime's
    ``quant_pre_process`` first, as its documentation asks. ``progress`` shows a bar over
    the calibration batches (default: when stderr is a terminal).
    """
    import onnx
    from onnxruntime import quantization as q

    kind = format.lower() if isinstance(format, str) else format
    if kind not in (None, "qdq", "qoperator"):
        raise InputError(f"format must be 'qdq' or 'qoperator', got {format!r}")
    if not static and kind == "qdq":
        raise InputError(
            "format='qdq' needs static=True and calibration data: dynamic quantization has only "
            "the QOperator form (activations are quantized at run time, inside the operators)"
        )
    if static and calibration is None:
        raise InputError("static=True needs calibration data: a folder of .npy/.npz files or an iterable of batches")
    if not static and calibration is not None:
        raise InputError("calibration data is only used with static=True (dynamic quantization needs none)")

    target = Path(output).expanduser()
    if not target.parent.is_dir():
        raise InputError(f"cannot write {target}: the folder {target.parent} does not exist")
    name = label or (Path(os.fspath(model)).name if isinstance(model, (str, os.PathLike)) else "model")
    if isinstance(model, str) and model.startswith(("hf://", "http://", "https://", "builtin:")):
        from fastseq.sources import resolve as loader

        resolved = loader.resolve(model, 0).data  # downloaded into the cache; a local path
        model = cast("str | bytes", resolved[0] if isinstance(resolved, tuple) else resolved)
    from fastseq import _core
    from fastseq.runtime.export import utf8_folder, utf8_name

    staged_name = utf8_name(target.name)  # ONNX Runtime's quantizer takes UTF-8 paths only
    with _core.stage(str(target)) as stage, utf8_folder(stage.folder()) as folder:
        work = Path(folder)
        source, size_before = _as_file(model, work)
        big = size_before > _LIMIT
        current = source
        if preprocess:
            current = _preprocess(q, source, work / "pre.onnx", big, name)
        quantized = work / "out" / staged_name  # beside the inputs' files, whatever the target's name
        quantized.parent.mkdir()
        try:
            if static:
                assert calibration is not None  # refused above without it
                reader = _Reader(calibration, _input_names(onnx, current), progress, name)
                qdq = kind in (None, "qdq")
                run = dict(
                    quant_format=q.QuantFormat.QDQ if qdq else q.QuantFormat.QOperator,
                    per_channel=per_channel,
                    use_external_data_format=big,
                )
                try:
                    q.quantize_static(str(current), str(quantized), reader, **run)
                except ValueError as e:
                    # onnxruntime's int32-bias scale adjustment compares a per-channel
                    # array as a scalar (Gemm/Conv with a bias, per_channel=True); its QDQ
                    # quantizer can skip that step, its QOperator one cannot.
                    if not (per_channel and qdq and "truth value of an array" in str(e)):
                        raise
                    reader.rewind()
                    q.quantize_static(
                        str(current),
                        str(quantized),
                        reader,
                        **run,
                        extra_options={"QDQDisableWeightAdjustForInt32Bias": True},
                    )
            else:
                q.quantize_dynamic(str(current), str(quantized), per_channel=per_channel, use_external_data_format=big)
        except (InputError, ConversionError):
            raise
        except Exception as e:  # the quantizer raises whatever its passes raise
            hint = ""
            if per_channel and static and kind == "qoperator":
                hint = (
                    " (onnxruntime quantizes per channel reliably only in QDQ form: format='qdq' or "
                    "per_channel=False may avoid this)"
                )
            raise ConversionError(f"{name}: quantization failed: {_first_line(e)}{hint}") from e
        written = stage.commit(f"out/{staged_name}")
    data_files = written.data_files
    return QuantizeResult(
        target,
        target.parent / data_files[0] if data_files else None,
        size_before,
        written.model_bytes + written.data_bytes,
    )


def quantize_composed(composed: Any, output: str | os.PathLike[str], label: str, **options: Any) -> QuantizeResult:
    """:func:`quantize` for a composed model held by the core (what ``pipe.quantize`` calls):
    it is written into a staging folder beside the output first (weights external above 2 GB)."""
    from fastseq import _core

    target = Path(output).expanduser()
    if not target.parent.is_dir():
        raise InputError(f"cannot write {target}: the folder {target.parent} does not exist")
    from fastseq.runtime.export import utf8_folder

    with _core.stage(str(target)) as stage, utf8_folder(stage.folder()) as folder:
        source = Path(folder) / "pipeline.onnx"
        composed.save(str(source), external_data=None)
        return quantize(source, target, label=label, **options)


def _as_file(model: Any, work: Path) -> tuple[Path, int]:
    """``model`` as a file the quantizer can read, and its size with external data."""
    import onnx

    if isinstance(model, (str, os.PathLike)):
        path = Path(os.fspath(model)).expanduser()
        if not path.is_file():
            from fastseq.sources.resolve import no_such_file

            raise InputError(no_such_file(path))
        return path, _size_with_data(path)
    path = work / "in.onnx"
    if isinstance(model, onnx.ModelProto):
        big = model.ByteSize() > _LIMIT
        onnx.save(model, path, save_as_external_data=big, location="in.onnx.data")
    elif isinstance(model, (Operator, bytes, bytearray, memoryview)):
        path.write_bytes(bytes(model))
    else:
        raise TypeError(f"expected a path, bytes, an onnx.ModelProto or an operator, got {type(model).__name__}")
    return path, _size_with_data(path)


def _size_with_data(path: Path) -> int:
    """The model file plus the external data files it names."""
    from fastseq import _core

    total = 0
    # Opened through the core: a FIFO or a device (the model or its data) is a LoadError
    # naming it here, never a quantizer waiting on it for ever.
    for file in [path, *(path.parent / loc for loc in set(_core.external_data_locations(str(path))))]:
        try:
            fd = _core.open_input(file)
        except FileNotFoundError:
            continue  # a missing data file: the quantizer says so
        try:
            total += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return total


def _preprocess(q: Any, source: Path, out: Path, big: bool, name: str) -> Path:
    """ONNX Runtime's pre-processing; symbolic shape inference is dropped for models it
    cannot follow (ai.onnx.ml operators, for one), as its documentation suggests."""
    kwargs = dict(
        save_as_external_data=big,
        all_tensors_to_one_file=True,
        external_data_location=out.name + ".data" if big else None,
    )
    try:
        with _no_litter():
            q.quant_pre_process(str(source), str(out), **kwargs)
    except Exception:  # noqa: BLE001  (symbolic shape inference fails on some valid models)
        try:
            q.quant_pre_process(str(source), str(out), skip_symbolic_shape=True, **kwargs)
        except Exception as e:
            raise ConversionError(
                f"{name}: ONNX Runtime's quantization pre-processing (quant_pre_process) failed: {_first_line(e)}; "
                "preprocess=False skips it"
            ) from e
    return out


_LITTER = "sym_shape_infer_temp"
_litter_lock = threading.Lock()


@contextmanager
def _no_litter() -> Iterator[None]:
    """When symbolic shape inference gives up, onnxruntime saves what it got to
    ``sym_shape_infer_temp.onnx`` in the current folder (the user's, not ours): remove what
    it leaves there. The lock keeps two quantizations in one process from removing each
    other's file while the other is reading it."""
    with _litter_lock:
        before = {p.name for p in Path.cwd().glob(_LITTER + "*")}
        try:
            yield
        finally:
            for p in Path.cwd().glob(_LITTER + "*"):
                if p.name not in before:
                    p.unlink(missing_ok=True)


def _input_names(onnx: Any, path: Path) -> list[str]:
    model = onnx.load(str(path), load_external_data=False)
    weights = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in weights]


class _Reader:
    """onnxruntime's CalibrationDataReader over ``calibration``, with a progress bar."""

    def __init__(self, calibration: Calibration, inputs: list[str], progress: bool | None, name: str) -> None:
        import sys

        self._batches = _batches(calibration, inputs, name)
        total = len(self._batches) if isinstance(self._batches, list) else None
        show = sys.stderr.isatty() if progress is None else progress
        self._bar = _bar(total, f"calibrating {name}", show)
        self._iter: Iterator[dict[str, np.ndarray]] = iter(self._batches)
        self.count = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        batch = next(self._iter, None)
        if batch is None:
            self._bar.close()
            return None
        self.count += 1
        self._bar.update(1)
        return batch

    def rewind(self) -> None:  # some calibrators read twice
        if not isinstance(self._batches, list):
            raise ConversionError(
                "this quantization reads the calibration data twice: pass a folder or a list, not a one-pass iterator"
            )
        self._iter = iter(self._batches)


def _bar(total: int | None, desc: str, show: bool) -> Any:
    """A tqdm bar (tqdm comes with huggingface_hub); a silent stand-in without it."""
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency of huggingface_hub
        show = False
    if not show:

        class _Silent:
            def update(self, n: int) -> None:
                pass

            def close(self) -> None:
                pass

        return _Silent()
    return tqdm(total=total, desc=desc, unit="batch")


def _batches(
    calibration: Calibration, inputs: list[str], name: str
) -> list[dict[str, np.ndarray]] | Iterator[dict[str, np.ndarray]]:
    """Calibration batches as feeds ``{input name: array}``, checked against ``inputs``."""
    import numpy as np

    def feed(item: Any, where: str) -> dict[str, np.ndarray]:
        if isinstance(item, Mapping):
            got = {str(k): np.asarray(v) for k, v in item.items()}
            if set(got) != set(inputs):
                raise InputError(
                    f"{where}: calibration batch has inputs {sorted(got)}, the model {name} takes {inputs}"
                )
            return got
        if len(inputs) != 1:
            raise InputError(
                f"{where}: the model {name} has {len(inputs)} inputs ({', '.join(inputs)}): give each batch as "
                ".npz files or mappings with one array per input name"
            )
        return {inputs[0]: np.asarray(item)}

    if isinstance(calibration, (str, os.PathLike)):
        folder = Path(os.fspath(calibration)).expanduser()
        if not folder.is_dir():
            raise InputError(f"calibration: {folder} is not a folder of .npy/.npz files")
        files = sorted(p for p in folder.iterdir() if p.suffix in (".npy", ".npz"))
        if not files:
            raise InputError(f"calibration: {folder} holds no .npy or .npz file")
        from fastseq import _core
        from fastseq.errors import LoadError

        out = []
        for f in files:
            try:  # the core's open: a FIFO named x.npy is refused, never waited on
                handle = os.fdopen(_core.open_input(f), "rb")
            except (OSError, LoadError) as e:
                raise InputError(f"calibration: {f}: cannot be read: {getattr(e, 'strerror', None) or e}") from None
            with handle:
                if f.suffix == ".npy":
                    out.append(feed(np.load(handle, allow_pickle=False), str(f)))
                else:
                    with np.load(handle, allow_pickle=False) as z:
                        out.append(feed({k: z[k] for k in z.files}, str(f)))
        return out
    if isinstance(calibration, (list, tuple)):
        if not calibration:
            raise InputError("calibration: no batches given")
        return [feed(item, f"calibration batch {i}") for i, item in enumerate(calibration)]
    return (feed(item, f"calibration batch {i}") for i, item in enumerate(calibration))


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
