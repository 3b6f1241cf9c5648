"""The entry point of ``pretrain_gpt.py``: the configuration, then (unless ``--dry-run``) the training loop.

Parsing the arguments, checking the data and printing ``--dry-run``'s plan need
neither torch nor Megatron-Core: ``loop`` (the training, which imports both,
about 3 s of start-up on CPU) is imported only once the run is going to train,
and the checkpoint under ``--load`` is read (with torch) only when there is one
(``tests/cli/test_dry_run_imports.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from megatron_ext import mcore_release
from megatron_ext.checkpoint import on_disk, records
from megatron_ext.checkpoint.run_identity import RunIdentity
from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.exit_codes import ExitCode, fail
from megatron_ext.config.flags import add_options
from megatron_ext.config.run_args import RunArgs
from megatron_ext.config.training_config import TrainingConfig, parse_args, transformer_engine_features
from megatron_ext.data.preflight import preflight
from megatron_ext.estimate import derived_numbers
from megatron_ext.parallel.layout import LayoutError

if TYPE_CHECKING:
    from megatron_ext.training.loop import DatasetsProvider, ForwardStep, ModelProvider


def _configure_logging(rank: int) -> None:
    logging.basicConfig(
        level=logging.INFO,
        format=f"[%(asctime)s rank {rank}] %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stdout,
        force=True,
    )
    # Megatron-Core is chatty at INFO; keep its warnings.
    logging.getLogger("megatron.core").setLevel(logging.WARNING)


def _gpus_here() -> int:
    """This machine's GPUs, without torch (``--dry-run`` imports none): ``CUDA_VISIBLE_DEVICES`` when set (up to
    its first negative entry, as CUDA reads it), else the NVIDIA driver's list under /proc."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        listed = Path("/proc/driver/nvidia/gpus")
        return sum(1 for _ in listed.iterdir()) if listed.is_dir() else 0
    count = 0
    for entry in (e.strip() for e in visible.split(",")):
        if not entry or entry.startswith("-"):
            break
        count += 1
    return count


def _runs_elsewhere(cfg: TrainingConfig) -> str | None:
    """Why the ranks of this ``--dry-run``'s job cannot all run on this machine, or None when they can.

    A GPU job (``--device cuda`` or ``auto``) whose world is more ranks than this machine has GPUs, or CPUs where
    it has no GPU, is a rehearsal of a job that runs elsewhere (``DRY_RUN=1`` of a 1,024-GPU launch script on a
    laptop): what this machine's disk holds says nothing of the cluster's. Never for ``--device cpu`` (CPU
    processes: every world runs here), nor inside a SLURM job, where the recipes validate on the job's first
    node and ``--save`` is the job's own filesystem.
    """
    if cfg.run.device == "cpu" or "SLURM_JOB_ID" in os.environ:
        return None
    world = cfg.layout.world_size
    gpus = _gpus_here()
    here, what = (gpus, "GPU") if gpus else (len(os.sched_getaffinity(0)), "CPU")
    if world <= here:
        return None
    return f"its {world:,} ranks are more than this machine's {here} {what}{'s' if here != 1 else ''}"


