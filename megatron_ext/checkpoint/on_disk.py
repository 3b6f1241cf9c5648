"""The checkpoint directory format, and the rules that keep a user's checkpoints safe. No torch.

Layout on disk (Megatron-LM's, plus two files of ours)::

    SAVE/latest_checkpointed_iteration.txt   # the tracker: the last published save
    SAVE/iter_0000100/                       # one save
        metadata.json  .metadata  __0_0.distcp …   # Megatron-Core's torch_dist files (≤ 0.18: also common.pt)
        checksums.json                       # CRC-32 of every file, written once they all are
        save_in_progress.json                # from a save's first byte until it is published

A save's directory appears with its marker inside (made as ``.iter_….starting``
and renamed), then it is published in this order: every rank's files,
``checksums.json``, the tracker (atomically), then the marker is removed. So a
directory is in
one of three states (``state_of``):

* **complete**: it has ``checksums.json`` and no marker, or the tracker names
  it (a save killed after its tracker was written and before its marker was
  removed is complete);
* **partial**: it has the marker and the tracker does not name it, or it is
  empty: provably a save that never finished;
* **unverified**: neither file: saved by an older version (or the manifest
  was removed). It is loaded, read-only: never removed or replaced.

**The invariant** (``docs/checkpoints.md``): no run deletes or overwrites a
checkpoint directory it did not create in that run, unless the user asks with
``--overwrite-checkpoints``. Partial saves are the only directories removed
without being asked (``remove_partial_saves``), besides the oldest complete
ones that ``--keep-last-checkpoints`` asks to prune. A run that finds
complete checkpoints it cannot account for (no tracker; checkpoints beyond
the iteration it starts from) stops before training and says what it found
and how to go on (``check_load_directory``, ``check_save_directory``).
"""

from __future__ import annotations

import enum
import errno
import json
import logging
import os
import shutil
import socket
import tempfile
import time
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from megatron_ext.config.runtime import TRACKER_FILENAME
from megatron_ext.write_faults import describe

log = logging.getLogger(__name__)

SAVE_FLAG = "--save"

CHECKSUMS_FILENAME = "checksums.json"
"""Written after every file of a save, before the tracker: the CRC-32 of each (``null`` with
``--no-checkpoint-checksums``)."""
SAVING_FILENAME = "save_in_progress.json"
"""Written when a save starts, removed once it is published: a directory holding it (and not tracked) is a
partial save."""
MEGATRON_FILES = {
    "metadata.json": "Megatron-Core's description of the checkpoint: its backend and version",
    # Megatron-Core 0.19 writes no common.pt: the non-tensor state is the ShardedObject "common_state" inside the
    # torch_dist files (dist_checkpointing/serialization.py save(); load_common_state_dict reads either form).
    ".metadata": "torch's index of every saved tensor",
}
"""The files every torch_dist checkpoint directory holds, each with what it holds."""

OVERWRITE_FLAG = "--overwrite-checkpoints"
"""The flag that lets a run replace checkpoints it did not write (``RunArgs.overwrite_checkpoints``)."""


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used or written, with what is wrong, where, and what to do."""


class DirState(enum.Enum):
    """What a checkpoint directory holds (see the module docstring)."""

    COMPLETE = "complete"
    PARTIAL = "partial"
    UNVERIFIED = "unverified"


def checkpoint_dir(root: str | Path, iteration: int) -> Path:
    return Path(root) / f"iter_{iteration:07d}"


def iteration_dirs(root: str | Path) -> dict[int, Path]:
    """The ``iter_NNNNNNN`` directories under ``root`` by iteration."""
    found: dict[int, Path] = {}
    root = Path(root)
    if not root.is_dir():
        return found
    for child in root.glob("iter_*"):
        suffix = child.name[len("iter_") :]
        if child.is_dir() and suffix.isdigit():
            found[int(suffix)] = child
    return found


def size_text(size: float) -> str:
    """Bytes as a person reads them: ``"5.0 MiB"``, ``"1.23 TiB"``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:,.{2 if scale >= 2**30 else 1}f} {unit}"
    return f"{size:,.0f} bytes"


