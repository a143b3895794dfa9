"""A Ray dataset's columns as a pipeline's inputs (for :mod:`fastseq.ray`):
which column feeds which input, rows stacked and checked by the runtime's one input rule
(:mod:`fastseq.runtime.inputs`: a column converts to its input's dtype where no value
changes), and the pipeline called on the whole batch, N rows or one row at a time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from fastseq import _core
from fastseq.errors import InputError
from fastseq.runtime import inputs as rule

if TYPE_CHECKING:
    from fastseq.runtime.runnable import Runnable
    from fastseq.runtime.tensors import TensorInfo


def map_hint(input_name: str) -> str:
    return f" (map another column with input_columns={{'{input_name}': 'COLUMN'}})"


def routes(
    inputs: Sequence[TensorInfo],
    outputs: Sequence[TensorInfo],
    input_columns: Mapping[str, str] | None,
    output_columns: Mapping[str, str] | Sequence[str] | None,
) -> tuple[dict[str, str], dict[str, str]]:
    """{input: column} and {output: column}, the user's names checked against the model's."""
    in_names = [i.name for i in inputs]
    out_names = [o.name for o in outputs]
    for name in input_columns or {}:
        if name not in in_names:
            raise InputError(
                f"input_columns names '{name}', which is not an input{_core.did_you_mean(name, in_names)}; "
                f"inputs: {', '.join(in_names)}"
            )
    if output_columns is None:
        renamed = {n: n for n in out_names}
    elif isinstance(output_columns, Mapping):
        renamed = {n: n for n in out_names} | dict(output_columns)
    else:
        renamed = {n: n for n in output_columns}
    for name in renamed:
        if name not in out_names:
            raise InputError(
                f"output_columns names '{name}', which is not an output{_core.did_you_mean(name, out_names)}; "
                f"outputs: {', '.join(out_names)}"
            )
    return {n: (input_columns or {}).get(n, n) for n in in_names}, renamed


def as_columns(batch: Any) -> dict[str, np.ndarray]:
    """A batch's columns as numpy arrays of rows (an InputError for a value with no rows)."""
    if isinstance(batch, Mapping):
        columns = {}
        for k, v in batch.items():
            if not isinstance(v, np.ndarray):
                try:
                    v = np.asarray(v)
                except (ValueError, TypeError) as e:
                    raise InputError(f"column '{k}' cannot be read as rows: {e}") from None
            if v.ndim == 0:
                raise InputError(f"column '{k}' holds a {type(batch[k]).__name__}, not rows (an array or a list)")
            columns[k] = v
        return columns
    # pandas DataFrame or pyarrow Table: Ray's own conversion (tensor columns become arrays)
    from ray.data.block import BlockAccessor

    return dict(BlockAccessor.for_block(batch).to_batch_format("numpy"))


def batch_len(columns: Mapping[str, np.ndarray]) -> int:
    return len(next(iter(columns.values()))) if columns else 0


def rows_text(lo: int, hi: int) -> str:
    return f"row {lo}" if hi - lo == 1 else f"rows {lo}-{hi - 1}"


def stack(values: np.ndarray, column: str, info: Any, label: str) -> np.ndarray:
    """The column as one array with the rows on axis 0, checked against the input."""
    rows = len(values)
    where = f"{label}: column '{column}' ({rows_text(0, rows)} of the batch)"
    if values.dtype == object and rows and isinstance(values[0], np.ndarray):
        first = values[0].shape
        for i, row in enumerate(values):
            if np.shape(row) != first:
                raise InputError(
                    f"{label}: column '{column}' (row {i} of the batch) has shape {list(np.shape(row))} where "
                    f"row 0 has {list(first)}: rows stacked for input '{info.name}' must share a shape"
                )
        values = np.stack(list(values))
    if not rule.converts(info.dtype, values.dtype):
        raise _refused(where, values.dtype, info)
    check_row_shape(info, values.shape[1:], where)
    return values


def _refused(where: str, got: np.dtype, info: Any) -> InputError:
    """A column of a dtype that its input does not take (the runtime's one input rule)."""
    return InputError(
        f"{where} holds {got}, input '{info.name}' expects {info.dtype}, which {got} does not convert to "
        "without changing values (convert the column first if that is meant: fastseq converts only where no "
        "value changes, and does not change what a pipeline computes)"
    )


def check_row_shape(info: Any, row: tuple[int | None, ...], where: str) -> None:
    """A row of shape ``row`` (None: a dimension that varies) fits an input with a batch
    axis (rank + 1) or without one."""
    if info.shape is None:
        return
    want = list(info.shape)
    if len(want) == len(row) + 1:
        dims = want[1:]
    elif len(want) == len(row):
        dims = want
    else:
        raise InputError(
            f"{where} has rows of shape {list(row)}; input '{info.name}' expects {want} "
            f"(rows of rank {len(want) - 1}, stacked on its batch axis)"
        )
    for got, need in zip(row, dims):
        if isinstance(need, int) and need > 0 and isinstance(got, int) and got != need:
            raise InputError(f"{where} has rows of shape {list(row)}; input '{info.name}' expects {want}")