def _check_checkpoint_paths(cfg: TrainingConfig, *, probe: bool) -> tuple[str | None, int | None]:
    """Before anything is built: refuse what would lose checkpoints (``on_disk``'s invariant) and a ``--save``
    that cannot hold one (CheckpointError, ConfigError). Returns the line on where checkpoints go (or None) and
    the iteration the tracker under ``--load`` names (or None)."""
    run = cfg.run
    tracked = None
    if run.load:
        on_disk.check_load_directory(run.load, overwrite=run.overwrite_checkpoints)
        tracked = on_disk.read_tracker(run.load)
    start = 0 if tracked is None or run.finetune else tracked
    if not run.save:
        return None, tracked
    on_disk.check_save_directory(run.save, start_iteration=start, overwrite=run.overwrite_checkpoints)
    needed = derived_numbers.checkpoint_bytes(cfg)
    save = Path(run.save)
    if run.dry_run and not save.absolute().parent.exists():
        # A rehearsal of a cluster's job on another machine: its --save is not here to check.
        where = (
            f"--save {save}: not on this machine (nor its parent), so not checked here (the run checks it at "
            f"start-up); about {on_disk.size_text(needed)} per checkpoint"
        )
        return where, tracked
    elsewhere = _runs_elsewhere(cfg) if run.dry_run else None
    # A job rehearsed here whose ranks run elsewhere: this disk is not theirs, so its room decides nothing.
    problem, free = on_disk.save_path_problem(save, needed_bytes=None if elsewhere else needed, probe=probe)
    if problem is not None:
        raise ConfigError(problem)
    assert free is not None
    if elsewhere:
        return (
            f"--save {run.save}: writable here; about {on_disk.size_text(needed)} per checkpoint, room the run "
            f"checks where it starts, before its first step ({on_disk.size_text(free)} free here, which does not "
            f"count: {elsewhere})",
            tracked,
        )
    return (
        f"--save {run.save}: {on_disk.size_text(free)} free, about {on_disk.size_text(needed)} per checkpoint",
        tracked,
    )


def _missing_tracking(cfg: TrainingConfig) -> list[str]:
    """What the asked-for TensorBoard / W&B writers lack here, one line each (checked before anything starts;
    ``pip install -e .[tracking]`` installs both)."""
    asked = {
        "--tensorboard-dir": ("tensorboard", cfg.run.tensorboard_dir),
        "--wandb-project": ("wandb", cfg.run.wandb_project),
    }
    return [
        f"{flag} needs the {package} package: pip install {package} (or pip install -e .[tracking])"
        for flag, (package, value) in asked.items()
        if value and importlib.util.find_spec(package) is None
    ]


def _transformer_engine_note(cfg: TrainingConfig) -> list[str]:
    """--dry-run's line when the flags need Transformer Engine and this machine has none (a cluster's job
    rehearsed elsewhere; the run itself checks at start-up)."""
    features = [*([f"--context-parallel-size {cfg.layout.cp}"] if cfg.layout.cp > 1 else [])]
    features += transformer_engine_features(cfg.optim, cfg.parallel)
    if not features or importlib.util.find_spec("transformer_engine") is not None:
        return []
    return [f"{' and '.join(features)} need Transformer Engine's layers (not installed here; the run checks)"]


def _earlier_null_vocabulary(cfg: TrainingConfig) -> tuple[TrainingConfig, str | None]:
    """``checkpointing.keep_earlier_null_vocabulary``, reading a checkpoint (with torch) only where one could need
    it: a NullTokenizer run with checkpoints under ``--load``."""
    if cfg.data.tokenizer_type != "NullTokenizer" or not cfg.run.load or not on_disk.complete_iterations(cfg.run.load):
        return cfg, None
    from megatron_ext.training.checkpointing import keep_earlier_null_vocabulary

    return keep_earlier_null_vocabulary(cfg)


