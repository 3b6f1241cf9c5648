"""Sharded, layout-independent checkpoints with ``megatron.core.dist_checkpointing``: saving, and the checks that
loading runs (``checkpoint_loading`` loads, ``resume`` chooses which checkpoint).

The directory format, the order in which a save is published and the rules
that keep a user's checkpoints safe are ``megatron_ext.checkpoint.on_disk``
(no torch); this module is the I/O. Every tensor is saved under its global
(layout-free) key with Megatron-Core's sharding metadata, so a checkpoint
written under one TP/PP/VP/DP loads under another. ``checksums.json`` holds a
CRC-32 of every file (the ranks share the hashing; ``--no-checkpoint-checksums``
skips it); loading verifies them, so a shard damaged after the save (same size,
other bytes) is an error naming the file rather than silently wrong weights.
A filesystem step done by rank 0 alone reports its failure to every rank
(``on_rank0``), and a save that fails removes its own directory
(``save_failed``): one error line, never a partial save left behind. Once
the tracker names a save, no failure path removes it.

The distributed optimizer's state is saved as Megatron-LM does: by default
each rank writes its own shard (``dp_reshardable``: parallel, loadable under
another DP only); ``--dist-ckpt-optim-fully-reshardable`` saves it per
parameter (``fully_reshardable``: loadable under any layout, gathered over DP
at every save). The regular optimizer's state is always per parameter.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from megatron_ext.checkpoint import on_disk, records
from megatron_ext.checkpoint.on_disk import (
    CHECKSUMS_FILENAME,
    TRACKER_FILENAME,
    CheckpointError,
    checkpoint_dir,
    read_tracker,
    resolve_iteration,
)
from megatron_ext.checkpoint.run_identity import (
    RunIdentity,
)
from megatron_ext.config.training_config import TrainingConfig
from megatron_ext.training import helper_processes, save_faults
from megatron_ext.training.model import unwrap
from megatron_ext.training.save_faults import save_failed

__all__ = [
    "CHECKSUMS_FILENAME",
    "TRACKER_FILENAME",
    "CheckpointError",
    "checkpoint_dir",
    "read_tracker",
    "resolve_iteration",
    "save_checkpoint",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


def _my_share(names: list[str]) -> list[str]:
    """This rank's files to hash: the sorted list dealt out round-robin."""
    return names[dist.get_rank() :: dist.get_world_size()]


def on_rank0[T](action: Callable[[], T], *, what: str) -> T | None:
    """Run a filesystem step on rank 0 and tell every rank whether it failed (a collective): a failure is one
    CheckpointError on every rank instead of rank 0's traceback and the others waiting in the next collective."""
    error: list[str | None] = [None]
    result = None
    if dist.get_rank() == 0:
        try:
            result = action()
        except CheckpointError as exc:
            error[0] = str(exc)
        except OSError as exc:
            where = f" ({exc.filename})" if exc.filename else ""
            error[0] = f"{what}{where}: {on_disk.os_error_text(exc)}; {on_disk.os_error_fix(exc)}"
    dist.broadcast_object_list(error, src=0)
    if error[0] is not None:
        raise CheckpointError(error[0])
    return result


def _write_checksums(path: Path, *, enabled: bool) -> None:
    """Mark a finished save complete, with the CRC-32 of every file hashed by all ranks (a collective)."""
    merged: dict[str, str] | None = None
    if enabled:
        listing: list[Any] = [None]
        if dist.get_rank() == 0:
            listing[0] = on_disk.files_to_hash(path)
        dist.broadcast_object_list(listing, src=0)
        mine = {name: on_disk.crc32(path / name) for name in _my_share(listing[0])}
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        merged = {name: crc for part in gathered for name, crc in part.items()}
    manifest = json.dumps({"crc32": merged}, indent=1, sort_keys=True)
    on_rank0(
        lambda: on_disk.write_atomically(path / CHECKSUMS_FILENAME, manifest), what=f"cannot write {path}'s checksums"
    )


def _verify_checksums(path: Path) -> None:
    """Compare every file with checksums.json (a collective); raise naming the damaged files."""
    if not (path / CHECKSUMS_FILENAME).is_file():
        log.warning(
            "%s has no %s (saved by an older version): its files are not verified, and it is kept as it is "
            "(never removed or replaced; the next save goes to a new directory)",
            path,
            CHECKSUMS_FILENAME,
        )
        return
    expected = on_disk.read_checksums(path)
    if expected is None:
        log.info("%s was saved with --no-checkpoint-checksums: files are not verified", path)
        return
    problems = []
    for name in _my_share(sorted(expected)):
        file = path / name
        if not file.is_file():
            problems.append(f"{file} is missing")
        elif (actual := on_disk.crc32(file)) != expected[name]:
            problems.append(f"{file} is corrupted: CRC-32 {actual}, saved as {expected[name]}")
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, problems)
    found = sorted(p for part in gathered for p in part)
    if found:
        raise CheckpointError("; ".join(found) + "; resume from an earlier checkpoint")


