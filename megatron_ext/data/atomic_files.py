"""Output files written without a name, then published all together or not at all.

The datasets of :mod:`megatron_ext.data.indexed` and the preprocessing report
are written to unnamed files (``O_TMPFILE``) in the destination directory
where the filesystem has them, otherwise to hidden ``.NAME.tmp-OWNER-PID``
files (OWNER: host name and PID namespace); see :class:`PendingFile`. They are
published in two phases: every file is first completed and synced while still
unnamed, then given its hidden temporary name (all that can fail for lack of
space or a filesystem refusal happens here, before any final name is touched);
then all are renamed to their final names (:func:`publish_files`) with SIGINT,
SIGTERM and SIGHUP held (:func:`signals_deferred`), and a rename that fails
undoes the ones before it (restoring older files from hard-link backups where
the filesystem has hard links). Only ``kill -9`` or a crash between the naming
and the last rename (milliseconds) can publish some outputs and not others or
leave hidden temporaries; those of dead runs are removed by the next run on the
same output name on the same host (see :func:`_remove_stale`).

Every refusal of the filesystem while writing (full, read-only, not permitted)
is a :class:`WriteError` that names the output file and the fix (:func:`writing`).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from megatron_ext.write_faults import describe


class WriteError(OSError):
    """An output that the filesystem refused to take (full, read-only, not permitted).

    Its message is one line: the file, what the filesystem said (with the errno
    name) and what to do. It is raised once everything the run wrote has been
    discarded, unless ``consequence`` says otherwise. ``errno`` is the original's.
    """

    def __init__(self, path: str | os.PathLike[str], exc: OSError, consequence: str = "nothing was written") -> None:
        what, fix = describe(
            exc.errno, flag="--output-prefix", directory=Path(path).parent, words=exc.strerror or str(exc)
        )
        super().__init__(f"cannot write {path}: {what}; {consequence}; {fix}")
        self.path = Path(path)
        self.errno = exc.errno


@contextlib.contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[None]:
    """Turn an ``OSError`` raised while writing ``path`` (or its temporaries) into a :class:`WriteError`."""
    try:
        yield
    except WriteError:
        raise  # already names its file
    except OSError as exc:
        raise WriteError(path, exc) from None


def _owner_tag() -> str:
    """This host and PID namespace, as written into temporary names: a PID is only meaningful there.

    On a shared filesystem, another host's temporaries (or another container's on
    this host) are never taken for a dead run's.
    """
    host = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "localhost"
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return host
    return f"{host}.{namespace}"


_OWNER = _owner_tag()
_TEMP_KINDS = ("tmp", "old")  # a file being written or staged; a backup of an older output while publishing


def _temp_path(final: Path, kind: str, pid: int | None = None) -> Path:
    """``.NAME.KIND-OWNER-PID`` next to ``final``."""
    return final.parent / f".{final.name}.{kind}-{_OWNER}-{os.getpid() if pid is None else pid}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    return True


def _remove_stale(directory: Path, name: str) -> None:
    """Remove temporaries that runs on this host (and PID namespace) left for ``name`` when they died.

    Only ``.NAME.tmp-OWNER-PID`` / ``.NAME.old-OWNER-PID`` files whose OWNER is
    ours and whose PID is no longer alive are removed: another host's live
    temporary on a shared filesystem is never touched (its OWNER differs), and
    neither is a live run's here.
    """
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    prefixes = [f".{name}.{kind}-{_OWNER}-" for kind in _TEMP_KINDS]
    for entry in entries:
        for prefix in prefixes:
            if not entry.name.startswith(prefix):
                continue
            pid = entry.name[len(prefix) :]
            if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


class PendingFile:
    """A file written without a name in ``directory``; :meth:`name` gives it a hidden one.

    Uses ``O_TMPFILE`` where the filesystem has it (nothing is left if the
    process dies before :meth:`name`), otherwise a hidden
    ``.NAME.tmp-OWNER-PID`` removed on :meth:`discard` (left behind by
    ``kill -9``, then removed by the next run that writes ``NAME`` on this host).
    """

    def __init__(self, final: Path) -> None:
        self.final = final
        self.named: Path | None = None
        directory = final.parent
        _remove_stale(directory, final.name)
        try:
            fd = os.open(directory, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o644)
        except (AttributeError, OSError):
            named = _temp_path(final, "tmp")
            with writing(final):  # a read-only or full filesystem refuses this one too: name the output
                fd = os.open(named, os.O_CREAT | os.O_TRUNC | os.O_WRONLY | os.O_CLOEXEC, 0o644)
            self.named = named
        self.file: BinaryIO = os.fdopen(fd, "wb", buffering=1 << 20)

    def write(self, data: Any) -> None:
        """Append ``data`` (bytes or a buffer); a refusal of the filesystem is a :class:`WriteError`."""
        with writing(self.final):
            self.file.write(data)

    def sync(self) -> None:
        """Write the file's data to disk (fsync); it keeps whatever name it has."""
        with writing(self.final):
            self.file.flush()
            os.fsync(self.file.fileno())

    def name(self) -> None:
        """Give an unnamed file its hidden temporary name (after :meth:`sync`); the final name is untouched."""
        with writing(self.final):
            if self.named is None:
                staging = _temp_path(self.final, "tmp")
                with contextlib.suppress(FileNotFoundError):
                    staging.unlink()
                self.named = staging  # set first: a copy that fails half-way is removed by discard()
                _link_unnamed(self.file, staging)
            self.file.close()

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self.file.close()
        if self.named is not None:
            with contextlib.suppress(FileNotFoundError):
                self.named.unlink()
            self.named = None