def _checkpoint_arguments(argv: Sequence[str]) -> dict[str, Any] | None:
    """With ``--use-checkpoint-args``: the arguments recorded by the latest checkpoint under ``--load`` (None
    without the flag, or without a checkpoint there, where Megatron-LM also goes on with the command line's)."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    wanted = [f for f in dataclasses.fields(RunArgs) if f.name in ("use_checkpoint_args", "load")]
    add_options(pre.add_argument_group("checkpoint"), RunArgs, wanted)
    known, _ = pre.parse_known_args(list(argv))
    load = getattr(known, "load", None)
    if not getattr(known, "use_checkpoint_args", False) or not load:
        return None
    iteration = on_disk.read_tracker(load)
    if iteration is None:
        logging.getLogger("megatron_ext").warning(
            "--use-checkpoint-args: no checkpoint under %s to take them from", load
        )
        return None
    from megatron_ext.training.checkpointing import saved_common  # reading the common state takes torch

    args = records.arguments_of(saved_common(on_disk.checkpoint_dir(load, iteration)))
    if args is None:
        raise on_disk.CheckpointError(
            f"{load}: iteration {iteration} records no arguments (saved by an older version): --use-checkpoint-args "
            "cannot take them; give the model's flags"
        )
    return args


def pretrain(
    *,
    model_provider: ModelProvider,
    forward_step: ForwardStep,
    datasets_provider: DatasetsProvider,
    argv: Sequence[str] | None = None,
) -> int:
    """Entry point of ``pretrain_gpt.py``; returns the process exit code."""
    # --exit-duration-in-mins counts from here: start-up and loading use the job's time too.
    started = time.monotonic()
    rank = int(os.environ.get("RANK", "0"))
    _configure_logging(rank)
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        saved = _checkpoint_arguments(argv)
    except on_disk.CheckpointError as exc:
        return fail(exc, ExitCode.CHECKPOINT)
    try:
        cfg = parse_args(argv, default_world_size=int(os.environ.get("WORLD_SIZE", "1")), checkpoint_args=saved)
        cfg, earlier_vocabulary = _earlier_null_vocabulary(cfg)
        # Full dataset checks where one process can afford them (--dry-run, global rank 0);
        # constant-time ones on the other ranks of a large job.
        checked = preflight(cfg, full=cfg.run.dry_run or rank == 0)
    except (ConfigError, LayoutError) as exc:
        return fail(exc, ExitCode.INVALID)
    except on_disk.CheckpointError as exc:
        return fail(exc, ExitCode.CHECKPOINT)
    cfg = checked.cfg
    try:
        where, tracked = _check_checkpoint_paths(cfg, probe=rank == 0)
        resuming: list[str] = []
        identity: RunIdentity | None = None
        if tracked is not None:
            # Reading the checkpoint's index takes torch; without a tracker there is nothing to read.
            from megatron_ext.training import checkpointing, resume

            # Before the model is built: a resumed run keeps the checkpoint's padded vocabulary.
            cfg = checkpointing.keep_checkpoint_vocabulary(cfg)
            # Everything that can refuse the --load without the model, before any process group: every rank
            # reaches the same answer, and --dry-run says it.
            if cfg.run.dry_run or rank == 0:  # the data is hashed where it is checked in full
                try:
                    identity = RunIdentity.of(checked.tokenizer, cfg.data)
                except OSError:
                    identity = None  # files not on this machine (a rehearsal): compared at load
            chosen = resume.preflight_resume(cfg, identity)
            resuming = resume.describe(chosen, str(cfg.run.load)) if chosen is not None else []
            resuming += [earlier_vocabulary] if earlier_vocabulary else []
    except ConfigError as exc:
        return fail(exc, ExitCode.INVALID)
    except on_disk.CheckpointError as exc:
        return fail(exc, ExitCode.CHECKPOINT)
    missing = _missing_tracking(cfg)
    installed_release = mcore_release.installed()
    if cfg.run.dry_run:
        print("configuration is valid")
        notes = [
            *(f"{m} (not installed here)" for m in missing),
            *_transformer_engine_note(cfg),
            mcore_release.note(installed_release),
        ]
        for line in [*derived_numbers.describe(cfg), *([where] if where else []), *resuming, *notes]:
            print(f"  {line}")
        return ExitCode.OK
    if missing:
        return fail("; ".join(missing), ExitCode.INVALID)
    release_problem = mcore_release.problem(installed_release)
    if release_problem is not None:
        return fail(release_problem, ExitCode.INVALID)
    if where and rank == 0:
        logging.getLogger("megatron_ext").info(where)
    if earlier_vocabulary and rank == 0:
        logging.getLogger("megatron_ext").warning(earlier_vocabulary)

    from megatron_ext.training import loop

    return loop.train(
        cfg,
        tokenizer=checked.tokenizer,
        identity=identity,
        started=started,
        model_provider=model_provider,
        forward_step=forward_step,
        datasets_provider=datasets_provider,
    )
