"""The session's private copy: a composed model written for ONNX Runtime into a folder only
this process uses, by the core's one writer, and the same written on a thread of its own
while the caller does something else."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fastseq import _core


@dataclass
class PrivateCopy:
    """A composed model written for ONNX Runtime into a folder only this process uses (in
    the temporary folder, removed on exit): ``path``. It holds no reference to the model, so
    that a caller can let go of the model's memory while ONNX Runtime builds a session from
    the copy (:func:`fastseq.runtime.session.open_copy`).

    ONNX Runtime gets the model as a file with its weights in a data file beside it, written
    by the core into a private folder (not synced: the page cache) and removed once the
    session exists: ONNX Runtime maps the weights instead of parsing them out of one
    serialized buffer (it starts faster from external data than from inline weights), and
    the session no longer depends on the source files. The weights go from the sources into
    the data file in the kernel (``copy_file_range``, or ``sendfile`` across file systems),
    never through this process's memory; only weights that exist in memory alone are
    written. ``info`` (the core's :class:`fastseq._core.PrivateCopyInfo`) says how many bytes
    each way (``copied``, ``written``) and how many the spilled models map (``mapped``)."""

    folder: str
    path: str
    info: _core.PrivateCopyInfo
    #: with ``spill_min``: copies of the models given that map the copy's data file, or None
    spilled: list[_core.Composed] | None = None

    @classmethod
    def of(cls, models: _core.Composed | Sequence[_core.Composed], spill_min: int | None = None) -> PrivateCopy:
        """Writes the copy of ``models`` (one composed model, or it followed by the models
        that share its memory). Its files are not synced: they
        live in the page cache, which the system can reclaim.

        With ``spill_min``, ``spilled`` holds copies of ``models`` that map the copy's data
        file instead of their sources: always when they still hold weights in the source
        files (a pipeline must not depend on them), and when they hold at least
        ``spill_min`` bytes of weights in memory. The caller swaps them in and lets the
        originals go before ONNX Runtime reads the copy, so the weights count once, not
        twice. The mapping keeps the data file alive, unlinked, once the folder is gone."""
        models = [models] if isinstance(models, _core.Composed) else list(models)
        models[0].check_sources()  # the files still referred to are the ones loaded
        folder = tempfile.mkdtemp(prefix="fastseq-session-")
        try:
            path = os.path.join(folder, "model.onnx")
            info, copies = _core.write_private_copy(models, path, spill_min)
            del models  # the caller decides how long the originals live
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return cls(folder, path, info, copies)

    def take_spilled(self) -> list[_core.Composed] | None:
        """The spilled copies (see :meth:`of`), handed over: the copy keeps no reference."""
        spilled, self.spilled = self.spilled, None
        return spilled

    def __enter__(self) -> PrivateCopy:
        return self

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


class PendingCopy:
    """A private copy (:meth:`PrivateCopy.of`) written on a thread of its own while the
    caller does something else: the core releases the GIL, and the kernel does the copying.
    :meth:`result` waits for it (and raises what writing it raised) and, the first time,
    hands it to ``adopt`` (to swap in its spilled models); :meth:`close` waits and removes
    it."""

    def __init__(
        self, models: Sequence[_core.Composed], spill_min: int | None, adopt: Callable[[PrivateCopy], None]
    ) -> None:
        import threading

        self._args: tuple[list[_core.Composed], int | None] | None = (list(models), spill_min)
        self._adopt: Callable[[PrivateCopy], None] | None = adopt
        self._copy: PrivateCopy | None = None
        self._error: BaseException | None = None
        #: once adopted: the first model spilled onto the copy (it reads the copy's weights), or
        #: None when nothing was spilled (the weights stayed in memory)
        self.mapped: _core.Composed | None = None
        #: the model digest of what the copy holds (read back from the copy's data file on
        #: this thread, beside whatever the caller does meanwhile), or None when nothing was
        #: spilled: weights held in memory cannot have changed since the key read them
        self.digest: str | None = None
        self._thread = threading.Thread(target=self._write, name="fastseq-copy", daemon=True)
        self._thread.start()

    def _write(self) -> None:
        try:
            assert self._args is not None  # set before the thread starts, taken once
            models, spill_min = self._args
            self._args = None  # the caller decides how long the models live
            self._copy = PrivateCopy.of(models, spill_min)
            if self._copy.spilled:
                self.digest = _core.model_digest(self._copy.spilled[0])
        except BaseException as e:  # noqa: BLE001 - raised again by result(), in the caller's thread
            self._error = e

    def result(self) -> PrivateCopy:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._copy is not None
        if self._adopt is not None:
            adopt, self._adopt = self._adopt, None
            self.mapped = self._copy.spilled[0] if self._copy.spilled else None  # before adopt takes them
            adopt(self._copy)
        return self._copy

    def close(self) -> None:
        self._thread.join()
        self.mapped = None
        if self._copy is not None:
            self._copy.__exit__()