def os_error_text(exc: OSError) -> str:
    """``"no space left on device (ENOSPC)"``: the error and its code, for one-line messages."""
    return describe(exc.errno, flag=SAVE_FLAG, words=exc.strerror or str(exc))[0]


def os_error_fix(exc: OSError) -> str:
    """What a user can do about a failed checkpoint write."""
    directory = Path(exc.filename).parent if isinstance(exc.filename, str) else "that directory"
    return describe(exc.errno, flag=SAVE_FLAG, directory=directory)[1]


def diagnose_write_failure(directory: Path) -> OSError | None:
    """The likely cause of a failed write under ``directory`` when the writer hid it (torch's zip writer reports
    a full disk as "unexpected pos"): a full, read-only or unwritable filesystem, as the OSError it would have
    raised; None when none of them holds."""
    existing = _nearest_existing(directory)
    try:
        stats = os.statvfs(existing)
    except OSError as exc:
        return exc
    if stats.f_flag & os.ST_RDONLY:
        return OSError(errno.EROFS, os.strerror(errno.EROFS), str(existing))
    if not os.access(existing, os.W_OK | os.X_OK):
        return OSError(errno.EACCES, os.strerror(errno.EACCES), str(existing))
    if stats.f_bavail * stats.f_frsize < FULL_BELOW_BYTES:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(existing))
    return None


FULL_BELOW_BYTES = 1 << 20
"""A filesystem with less room than this is taken as full when a write failed there without saying why."""


def read_tracker(root: str | Path) -> int | None:
    """The iteration the tracker under ``root`` names (None: no tracker). CheckpointError names a damaged one."""
    tracker = Path(root) / TRACKER_FILENAME
    if not tracker.exists():
        return None
    try:
        data = tracker.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"{tracker} cannot be read: {os_error_text(exc)}") from exc
    try:
        text = data.decode("ascii").strip()
    except UnicodeDecodeError:
        text = None
    if text is None or not text.isdigit():
        shown = repr(text) if text is not None else f"binary bytes {data[:16]!r}"
        have = [it for it, path in sorted(iteration_dirs(root).items()) if state_of(path) is not DirState.PARTIAL]
        fix = (
            f"write the iteration to resume from into it (complete checkpoints: {', '.join(map(str, have))}; "
            f"e.g. echo {have[-1]} > {tracker})"
            if have
            else "remove it to start from scratch"
        )
        raise CheckpointError(f"{tracker}: expected an iteration number, found {shown}; {fix}")
    return int(text)


def write_atomically(path: Path, text: str) -> None:
    """Write, fsync, rename, fsync the directory: readers see the old or the new file, never a part.
    A failed write leaves no temporary file behind."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_tracker(root: Path, iteration: int) -> None:
    write_atomically(root / TRACKER_FILENAME, f"{iteration}\n")


def state_of(path: Path, *, tracked: bool = False) -> DirState:
    """Whether a checkpoint directory is complete, partial or unverified; ``tracked``: the tracker names it."""
    has_manifest = (path / CHECKSUMS_FILENAME).is_file()
    if tracked and has_manifest:
        return DirState.COMPLETE
    if (path / SAVING_FILENAME).exists() or not any(path.iterdir()):
        return DirState.PARTIAL
    return DirState.COMPLETE if has_manifest else DirState.UNVERIFIED


def is_complete(path: Path) -> bool:
    """Whether a directory holds a finished save (complete or, from an older version, unverified)."""
    return path.is_dir() and state_of(path) is not DirState.PARTIAL


def states(root: str | Path) -> dict[int, DirState]:
    """Every iteration directory's state (the tracked one named as such). Safe beside a running job: a directory
    renamed away after it was listed (pruned, or set aside as damaged) is left out, as it is no longer there."""
    tracked = _tracked_or_none(root)
    found: dict[int, DirState] = {}
    for it, path in sorted(iteration_dirs(root).items()):
        try:
            found[it] = state_of(path, tracked=it == tracked)
        except FileNotFoundError:
            continue
    return found


def _tracked_or_none(root: str | Path) -> int | None:
    try:
        return read_tracker(root)
    except CheckpointError:
        return None


def complete_iterations(root: str | Path) -> list[int]:
    """Iterations under ``root`` whose directory holds a finished save (complete or unverified)."""
    return [it for it, state in states(root).items() if state is not DirState.PARTIAL]


# --------------------------------------------------------------------------- saving
STARTING_SUFFIX = ".starting"
"""A save's directory is made as ``.<name>.starting`` and renamed once its in-progress marker is in it."""