def model_key(index: int, count: int) -> str:
    return "model" if count == 1 else f"model{index}"


def model_sharded_state_dict(chunks: list[torch.nn.Module]) -> dict[str, Any]:
    # From the unwrapped modules: keys without the DDP wrapper's "module." prefix,
    # as Megatron-LM writes them.
    return {model_key(i, len(chunks)): unwrap(c).sharded_state_dict() for i, c in enumerate(chunks)}


def rng_sharded_object(cfg: TrainingConfig) -> Any:
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    state = {
        "random_rng_state": random.getstate(),
        "np_rng_state": np.random.get_state(),
        "torch_rng_state": torch.get_rng_state(),
        "cuda_rng_state": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "rng_tracker_states": tensor_parallel.get_cuda_rng_tracker().get_states(),
    }
    return ShardedObject(
        "rng_state",
        state,
        (cfg.layout.pp, cfg.layout.tp),
        (parallel_state.get_pipeline_model_parallel_rank(), parallel_state.get_tensor_model_parallel_rank()),
        replica_id=parallel_state.get_data_parallel_rank(with_context_parallel=True),
    )


def check_files(path: Path) -> dict[str, Any]:
    """Check every shard file holds the bytes the index promises (catches
    truncated and missing files, naming them); returns the saved tensors' metadata."""
    from megatron.core import dist_checkpointing

    check_sizes(path)
    return dict(dist_checkpointing.load_tensors_metadata(str(path)))


def check_sizes(path: Path) -> None:
    """Megatron-Core's files are there, and every shard file holds the bytes torch's index promises (no process
    group needed)."""
    from torch.distributed.checkpoint import FileSystemReader

    on_disk.check_structure(path)
    try:
        storage = FileSystemReader(str(path)).read_metadata().storage_data
    except Exception as exc:
        raise CheckpointError(f"{path}/.metadata cannot be read ({type(exc).__name__}: {exc})") from exc
    needed: dict[str, int] = {}
    for info in storage.values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(needed.items()):
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{file} is missing: the checkpoint is incomplete")
        actual = file.stat().st_size
        if actual < size:
            raise CheckpointError(
                f"{file} is truncated: {actual:,} bytes, the index needs {size:,}; resume from an earlier checkpoint"
            )


_VOCAB_TENSORS = ("embedding.word_embeddings.weight", "output_layer.weight")
"""The tensors whose first dimension is the padded vocabulary."""


def saved_padded_vocab_size(root: str | Path) -> int | None:
    """The padded vocabulary of the latest checkpoint under ``root``, from its tensor index (None: none readable).

    Read before any model or process group exists; a damaged checkpoint is
    reported by ``checkpoint_loading.load_checkpoint`` itself.
    """
    iteration = read_tracker(root)
    if iteration is None:
        return None
    return padded_vocab_of(checkpoint_dir(root, iteration))


def padded_vocab_of(path: Path) -> int | None:
    """The padded vocabulary (rows of the embedding or output layer) of one checkpoint directory, or None."""
    from torch.distributed.checkpoint import FileSystemReader

    try:
        metadata = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    except Exception:
        return None
    for key, item in metadata.items():
        size = getattr(item, "size", None)
        if size is not None and key.endswith(_VOCAB_TENSORS):
            return int(size[0])
    return None


def keep_earlier_null_vocabulary(cfg: TrainingConfig) -> tuple[TrainingConfig, str | None]:
    """``cfg`` resuming, with NullTokenizer's ``--vocab-size``, a run whose checkpoints were trained under
    Megatron-LM's earlier meaning of it (``records.null_vocabulary_before_0_17``): the vocabulary of those
    checkpoints kept, and the line that says so; else ``cfg`` and None. Read from the newest checkpoint under
    ``--load`` whose common state reads (the resume's own checks choose the one it loads)."""
    data, flag = cfg.data, cfg.model.vocab_size
    if not cfg.run.load or data.tokenizer_type != "NullTokenizer" or data.null_tokenizer_eod_id is not None:
        return cfg, None
    for iteration in reversed(on_disk.complete_iterations(cfg.run.load)):
        try:
            common = saved_common(checkpoint_dir(cfg.run.load, iteration))
        except CheckpointError:
            continue
        earlier = records.null_vocabulary_before_0_17(common)
        if earlier is None or common["args"]["model"]["vocab_size"] != flag:
            return cfg, None
        note = (
            f"--vocab-size {flag} (NullTokenizer): {cfg.run.load} was trained before Megatron-LM 0.17 counted the "
            f"end of document in it ({earlier:,} ids, end of document {earlier - 1:,}); the run keeps that "
            f"vocabulary, as --vocab-size {earlier} gives it now"
        )
        return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=earlier)), note
    return cfg, None