def _link_unnamed(file: BinaryIO, target: Path) -> None:
    """Name an ``O_TMPFILE`` file: ``linkat`` of its /proc fd path (Python's os.link does not follow it),
    or a copy (synced) where that is refused."""
    import ctypes

    at_fdcwd, at_symlink_follow = -100, 0x400
    libc = ctypes.CDLL(None, use_errno=True)
    src = f"/proc/self/fd/{file.fileno()}".encode()
    if libc.linkat(at_fdcwd, src, at_fdcwd, os.fsencode(target), at_symlink_follow) == 0:
        return
    with open(target, "wb") as out:
        file.flush()
        with open(src, "rb") as data:
            while block := data.read(16 << 20):
                out.write(block)
        out.flush()
        os.fsync(out.fileno())


HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP while final names are given, so a .bin never appears without its .idx.

    The signals are blocked for this thread and, in the main thread, their
    Python handlers are replaced by ones that only record them (a signal the
    kernel hands to another thread still runs its Python handler in the main
    thread). On exit the old handlers and mask come back and the held signals
    are delivered to them.
    """
    caught: list[int] = []
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
    old_handlers: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in HELD_SIGNALS:
            old_handlers[sig] = signal.signal(sig, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        for held, handler in old_handlers.items():
            signal.signal(held, handler if handler is not None else signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)  # signals pending in the kernel arrive here
        for signum in dict.fromkeys(caught):
            signal.raise_signal(signum)


def _fsync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def publish_files(files: Sequence[PendingFile]) -> None:
    """Rename every staged file to its final name: all of them, or (on an error) none.

    An older file at a final name is first hard-linked to ``.NAME.old-OWNER-PID``
    so that a failed rename can put it back; where the filesystem has no hard
    links, a failed rename removes the new files published before it (the older
    ones they replaced are gone). The backups are removed at the end.
    """
    backups: dict[Path, Path] = {}
    published: list[PendingFile] = []
    try:
        for f in files:
            if os.path.lexists(f.final):
                backup = _temp_path(f.final, "old")
                with contextlib.suppress(FileNotFoundError):
                    backup.unlink()
                try:
                    os.link(f.final, backup, follow_symlinks=False)
                except OSError:
                    continue
                backups[f.final] = backup
        for f in files:
            assert f.named is not None, "name() first"
            with writing(f.final):
                os.replace(f.named, f.final)
            f.named = None
            published.append(f)
    except BaseException:
        for f in reversed(published):
            with contextlib.suppress(OSError):
                if f.final in backups:
                    os.replace(backups.pop(f.final), f.final)
                else:
                    os.unlink(f.final)
        raise
    finally:
        for backup in backups.values():
            with contextlib.suppress(OSError):
                backup.unlink()
    for directory in dict.fromkeys(f.final.parent for f in files):
        _fsync_directory(directory)


def stage_file(final: Path, data: bytes) -> Path:
    """``data`` written and synced to the hidden temporary ``.NAME.tmp-OWNER-PID`` next to ``final``,
    to be renamed to ``final`` (``os.replace``) once the outputs it belongs to are published.

    A refusal of the filesystem is a :class:`WriteError` naming ``final``, with nothing left behind;
    a temporary left by ``kill -9`` is removed by the next run on this host, as for datasets.
    """
    _remove_stale(final.parent, final.name)
    staged = _temp_path(final, "tmp")
    try:
        with writing(final), open(staged, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            staged.unlink()
        raise
    return staged


def replace_file(final: Path, data: bytes) -> None:
    """``data`` at ``final`` in one step: staged beside it (:func:`stage_file`) and renamed over it.

    A refusal of the filesystem is a :class:`WriteError` naming ``final``; ``final`` is then as it was and
    nothing is left behind.
    """
    staged = stage_file(final, data)
    try:
        os.replace(staged, final)
    except OSError as exc:
        with contextlib.suppress(OSError):
            staged.unlink()
        raise WriteError(final, exc) from None