def start_save(root: Path, iteration: int, *, overwrite: bool) -> Path:
    """Create the directory of a new save with its in-progress marker (rank 0). A directory already there is
    removed only when it is a partial save, or when the user asked with ``--overwrite-checkpoints``."""
    target = checkpoint_dir(root, iteration)
    root.mkdir(parents=True, exist_ok=True)
    if target.exists():
        state = state_of(target, tracked=read_tracker(root) == iteration)
        if state is not DirState.PARTIAL and not overwrite:
            raise CheckpointError(
                f"{target} already holds a {state.value} checkpoint that this run did not write; it is kept. "
                f"Use another --save directory, or pass {OVERWRITE_FLAG} to replace it"
            )
        log.warning(
            "replacing %s: %s",
            target,
            "a save that never finished" if state is DirState.PARTIAL else f"{OVERWRITE_FLAG} was given",
        )
        remove_directory(target, keep_tracked=not overwrite)
    # The directory appears with its marker already inside (made aside, then renamed): created empty and the
    # marker written after, a kill in between left a directory holding only the marker's temporary file, which
    # read as a finished save of an older version.
    staging = target.with_name(f".{target.name}{STARTING_SUFFIX}")
    if staging.exists():
        shutil.rmtree(staging)  # a start cut short
    staging.mkdir()
    marker = {"iteration": iteration, "host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
    write_atomically(staging / SAVING_FILENAME, json.dumps(marker))
    os.rename(staging, target)
    return target


def finish_save(target: Path) -> None:
    """The last step of publishing a save (after the tracker names it): remove its in-progress marker."""
    (target / SAVING_FILENAME).unlink(missing_ok=True)


REMOVING_SUFFIX = ".removing"
"""A directory being removed is first renamed to ``.<name>.removing``: no longer an ``iter_*`` directory, so a
removal cut short (a killed process) never leaves something that looks like a checkpoint."""


def remove_directory(path: Path, *, keep_tracked: bool = True) -> None:
    """Remove a checkpoint directory this run may remove: renamed out of the ``iter_*`` names first (atomic),
    then deleted. Never the directory the tracker names (CheckpointError: a published checkpoint stays), unless
    the user asked to replace it (``keep_tracked=False``, ``--overwrite-checkpoints``)."""
    iteration = path.name.removeprefix("iter_")
    if keep_tracked and iteration.isdigit() and _tracked_or_none(path.parent) == int(iteration):
        raise CheckpointError(f"{path} is the checkpoint {TRACKER_FILENAME} names: it is kept")
    doomed = path.with_name(f".{path.name}{REMOVING_SUFFIX}")
    if doomed.exists():
        shutil.rmtree(doomed)
    os.rename(path, doomed)
    shutil.rmtree(doomed)


DAMAGED_SUFFIX = ".damaged"
"""A checkpoint that failed its checks and was skipped by a resume is renamed ``iter_NNNNNNN.damaged`` (then
``.damaged-2``, ...): kept for a person to look at, out of the ``iter_*`` directories runs load, save or prune."""


def set_aside(path: Path) -> Path:
    """Rename a damaged checkpoint directory out of the way (rank 0); returns its new name. Never deletes."""
    aside = path.with_name(f"{path.name}{DAMAGED_SUFFIX}")
    number = 1
    while aside.exists():
        number += 1
        aside = path.with_name(f"{path.name}{DAMAGED_SUFFIX}-{number}")
    os.rename(path, aside)
    return aside


def fallback_candidates(root: str | Path, tracked: int) -> list[int]:
    """The iterations a resume may fall back to when the tracked one is damaged, newest first: the finished
    (complete or unverified) checkpoints before it."""
    return sorted((it for it in complete_iterations(root) if it < tracked), reverse=True)


def remove_partial_saves(root: Path) -> list[Path]:
    """Delete the directories of saves that never finished (rank 0), and what a cut-short removal left; returns
    them. Never the tracked one, the only one a run loads (a stale marker there is dropped: its save was
    published)."""
    tracked = _tracked_or_none(root)
    removed = []
    for suffix in (REMOVING_SUFFIX, STARTING_SUFFIX):
        for leftover in Path(root).glob(f".iter_*{suffix}"):
            shutil.rmtree(leftover)
            removed.append(leftover)
    for iteration, path in iteration_dirs(root).items():
        if iteration == tracked:
            if (path / CHECKSUMS_FILENAME).is_file():
                finish_save(path)
            continue
        if state_of(path) is not DirState.PARTIAL:
            continue
        remove_directory(path)
        removed.append(path)
    return removed


def prune(root: Path, *, keep: int) -> list[Path]:
    """Keep the newest ``keep`` complete checkpoints up to the tracked one (``--keep-last-checkpoints``); returns
    the removed ones. Unverified ones (older versions) are never pruned."""
    tracked = _tracked_or_none(root)
    if tracked is None:
        return []
    complete = [it for it, state in states(root).items() if it <= tracked and state is DirState.COMPLETE]
    removed = []
    for iteration in complete[:-keep]:
        path = checkpoint_dir(root, iteration)
        remove_directory(path)
        removed.append(path)
    return removed


# ------------------------------------------------------------------ the invariant, before training
def _listing(found: Mapping[int, DirState]) -> str:
    return ", ".join(f"{it}" if state is DirState.COMPLETE else f"{it} ({state.value})" for it, state in found.items())


def check_load_directory(root: str | Path, *, overwrite: bool) -> None:
    """Refuse to start from scratch when ``--load`` has no tracker but holds finished checkpoints."""
    if read_tracker(root) is not None or overwrite:
        return
    found = {it: s for it, s in states(root).items() if s is not DirState.PARTIAL}
    if found:
        last = max(found)
        raise CheckpointError(
            f"--load {root} has no {TRACKER_FILENAME} but holds finished checkpoints of iterations {_listing(found)}; "
            f"nothing was loaded or changed. To resume from {last}: echo {last} > {Path(root) / TRACKER_FILENAME} "
            f"and run again; to start from scratch anyway: {OVERWRITE_FLAG}, or another --load directory"
        )


def check_save_directory(root: str | Path, *, start_iteration: int, overwrite: bool) -> None:
    """Refuse a ``--save`` directory holding finished checkpoints beyond ``start_iteration`` (this run would
    replace them as it reaches their iterations), or a tracker beyond it, unless ``overwrite``."""
    if overwrite:
        return
    latest = read_tracker(root)
    if latest is not None and latest > start_iteration:
        raise CheckpointError(
            f"--save {root} already holds checkpoints up to iteration {latest}, beyond this run's start "
            f"({start_iteration}); saving there would replace them. Use another --save directory, --load {root} "
            f"to continue that run, or {OVERWRITE_FLAG} to replace them"
        )
    found = {it: s for it, s in states(root).items() if it > start_iteration and s is not DirState.PARTIAL}
    if found:
        why = f"it has no {TRACKER_FILENAME}" if latest is None else f"its tracker names {latest}"
        last = max(found)
        raise CheckpointError(
            f"--save {root} holds finished checkpoints beyond this run's start (iteration {start_iteration}) that "
            f"this run would replace: {_listing(found)} ({why}); nothing was changed. To resume from {last}: "
            f"echo {last} > {Path(root) / TRACKER_FILENAME} and run with --load {root}; to replace them: "
            f"{OVERWRITE_FLAG}; or use another --save directory"
        )


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def save_path_problem(root: str | Path, *, needed_bytes: float | None, probe: bool) -> tuple[str | None, int | None]:
    """(why checkpoints cannot be written under ``root``, or None; the free bytes there, or None).

    ``root`` must be a directory or creatable, writable, and (when ``needed_bytes`` is given) have room for one
    checkpoint. ``probe``: also create and remove a file there (what ``os.access`` cannot tell: root on a
    read-only or full filesystem, network filesystems); nothing else is created.
    """
    root = Path(root)
    existing = _nearest_existing(root)
    if not existing.is_dir():
        where = "is a file" if existing == root.absolute() else f"cannot be created: {existing} is a file"
        return f"--save {root} {where}; give a directory", None
    try:
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only:
        return f"--save {root}: {existing} is on a read-only filesystem (EROFS); choose a writable directory", None
    if not os.access(existing, os.W_OK | os.X_OK):
        fix = describe(errno.EACCES, flag=SAVE_FLAG, directory=existing)[1]
        return f"--save {root}: {existing} is not writable by this user (EACCES); {fix}", None
    if probe:
        try:
            fd, name = tempfile.mkstemp(prefix=".write-test-", dir=existing)
            os.close(fd)
            os.unlink(name)
        except OSError as exc:
            return f"--save {root}: cannot write in {existing}: {os_error_text(exc)}; {os_error_fix(exc)}", None
    free = shutil.disk_usage(existing).free
    if needed_bytes is not None and free < needed_bytes:
        return (
            f"--save {root}: {existing} has {size_text(free)} free and one checkpoint of this run needs about "
            f"{size_text(needed_bytes)}; free space there or choose another --save directory",
            free,
        )
    return None, free


# ------------------------------------------------------------------ reading a directory
def resolve_iteration(root: str | Path, iteration: int | None) -> Path:
    """The directory of checkpoint ``iteration`` under ``root`` (None: the tracked one), which must be finished."""
    root = Path(root)
    latest = read_tracker(root)
    if latest is None and iteration is None:
        have = complete_iterations(root)
        hint = f"; finished checkpoints there: {', '.join(map(str, have))} (give --iteration)" if have else ""
        raise CheckpointError(f"{root} holds no checkpoint ({TRACKER_FILENAME} is missing){hint}; check the path")
    if iteration is None:
        iteration = latest
    assert iteration is not None
    path = checkpoint_dir(root, iteration)
    if not path.is_dir() or state_of(path, tracked=iteration == latest) is DirState.PARTIAL:
        have = complete_iterations(root)
        raise CheckpointError(
            f"{root} has no finished checkpoint of iteration {iteration}; finished ones: "
            f"{', '.join(map(str, have)) or 'none'}"
        )
    return path


def check_structure(path: Path) -> None:
    """Megatron-Core's three files of a checkpoint directory are there and its description parses; CheckpointError
    names the first that is not (before Megatron-Core's own reader says only "not a distributed checkpoint")."""
    for name, holds in MEGATRON_FILES.items():
        if not (path / name).is_file():
            raise CheckpointError(
                f"{path / name} is missing ({holds}): the checkpoint is damaged; resume from an earlier checkpoint"
            )
    try:
        json.loads((path / "metadata.json").read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(
            f"{path / 'metadata.json'} is damaged ({exc}); resume from an earlier checkpoint"
        ) from exc


def crc32(file: Path) -> str:
    value = 0
    with open(file, "rb") as f:
        while block := f.read(16 << 20):
            value = zlib.crc32(block, value)
    return f"{value:08x}"


def files_to_hash(path: Path) -> list[str]:
    """The files a save's ``checksums.json`` covers: all but itself and the in-progress marker."""
    return sorted(f.name for f in path.iterdir() if f.is_file() and f.name not in (CHECKSUMS_FILENAME, SAVING_FILENAME))


def read_checksums(path: Path) -> dict[str, str] | None:
    """The CRC-32 of every file as saved; None when saved with ``--no-checkpoint-checksums``. CheckpointError for a
    damaged manifest; a missing one is the caller's (``state_of``)."""
    manifest = path / CHECKSUMS_FILENAME
    try:
        record: Any = json.loads(manifest.read_text())
        crcs = record["crc32"]
        if crcs is not None and not isinstance(crcs, dict):
            raise ValueError("'crc32' is neither a mapping nor null")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{manifest} is damaged ({exc}); resume from an earlier checkpoint") from exc
    return crcs
