"""What a failing save leaves behind and says, and the seams that make a save fail on purpose in tests.

A save that fails removes its own directory (rank 0) and is described in one
line: what, where and what to do (``save_failed``). Once the tracker names a
save, no failure path removes it: a failure after publishing (a peer that
died while the ranks agreed on the outcome) is reported and the checkpoint
kept. ``MEGATRON_EXT_KILL_AT`` kills a rank at a chosen step of a chosen save,
so that a test can prove the publish order (``SAVE_STEPS``).
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import torch.distributed as dist

from megatron_ext.checkpoint import on_disk
from megatron_ext.checkpoint.on_disk import TRACKER_FILENAME, CheckpointError

log = logging.getLogger(__name__)


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and what lies under it, breadth first: torch's CheckpointException holds each rank's failure."""
    found: list[BaseException] = []
    queue = [exc]
    while queue:
        current = queue.pop(0)
        if any(current is seen for seen in found):
            continue
        found.append(current)
        failures = getattr(current, "failures", None)
        if isinstance(failures, dict):
            queue += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
        queue += [e for e in (current.__cause__, current.__context__) if e is not None]
    return found


def save_failed(target: Path, exc: BaseException) -> CheckpointError:
    """Describe a failed save in one line (what, where and what to do) and remove its directory (rank 0) unless
    it was published: once the tracker names it, it is a checkpoint, and a failure after that (a peer that died
    while the ranks agreed on the outcome) keeps it."""
    causes = _causes(exc)
    os_error = next((e for e in causes if isinstance(e, OSError)), None) or on_disk.diagnose_write_failure(target)
    if os_error is not None:
        where = f" ({os_error.filename})" if os_error.filename else ""
        what = f"{on_disk.os_error_text(os_error)}{where}; {on_disk.os_error_fix(os_error)}"
    else:
        inner = causes[-1]
        what = f"{type(inner).__name__}: {(str(inner).strip().splitlines() or [''])[0][:300]}"
    try:
        latest = on_disk.read_tracker(target.parent)
    except CheckpointError:
        latest = None
    if latest is not None and on_disk.checkpoint_dir(target.parent, latest) == target:
        return CheckpointError(
            f"checkpoint {target} was published ({TRACKER_FILENAME} names it) and is kept; what failed after "
            f"publishing it: {what}"
        )
    if dist.get_rank() == 0 and target.exists():
        try:
            on_disk.remove_directory(target)
        except (OSError, CheckpointError) as removal:
            log.warning("could not remove the partial save %s (%s): the next save removes it", target, removal)
    kept = f"iteration {latest} is the last published checkpoint" if latest is not None else "none was published"
    return CheckpointError(f"cannot write checkpoint {target}: {what}. The partial save was removed; {kept}")


KILL_AT_VARIABLE = "MEGATRON_EXT_KILL_AT"
"""A test seam: ``STEP:RANK:ITERATION`` kills that rank (SIGKILL, as a node failure would) at that step of that
iteration's save; the steps are :data:`SAVE_STEPS` (``tests/training/test_save_faults.py``)."""

SAVE_STEPS = ("before-shards", "after-shards", "after-checksums", "after-tracker", "published")
"""The steps of a save at which a test can kill a rank, in order: the directory and its marker exist; every
rank's files (and Megatron-Core's metadata) are written; checksums.json is; the tracker names it
(rank 0, before the marker is removed); every rank knows it is published."""


def fault_point(step: str, iteration: int) -> None:
    """Kill this rank here when ``MEGATRON_EXT_KILL_AT`` names this step, rank and iteration."""
    wanted = os.environ.get(KILL_AT_VARIABLE)
    if wanted and wanted == f"{step}:{dist.get_rank()}:{iteration}":
        os.kill(os.getpid(), signal.SIGKILL)