def keep_checkpoint_vocabulary(cfg: TrainingConfig) -> TrainingConfig:
    """``cfg`` keeping the padded vocabulary of the checkpoint under ``--load`` (``records.keep_vocabulary``)."""
    return records.keep_vocabulary(cfg, saved_padded_vocab_size(cfg.run.load)) if cfg.run.load else cfg


def _optimizer_has_state(optimizer: Any, *, device: torch.device) -> bool:
    """Whether every rank's optimizer has taken a step (torch's Adam creates its state then).

    A rank whose shard holds no parameters has nothing to wait for.
    """
    mine = all(
        bool(opt.optimizer.state.get(param))
        for opt in getattr(optimizer, "chained_optimizers", [optimizer])
        for group in opt.optimizer.param_groups
        for param in group["params"]
    )
    flag = torch.tensor([1 if mine else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def saved_common(path: Path) -> dict[str, Any]:
    """The common state of one checkpoint directory: the iteration, the run's arguments, layout and identity (Megatron-Core
    0.19 keeps it as the ``common_state`` object in the torch_dist files; older checkpoints have it in ``common.pt``)."""
    from megatron.core import dist_checkpointing

    on_disk.check_structure(path)
    try:
        common = dist_checkpointing.load_common_state_dict(str(path))
    except Exception as exc:
        raise CheckpointError(f"the common state of {path} cannot be read ({type(exc).__name__}: {exc})") from exc
    return common if isinstance(common, dict) else {}


def saved_run(path: Path) -> records.SavedRun | None:
    """The configuration a checkpoint was written with (``records.saved_run`` of its common state)."""
    return records.saved_run(path, saved_common(path))


def save_checkpoint(
    *,
    root: str | Path,
    iteration: int,
    consumed_samples: int,
    chunks: list[torch.nn.Module],
    optimizer: Any,
    scheduler: Any,
    cfg: TrainingConfig,
    identity: RunIdentity | None,
    async_queue: Any = None,
) -> Path:
    """Save everything needed to resume exactly; returns the checkpoint directory.

    With ``async_queue`` (a Megatron-Core ``AsyncCallsQueue``) the shards are
    written in the background; the tracker is updated by the request's
    finalisation, after every rank's files are complete (a failure there is the
    caller's to pass to ``save_failed``). A failed synchronous save removes its
    directory and raises one CheckpointError on every rank.
    """
    from megatron.core import dist_checkpointing

    root = Path(root)
    target = checkpoint_dir(root, iteration)

    def start() -> None:
        for path in on_disk.remove_partial_saves(root):
            log.warning("removed %s: a save that never finished (%s)", path, on_disk.SAVING_FILENAME)
        on_disk.start_save(root, iteration, overwrite=cfg.run.overwrite_checkpoints)

    on_rank0(start, what=f"cannot start checkpoint {target}")

    model_sd = model_sharded_state_dict(chunks)
    state: dict[str, Any] = dict(model_sd)
    metadata = records.optimizer_metadata(cfg)
    # No optimizer state before the first successful step: a seed checkpoint, or
    # a run whose steps were all skipped (non-finite losses, fp16 overflows).
    # --no-save-optim leaves it out (every rank has the same flags, so the collective below is skipped alike).
    has_optimizer = not cfg.run.no_save_optim and _optimizer_has_state(
        optimizer, device=next(chunks[0].parameters()).device
    )
    if has_optimizer:
        state["optimizer"] = optimizer.sharded_state_dict(model_sd, is_loading=False, metadata=metadata)
    state["has_optimizer_state"] = has_optimizer
    state["optimizer_format"] = metadata["distrib_optim_sharding_type"]
    state["opt_param_scheduler"] = scheduler.state_dict()
    if not cfg.run.no_save_rng:
        state["rng_state"] = rng_sharded_object(cfg)
    state["has_rng_state"] = not cfg.run.no_save_rng
    state.update(records.common_state(cfg, iteration=iteration, consumed_samples=consumed_samples, identity=identity))

    strategy = _save_strategy()
    helper_processes.start_checkpoint_results_queue(across_processes=async_queue is not None)
    save_faults.fault_point("before-shards", iteration)
    if async_queue is not None:
        try:
            request = dist_checkpointing.save(
                state,
                str(target),
                strategy,
                content_metadata=metadata,
                async_sharded_save=True,
                # Megatron-Core 0.19 defaults to "nvrx" (nvidia-resiliency-ext); "mcore" is its own (deprecated).
                async_strategy="mcore",
            )
        except (Exception, CheckpointException) as exc:  # torch's CheckpointException is a BaseException
            raise save_failed(target, exc) from exc
        # Runs on every rank once all files are written; a failure is the caller's to pass to save_failed.
        request.add_finalize_fn(lambda: _publish(root, target, iteration, cfg))
        async_queue.schedule_async_request(request)
        return target
    try:
        with helper_processes.helpers_watched(f"the save of {target}"):
            dist_checkpointing.save(state, str(target), strategy, content_metadata=metadata)
        dist.barrier()
        _publish(root, target, iteration, cfg)
    except (Exception, CheckpointException) as exc:
        raise save_failed(target, exc) from exc
    dist.barrier()
    return target


def _save_strategy() -> Any:
    """Megatron-LM's default save (``--ckpt-fully-parallel-save``): a tensor replicated over the data-parallel
    ranks (the weights; the fully reshardable optimizer state) is written by one of them, the tensors spread
    evenly over the group, instead of all by DP rank 0. Only metadata is exchanged to decide who writes what."""
    from megatron.core import parallel_state
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper

    return FullyParallelSaveStrategyWrapper(
        get_default_save_sharded_strategy(), parallel_state.get_data_parallel_group(with_context_parallel=True)
    )


def _publish(root: Path, target: Path, iteration: int, cfg: TrainingConfig) -> None:
    """Mark a save complete (checksums), make it the latest (tracker), drop its in-progress marker, then prune
    (every rank calls it; on_disk's docstring gives the order and why)."""
    save_faults.fault_point("after-shards", iteration)
    _write_checksums(target, enabled=not cfg.run.no_checkpoint_checksums)
    save_faults.fault_point("after-checksums", iteration)

    def track() -> None:
        on_disk.write_tracker(root, iteration)
        save_faults.fault_point("after-tracker", iteration)
        on_disk.finish_save(target)
        if cfg.run.keep_last_checkpoints > 0:
            for path in on_disk.prune(root, keep=cfg.run.keep_last_checkpoints):
                log.info("removed old checkpoint %s (--keep-last-checkpoints %d)", path, cfg.run.keep_last_checkpoints)

    on_rank0(track, what=f"cannot publish checkpoint {target}")
    save_faults.fault_point("published", iteration)


def save_weights(root: str | Path, model: torch.nn.Module, cfg: TrainingConfig, identity: RunIdentity | None) -> Path:
    """A checkpoint of the weights alone at iteration 0, as a seed checkpoint (``--train-iters 0 --save``) is:
    no optimizer state, so a run that loads it starts training from these weights under any layout. For
    weights made elsewhere (``tools/convert_checkpoint.py from-hf``); one process (a collective)."""
    from megatron.core import dist_checkpointing

    root = Path(root)
    target = checkpoint_dir(root, 0)
    on_rank0(lambda: on_disk.start_save(root, 0, overwrite=False), what=f"cannot start checkpoint {target}")
    state: dict[str, Any] = model_sharded_state_dict([model])
    state.update(has_optimizer_state=False, rng_state=rng_sharded_object(cfg))
    state.update(records.common_state(cfg, iteration=0, consumed_samples=0, identity=identity))
    # Its writer threads' results in a thread queue, as a run's synchronous save: Megatron-Core would otherwise
    # spawn its own results-queue server (a second interpreter importing torch, unguarded) for this one save.
    helper_processes.start_checkpoint_results_queue(across_processes=False)
    try:
        dist_checkpointing.save(state, str(target))
        dist.barrier()
        _publish(root, target, 0, cfg)
    except (Exception, CheckpointException) as exc:
        raise save_failed(target, exc) from exc
    dist.barrier()
    return target


def verify_checkpoint(path: Path) -> dict[str, Any]:
    """Every file of one checkpoint directory present, whole and (unless saved without) matching its CRC-32;
    returns the saved tensors' metadata by key (a collective). CheckpointError names what is wrong."""
    saved = check_files(path)
    _verify_checksums(path)
    return saved