def run_rows(
    pipe: Runnable,
    feeds: Mapping[str, np.ndarray],
    inputs: Sequence[TensorInfo],
    rows: int,
    outputs: Sequence[TensorInfo],
    label: str,
) -> list[np.ndarray]:
    """Calls the pipeline on the whole batch when its batch axis is dynamic, N rows at a
    time when it is fixed at N, and row by row when the input has no batch axis."""
    output_names = [o.name for o in outputs]
    step: int | None = None  # the fixed batch size, None when dynamic
    batched = True
    for info in inputs:
        value = feeds[info.name]
        if info.shape is None:
            continue
        if len(info.shape) == value.ndim - 1:
            batched = False
        elif info.shape and isinstance(info.shape[0], int) and info.shape[0] > 0:
            step = info.shape[0] if step is None else min(step, info.shape[0])
    if batched and step is None:
        return pipe.run(feeds, output_names)
    step = step if batched and step is not None else 1  # (batched with no step returned above)
    if rows == 0:  # nothing to call a fixed-size pipeline with: empty output columns
        empty = []
        for o in outputs:
            row = list(o.shape or ())[1 if batched else 0 :]
            empty.append(np.empty([0] + [d if isinstance(d, int) else 0 for d in row], o.dtype))
        return empty
    if rows % step:
        raise InputError(
            f"{label}: the pipeline takes batches of exactly {step} rows; this batch has {rows} "
            f"(pass batch_size={step} or a multiple of it)"
        )
    parts = []
    for lo in range(0, rows, step):
        if batched:
            parts.append(pipe.run({k: v[lo : lo + step] for k, v in feeds.items()}, output_names))
        else:
            parts.append([o[None] for o in pipe.run({k: v[lo] for k, v in feeds.items()}, output_names)])
    return [np.concatenate(outs) for outs in zip(*parts)] if parts else []


def check_schema(
    ds: Any,
    shipped: Any,
    input_columns: Mapping[str, str] | None = None,
    output_columns: Mapping[str, str] | Sequence[str] | None = None,
    drop_columns: bool = False,
) -> None:
    """Checks in the driver, before any actor starts, that the dataset has a column for each
    input with a dtype and row shape the pipeline takes, and no column an output would
    replace (when Ray knows the schema)."""
    if shipped.inputs is None:
        return
    columns, renamed = routes(shipped.inputs, shipped.outputs, input_columns, output_columns)
    schema = ds.schema()
    if schema is None:
        return
    names = list(schema.names)
    for output, column in renamed.items():
        if not drop_columns and column in names:
            raise InputError(
                f"{shipped.label}: output '{output}' would replace the column '{column}'; "
                f"name it with output_columns={{'{output}': 'NEW'}} or pass drop_columns=True"
            )
    for info in shipped.inputs:
        column = columns[info.name]
        if column not in names:
            raise InputError(
                f"{shipped.label}: input '{info.name}' reads the column '{column}', which the dataset "
                f"lacks{_core.did_you_mean(column, names)}; columns: {', '.join(names)}" + map_hint(info.name)
            )
        dtype, row = column_type(schema.types[names.index(column)])
        where = f"{shipped.label}: column '{column}' (all rows)"
        if dtype is not None and not rule.converts(info.dtype, dtype):
            raise _refused(where, dtype, info)
        if row is not None:
            check_row_shape(info, row, where)


def column_type(arrow_type: Any) -> tuple[np.dtype | None, tuple[int, ...] | None]:
    """(numpy dtype, row shape) of a dataset column's type, None where Ray does not say
    (variable-shaped tensors have no fixed row shape)."""
    import pyarrow as pa

    shape = getattr(arrow_type, "shape", None)
    try:
        if shape is not None:  # Ray's tensor extension types (variable dimensions are None)
            scalar = getattr(arrow_type, "value_type", None) or getattr(arrow_type, "scalar_type", None)
            return (np.dtype(scalar.to_pandas_dtype()) if scalar is not None else None), tuple(shape)
        if isinstance(arrow_type, pa.DataType):
            if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
                return np.dtype(object), ()
            if pa.types.is_primitive(arrow_type):
                return np.dtype(arrow_type.to_pandas_dtype()), ()
            return None, None
        return np.dtype(arrow_type), ()  # a pandas block's numpy dtype
    except (TypeError, NotImplementedError):
        return None, None
