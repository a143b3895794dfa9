"""The session cache's folder, as ssh and pip treat their own: used only when it is the
user's own and nobody else can write to it, opened without following links, marked as a
fastseq cache when fastseq makes it, and emptied only of what fastseq put there.

Every operation goes through descriptors (``dir_fd``, ``O_NOFOLLOW``), so that renaming a
folder or planting a link between a check and a use cannot redirect it. Paths handed to
other code (the digest, ONNX Runtime) name files through ``/proc/self/fd/N/`` of a folder
this process holds open, for the same reason.

Layout::

    <root>/CACHEDIR.TAG          the mark (the Cache Directory Tagging Specification's tag,
                                 which backup tools skip, with a line naming fastseq); locked
                                 while entries are added or removed
    <root>/<32 hex>/             an entry: model.onnx, model.data, manifest.json, usage
    <root>/.tmp-<pid>-<12 hex>/  an entry being built, or links for a load; locked by its maker
    <root>/.tmp-<pid>-<12 hex>   the tag being written; locked by its maker
    <root>/.del-<12 hex>/        an entry being removed (renamed aside first)
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MODEL, DATA, MANIFEST, USAGE = "model.onnx", "model.data", "manifest.json", "usage"
#: The only names an entry (or a temporary folder) holds; anything else is not fastseq's.
FILES = frozenset((MODEL, DATA, MANIFEST, USAGE))
TAG = "CACHEDIR.TAG"
TAG_TEXT = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file is a cache directory tag created by fastseq for its session cache.\n"
    "# For information about cache directory tags, see https://bford.info/cachedir/\n"
)
ENTRY = re.compile(r"[0-9a-f]{32}")
TEMP = re.compile(r"\.(?:tmp-[0-9]+|del)-[0-9a-f]{12}")
#: A temporary folder or file whose lock is free is its maker's no more (killed, or done).
#: It goes at once when its maker's pid no longer runs; while that pid runs, the maker may be
#: in the instant between creating it and its ``flock`` (or the pid is another process's now:
#: they cannot be told apart), and it goes once this old. The age never covers the maker's
#: life: the lock does that.
STALE_S = 10.0

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO planted under a file's name returns at once instead of hanging.
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_PROC = os.path.isdir("/proc/self/fd")


class Refused(Exception):
    """A folder or file the cache must not use: a link, not a regular file, another user's,
    or writable by others. The message says which and why."""


def check_own(st: os.stat_result, what: str) -> None:
    """Refuses what another user owns or could write to (as ssh's StrictModes does)."""
    if st.st_uid != os.geteuid():
        raise Refused(f"{what} is owned by another user (uid {st.st_uid})")
    if st.st_mode & 0o022:
        who = " and ".join(w for bit, w in ((0o020, "its group"), (0o002, "others")) if st.st_mode & bit)
        raise Refused(f"{what} is writable by {who} (mode {stat.S_IMODE(st.st_mode):o})")


def open_dir(name: str | os.PathLike[str], what: str, dir_fd: int | None = None) -> int:
    """A folder's descriptor, never through a link (a link is Refused)."""
    try:
        return os.open(name, _DIR, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Refused(f"{what} is not a folder (a link or a file)") from None
        raise


def open_file(dir_fd: int, name: str, what: str) -> tuple[int, os.stat_result]:
    """A regular file of ours, opened read-only without following links."""
    try:
        fd = os.open(name, _FILE, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Refused(f"{what} is a link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{what} is not a regular file")
        check_own(st, what)
        return fd, st
    except BaseException:
        os.close(fd)
        raise


def read_file(dir_fd: int, name: str, what: str, limit: int) -> bytes:
    fd, st = open_file(dir_fd, name, what)
    try:
        if st.st_size > limit:
            raise Refused(f"{what} is larger than any fastseq writes ({st.st_size} bytes)")
        os.set_blocking(fd, True)
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(limit + 1)
    finally:
        os.close(fd)


def write_file(dir_fd: int, name: str, data: bytes, lock: bool = False) -> None:
    """A new private file (never an existing one, never through a link), synced; with
    ``lock``, ``flock``ed while it is written (a temporary file, see :meth:`Root.sweep`)."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        if lock:
            fcntl.flock(fd, fcntl.LOCK_EX)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def try_lock(fd: int, shared: bool = False) -> bool:
    """flock without waiting: False when another holds it."""
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        return True
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES, errno.EBADF, errno.ENOLCK):
            return False
        raise


def is_ours(name: str) -> bool:
    return name == TAG or bool(ENTRY.fullmatch(name) or TEMP.fullmatch(name))


class Folder:
    """A private folder held open: files in it are named through the descriptor."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self.fd = path, fd

    def name(self, file: str) -> str:
        """A path to ``file`` that resolves through this descriptor, not through the
        folder's path (which another program could rename)."""
        return f"/proc/self/fd/{self.fd}/{file}" if _PROC else str(self.path / file)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Temp(Folder):
    """A temporary folder in the cache root (``.tmp-<pid>-<hex>``), locked while it is used."""

    def __init__(self, path: Path, fd: int, parent_fd: int) -> None:
        super().__init__(path, fd)
        self._parent_fd = parent_fd

    def remove(self) -> None:
        """Removes what it holds of fastseq's names, then the folder."""
        if self.fd < 0:
            return
        try:
            _empty(self.fd)
            os.rmdir(self.path.name, dir_fd=self._parent_fd)
        except OSError:
            pass  # something not ours is in it, or it is gone: left as it is
        self.close()

    def __enter__(self) -> Temp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _empty(fd: int) -> None:
    for name in os.listdir(fd):
        if name in FILES:
            try:
                os.unlink(name, dir_fd=fd)
            except OSError:
                pass


class Root(Folder):
    """A cache root, opened and checked (see :meth:`open`)."""

    @classmethod
    def open(cls, path: Path, create: bool, adopt: bool = True) -> Root:
        """Opens the cache at ``path``: the user's own, not writable by others, not a link,
        and marked as a fastseq cache. With ``create``, a missing folder is made (0700) and
        marked; with ``adopt``, an unmarked folder that holds nothing but fastseq's own names
        (an empty one, or a cache of an earlier fastseq) is marked too.

        Raises FileNotFoundError (no folder there), Refused, or OSError."""
        made = False
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(path, 0o700)
                made = True
            except FileExistsError:
                pass
        what = f"session cache {path}"
        fd = open_dir(path, what)
        try:
            check_own(os.fstat(fd), what)
            if not _tagged(fd):
                names = os.listdir(fd)
                if TAG not in names and (made or (adopt and all(is_ours(n) for n in names))):
                    _mark(fd)
                if not _tagged(fd):  # (a tag that another process has just put in place is whole)
                    raise Refused(f"{path} is not a fastseq session cache (it has no {TAG} written by fastseq)")
            return cls(path, fd)
        except BaseException:
            os.close(fd)
            raise

    def __enter__(self) -> Root:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Held while entries are added or removed, so that two processes making room at
        once do not both remove entries for the same space (a lock on the mark itself)."""
        fd, _ = open_file(self.fd, TAG, TAG)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def temp(self) -> Temp:
        """A new locked temporary folder in the root (0700). A sweep that takes its maker for
        dead (a pid of another pid namespace or machine sharing the folder) may remove it
        before it is locked: it is still named once locked, or another is made."""
        for _ in range(_TRIES):
            name = f".tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}"
            os.mkdir(name, 0o700, dir_fd=self.fd)
            try:
                fd = open_dir(name, name, dir_fd=self.fd)
            except FileNotFoundError:
                continue
            fcntl.flock(fd, fcntl.LOCK_EX)
            if self._is_named(name, fd):
                return Temp(self.path / name, fd, self.fd)
            os.close(fd)
        raise OSError(errno.EAGAIN, f"{_TRIES} temporary folders were removed as soon as they were made")

    def open_entry(self, key: str) -> int | None:
        """The entry's folder, locked shared (so that nobody removes it while it is read), or
        None when there is none or it is being removed. Refused for a link or a file."""
        try:
            fd = open_dir(key, f"session cache entry {self.path / key}", dir_fd=self.fd)
        except FileNotFoundError:
            return None
        try:
            if try_lock(fd, shared=True) and self._is_named(key, fd):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        return None

    def _is_named(self, name: str, fd: int) -> bool:
        """Whether ``name`` still names the folder held as ``fd`` (a remover renames an entry
        aside before it empties it)."""
        try:
            st, held = os.stat(name, dir_fd=self.fd, follow_symlinks=False), os.fstat(fd)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)

    def entry_names(self) -> list[str]:
        return sorted(n for n in os.listdir(self.fd) if ENTRY.fullmatch(n))

    def others(self) -> list[str]:
        """What the root holds that fastseq did not make."""
        return sorted(n for n in os.listdir(self.fd) if not is_ours(n))

    def remove_entry(self, key: str, dry_run: bool = False) -> bool:
        """Removes the entry ``key`` when it is recognisably fastseq's (a real folder of ours
        holding a manifest and nothing but an entry's files) and nobody is reading it; renamed
        aside first, so that no reader sees it half-removed. Returns whether it was (or, with
        ``dry_run``, would be) removed."""
        try:
            fd = open_dir(key, key, dir_fd=self.fd)
        except (OSError, Refused):
            return False
        try:
            return self._remove(key, fd, dry_run)
        except OSError:
            return False  # removed by another process meanwhile, or not removable: kept
        finally:
            os.close(fd)

    def _remove(self, key: str, fd: int, dry_run: bool) -> bool:
        if not self._is_named(key, fd) or os.fstat(fd).st_uid != os.geteuid():
            return False
        names = set(os.listdir(fd))
        if MANIFEST not in names or not names <= FILES:
            return False
        if not try_lock(fd):
            return False  # being read: left for a later pass
        if dry_run:
            return True
        aside = f".del-{uuid.uuid4().hex[:12]}"
        os.rename(key, aside, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        _empty(fd)
        try:
            os.rmdir(aside, dir_fd=self.fd)
        except OSError:
            pass  # something not ours appeared in it: left as it is
        return True

    def sweep(self, now: float | None = None, dry_run: bool = False) -> list[str]:
        """Removes the temporary folders and files (a tag being written) that no live
        process holds: their lock is free (their maker was killed, or a full disk stopped
        it), and their maker no longer runs or they are :data:`STALE_S` old; returns their
        names."""
        now = time.time() if now is None else now
        removed = []
        for name in os.listdir(self.fd):
            if not TEMP.fullmatch(name):
                continue
            try:
                st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
                folder = stat.S_ISDIR(st.st_mode)
                if not (folder or stat.S_ISREG(st.st_mode)) or st.st_uid != os.geteuid():
                    continue
                if now - st.st_mtime < STALE_S and not _maker_gone(name):
                    continue
                fd = open_dir(name, name, dir_fd=self.fd) if folder else open_file(self.fd, name, name)[0]
            except (OSError, Refused):
                continue
            try:
                # Still named so once locked: a maker that sealed it (renamed it to an entry's
                # name) and let go of it in between has made it an entry, not a leftover.
                if not try_lock(fd) or not self._is_named(name, fd) or (folder and not set(os.listdir(fd)) <= FILES):
                    continue
                if not dry_run:
                    if folder:
                        _empty(fd)
                        os.rmdir(name, dir_fd=self.fd)
                    else:
                        os.unlink(name, dir_fd=self.fd)
                removed.append(name)
            except OSError:
                continue
            finally:
                os.close(fd)
        return removed


#: How many temporary names a maker tries when each is swept before it locks it.
_TRIES = 8


def _maker_gone(name: str) -> bool:
    """Whether the maker of a temporary name whose lock is free is surely gone: a ``.del-``
    folder's remover locks the entry before it renames it (no instant without the lock), and
    a ``.tmp-<pid>-`` one's pid no longer runs here. A running pid may be the maker about to
    lock it, or another process that got the pid since: not gone."""
    if name.startswith(".del-"):
        return True
    pid = int(name.split("-")[1])
    if pid <= 0:  # kill(0) would signal a process group: not a maker's pid
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):  # another user's process (EPERM), or no pid at all
        return False
    return False


def _mark(fd: int) -> None:
    """Writes the tag whole, then renames it into place: a process opening the root at the
    same moment never reads half of it (two that mark it at once write the same bytes). Its
    temporary file is locked while it is written (a sweep leaves it) and removed when the
    write fails (a full disk)."""
    temp = f".tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    try:
        write_file(fd, temp, TAG_TEXT.encode(), lock=True)
        os.rename(temp, TAG, src_dir_fd=fd, dst_dir_fd=fd)
    except FileNotFoundError:
        # Swept before it was locked, by a process that took its maker for dead (another pid
        # namespace): that process had opened the root, so a tag is in place (Root.open checks).
        return
    except BaseException:
        try:
            os.unlink(temp, dir_fd=fd)
        except FileNotFoundError:
            pass
        raise


def _tagged(fd: int) -> bool:
    try:
        text = read_file(fd, TAG, TAG, 4096)
    except (OSError, Refused):
        return False
    return text.startswith(TAG_TEXT.split("\n", 1)[0].encode()) and b"fastseq" in text
