"""Which checkpoint a resume loads: the tracked one, or, when it fails its checks, the newest earlier one that
passes them (the fallback a requeued job needs to go on by itself).

``preflight_resume`` decides it before any process group exists, from what one process can check without the
model (files present and whole, ``checksums.json`` and the common state readable, the vocabulary and optimizer state
this run can take), so that ``--dry-run`` and every rank say it before torch.distributed starts.
``newest_that_passes`` decides it again at load, with the CRC-32 of every file checked by all ranks together,
and is the one that acts: each damaged checkpoint passed over is renamed ``iter_NNNNNNN.damaged`` (kept, never
deleted), the tracker is pointed at the one loaded, and one warning line says so. ``--no-checkpoint-fallback``
stops instead (exit 3), and a checkpoint named by ``--iteration`` (the tools) is never replaced by another.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from megatron_ext.checkpoint import on_disk, records
from megatron_ext.checkpoint.on_disk import CHECKSUMS_FILENAME, CheckpointError, checkpoint_dir, read_tracker
from megatron_ext.checkpoint.run_identity import RunIdentity
from megatron_ext.config.training_config import TrainingConfig
from megatron_ext.training.checkpointing import check_files, check_sizes, on_rank0, saved_common, verify_checkpoint

log = logging.getLogger(__name__)

FALLBACK_FLAG = "--no-checkpoint-fallback"


@dataclass(frozen=True)
class ResumePlan:
    """What a resume will load, decided before any process group exists (``preflight_resume``)."""

    iteration: int
    skipped: tuple[tuple[int, str], ...]
    """The damaged checkpoints it passes over, newest first: (iteration, why)."""


def preflight_resume(cfg: TrainingConfig, identity: RunIdentity | None = None) -> ResumePlan | None:
    """The checkpoint under ``--load`` a resume will load, and the refusals that need no model: every file there
    and whole, ``checksums.json`` and the common state readable, the vocabulary and optimizer state this run can take
    (``records.check_resumable``), and with ``identity`` this run's tokenizer and data against the saved run's. The damaged checkpoints a resume falls back from are listed (nothing is moved
    here). One process, no process group: ``--dry-run`` and every rank before it initialises torch.distributed
    reach the same answer (the CRC-32 of every file is checked at load, by all ranks together). None: nothing to
    resume from. CheckpointError: nothing it may load."""
    run = cfg.run
    if not run.load or run.finetune:
        return None
    root = Path(run.load)
    tracked = read_tracker(root)
    if tracked is None:
        return None
    fallback = not run.no_checkpoint_fallback
    skipped: list[tuple[int, str]] = []
    for candidate in [tracked, *(on_disk.fallback_candidates(root, tracked) if fallback else [])]:
        path = checkpoint_dir(root, candidate)
        try:
            if not path.is_dir():
                raise CheckpointError(f"{path} does not exist")
            check_sizes(path)
            if (path / CHECKSUMS_FILENAME).is_file():
                on_disk.read_checksums(path)
            common = saved_common(path)
        except CheckpointError as exc:
            if not fallback:
                raise
            skipped.append((candidate, str(exc)))
            continue
        records.check_resumable(path, common, cfg)
        if identity is not None:  # hashed where the data is checked in full (--dry-run, global rank 0)
            records.check_identity(path, common, identity, run)
        return ResumePlan(iteration=candidate, skipped=tuple(skipped))
    raise _none_passes(root, skipped)


def _passes(path: Path, *, verify: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """A checkpoint directory's tensor index and common state, once its files pass their checks (a collective
    with ``verify``: the ranks share the CRC-32s); CheckpointError names what fails."""
    if not path.is_dir():
        raise CheckpointError(f"{path} does not exist")
    saved_tensors = verify_checkpoint(path) if verify else check_files(path)
    return saved_tensors, saved_common(path)


def describe(plan: ResumePlan, root: str) -> list[str]:
    """``--dry-run``'s lines on what the run will resume from."""
    lines = [
        f"iteration {it} under --load {root} fails its checks ({why}): a run moves it aside and falls back"
        for it, why in plan.skipped
    ]
    return [*lines, f"resumes from iteration {plan.iteration} under --load {root} (its CRC-32s are checked at load)"]


def newest_that_passes(
    root: Path, iteration: int, *, verify: bool, fallback: bool
) -> tuple[Path, dict[str, Any], dict[str, Any], tuple[tuple[int, str, str], ...]]:
    """The checkpoint of ``iteration`` if it passes its checks; else, with ``fallback``, the newest earlier one
    that does, after moving each damaged one aside (``on_disk.set_aside``, rank 0) and pointing the tracker at
    the one loaded, so that the next saves cannot collide with them and a later resume starts there too.

    Every rank reaches the same decision: the files are on a filesystem they share and the checksum check is a
    collective."""
    skipped: list[tuple[int, str]] = []
    for candidate in [iteration, *(on_disk.fallback_candidates(root, iteration) if fallback else [])]:
        path = checkpoint_dir(root, candidate)
        try:
            saved_tensors, common = _passes(path, verify=verify)
        except CheckpointError as exc:
            if not fallback:
                raise
            skipped.append((candidate, str(exc)))
            continue
        moved = _set_aside_and_track(root, candidate, skipped)
        return path, saved_tensors, common, moved
    raise _none_passes(root, skipped)


def _set_aside_and_track(root: Path, loaded: int, skipped: list[tuple[int, str]]) -> tuple[tuple[int, str, str], ...]:
    """Move the skipped checkpoints aside and make the tracker name ``loaded`` (rank 0; a collective)."""
    if not skipped:
        return ()

    def move() -> list[str]:
        moved = []
        for it, _ in skipped:
            path = checkpoint_dir(root, it)
            moved.append(str(on_disk.set_aside(path)) if path.exists() else "(it did not exist)")
        on_disk.write_tracker(root, loaded)
        return moved

    moved = on_rank0(move, what=f"cannot move the damaged checkpoints under {root} aside") or []
    shared: list[Any] = [moved]
    dist.broadcast_object_list(shared, src=0)
    result = tuple((it, why, where) for (it, why), where in zip(skipped, shared[0], strict=True))
    if dist.get_rank() == 0:
        for it, why, where in result:
            log.warning(
                "checkpoint of iteration %d skipped: %s; moved to %s (kept); resuming from iteration %d instead "
                "(%s stops instead)",
                it, why, where, loaded, FALLBACK_FLAG,
            )  # fmt: skip
    return result


def _none_passes(root: Path, skipped: list[tuple[int, str]]) -> CheckpointError:
    """The error when no checkpoint under ``root`` passes its checks, with why each failed."""
    listing = "; ".join(f"iteration {it}: {why}" for it, why in skipped)
    return CheckpointError(
        f"no checkpoint under {root} passes its checks ({listing}); nothing was moved or changed. Restore one "
        "from a copy, or start from scratch in another --save directory"
    )
