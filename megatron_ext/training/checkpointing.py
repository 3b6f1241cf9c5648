"""Sharded, layout-independent checkpoints with ``megatron.core.dist_checkpointing``.

Layout on disk (Megatron-LM's)::

    SAVE/latest_checkpointed_iteration.txt   # the last *complete* save
    SAVE/iter_0000100/                       # torch_dist shards + common state

Every tensor is saved under its global (layout-free) key with Megatron-Core's
sharding metadata, and the optimizer in the ``fully_reshardable``
format, so a checkpoint written under one TP/PP/VP/DP loads under another.
The tracker file is written last, atomically, by rank 0 after every rank has
finished: a directory without a tracker entry is never taken as the latest.
Before the tracker, ``checksums.json`` marks the directory complete and holds
a CRC-32 of every file (the ranks share the hashing; ``--no-checkpoint-checksums``
skips it); loading verifies them, so a shard damaged after the save (same size,
other bytes) is an error naming the file rather than silently wrong weights.

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
import os
import random
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from megatron_ext.config.arguments import GROUPS, TrainingConfig, make_config
from megatron_ext.config.factors import divisors
from megatron_ext.config.layout import ParallelLayout
from megatron_ext.config.runtime import TRACKER_FILENAME
from megatron_ext.training.model import unwrap

log = logging.getLogger(__name__)

CHECKSUMS_FILENAME = "checksums.json"
"""Written after every file of a save, before the tracker: the directory is complete."""


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used, with what is wrong and where."""


@dataclass(frozen=True)
class LoadedState:
    iteration: int
    consumed_samples: int
    path: Path | None


def checkpoint_dir(root: str | Path, iteration: int) -> Path:
    return Path(root) / f"iter_{iteration:07d}"


def read_tracker(root: str | Path) -> int | None:
    """The iteration of the latest complete checkpoint under ``root``, or None."""
    tracker = Path(root) / TRACKER_FILENAME
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    if not text.isdigit():
        raise CheckpointError(f"{tracker}: expected an iteration number, found {text!r}")
    return int(text)


def _write_atomically(path: Path, text: str) -> None:
    """Write, fsync, rename, fsync the directory: readers see the old or the new file."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _write_tracker(root: Path, iteration: int) -> None:
    _write_atomically(root / TRACKER_FILENAME, f"{iteration}\n")


def _crc32(file: Path) -> str:
    value = 0
    with open(file, "rb") as f:
        while block := f.read(16 << 20):
            value = zlib.crc32(block, value)
    return f"{value:08x}"


def _my_share(names: list[str]) -> list[str]:
    """This rank's files to hash: the sorted list dealt out round-robin."""
    return names[dist.get_rank() :: dist.get_world_size()]


def _write_checksums(path: Path, *, enabled: bool) -> None:
    """Mark a finished save complete, with the CRC-32 of every file hashed by all ranks (a collective)."""
    merged: dict[str, str] | None = None
    if enabled:
        listing: list[Any] = [None]
        if dist.get_rank() == 0:
            listing[0] = sorted(f.name for f in path.iterdir() if f.is_file() and f.name != CHECKSUMS_FILENAME)
        dist.broadcast_object_list(listing, src=0)
        mine = {name: _crc32(path / name) for name in _my_share(listing[0])}
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        merged = {name: crc for part in gathered for name, crc in part.items()}
    if dist.get_rank() == 0:
        _write_atomically(path / CHECKSUMS_FILENAME, json.dumps({"crc32": merged}, indent=1, sort_keys=True))
    dist.barrier()


def is_complete(path: Path) -> bool:
    """Whether a checkpoint directory's save finished (its manifest exists)."""
    return (path / CHECKSUMS_FILENAME).is_file()


def _verify_checksums(path: Path) -> None:
    """Compare every file with checksums.json (a collective); raise naming the damaged files."""
    manifest = path / CHECKSUMS_FILENAME
    if not manifest.is_file():
        log.warning("%s has no %s (saved by an older version): files are not verified", path, CHECKSUMS_FILENAME)
        return
    try:
        expected: dict[str, str] | None = json.loads(manifest.read_text())["crc32"]
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"{manifest} is damaged ({exc}); resume from an earlier checkpoint") from exc
    if expected is None:
        log.info("%s was saved with --no-checkpoint-checksums: files are not verified", path)
        return
    problems = []
    for name in _my_share(sorted(expected)):
        file = path / name
        if not file.is_file():
            problems.append(f"{file} is missing")
        elif (actual := _crc32(file)) != expected[name]:
            problems.append(f"{file} is corrupted: CRC-32 {actual}, saved as {expected[name]}")
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, problems)
    found = sorted(p for part in gathered for p in part)
    if found:
        raise CheckpointError("; ".join(found) + "; resume from an earlier checkpoint")


def _model_key(index: int, count: int) -> str:
    return "model" if count == 1 else f"model{index}"


def _model_sharded_state_dict(chunks: list[torch.nn.Module]) -> dict[str, Any]:
    # From the unwrapped modules: keys without the DDP wrapper's "module." prefix,
    # as Megatron-LM writes them.
    return {_model_key(i, len(chunks)): unwrap(c).sharded_state_dict() for i, c in enumerate(chunks)}


def _rng_sharded_object(cfg: TrainingConfig) -> Any:
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


def _restore_rng(state: dict[str, Any]) -> None:
    from megatron.core import tensor_parallel

    random.setstate(state["random_rng_state"])
    np.random.set_state(state["np_rng_state"])
    torch.set_rng_state(state["torch_rng_state"])
    if state.get("cuda_rng_state") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda_rng_state"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["rng_tracker_states"])


def _prepare_distributed_optimizer_for_load(optimizer: Any) -> None:
    """Work around two gaps of Megatron-Core 0.16.1's distributed optimizer when
    torch's Adam stands in for apex/TE FusedAdam (always on CPU):

    * ``state_dict()`` reads the per-parameter ``step``, which torch's Adam
      creates only at its first step: give a fresh optimizer placeholder state
      (overwritten by the loaded values);
    * loading copies every state entry, ``step`` included, from the
      checkpoint's per-parameter tensors, which either lack ``step``
      (``fully_reshardable``: it travels in the param groups) or hold the
      placeholder's (``dp_reshardable`` keeps it as a local, unsaved object):
      copy around it and keep the step restored from the param groups;
    * ``load_state_dict`` gives every parameter the *same* ``step`` tensor,
      which torch's Adam then increments once per parameter at each step
      (wrong bias correction from the first step after resuming): see
      :func:`_unshare_adam_steps`, called after loading.
    """
    from megatron.core.optimizer import distrib_optimizer

    if distrib_optimizer.HAVE_APEX_OR_TE:
        return
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        if not isinstance(opt, distrib_optimizer.DistributedOptimizer):
            continue
        inner = opt.optimizer
        for group in inner.param_groups:
            for param in group["params"]:
                if not inner.state[param] and isinstance(inner, torch.optim.Adam):
                    inner.state[param] = {
                        "step": torch.tensor(0.0),
                        "exp_avg": torch.zeros_like(param),
                        "exp_avg_sq": torch.zeros_like(param),
                    }
        if getattr(opt, "_megatron_ext_step_safe", False):
            continue
        original = opt._set_main_param_and_optimizer_states

        def set_states(model_param: Any, tensors: dict[str, Any], *, _opt: Any = opt, _orig: Any = original) -> None:
            group_index, group_order = _opt.model_param_group_index_map[model_param]
            state = _opt.optimizer.state[_opt.optimizer.param_groups[group_index]["params"][group_order]]
            # The step was restored from the param groups; a per-parameter "step" in
            # ``tensors`` is the placeholder's (dp_reshardable keeps it local, unsaved).
            tensors = {key: value for key, value in tensors.items() if key != "step"}
            step = state.pop("step", None)
            try:
                _orig(model_param, tensors)
            finally:
                if step is not None:
                    state["step"] = step

        opt._set_main_param_and_optimizer_states = set_states
        opt._megatron_ext_step_safe = True


def _unshare_adam_steps(optimizer: Any) -> None:
    """Give each parameter its own Adam ``step`` tensor (see above)."""
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        for state in opt.optimizer.state.values():
            step = state.get("step")
            if isinstance(step, torch.Tensor):
                state["step"] = step.clone()


def _check_files(path: Path) -> dict[str, Any]:
    """Check every shard file holds the bytes the index promises (catches
    truncated and missing files, naming them); returns the saved tensors' metadata."""
    from megatron.core import dist_checkpointing
    from torch.distributed.checkpoint import FileSystemReader

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
    return dict(dist_checkpointing.load_tensors_metadata(str(path)))


_VOCAB_TENSORS = ("embedding.word_embeddings.weight", "output_layer.weight")
"""The tensors whose first dimension is the padded vocabulary."""


def saved_padded_vocab_size(root: str | Path) -> int | None:
    """The padded vocabulary of the latest checkpoint under ``root``, from its tensor index (None: none readable).

    Read before any model or process group exists; a damaged checkpoint is
    reported by ``load_checkpoint`` itself.
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


def keep_checkpoint_vocabulary(cfg: TrainingConfig) -> TrainingConfig:
    """``cfg`` with the padded vocabulary of the checkpoint under ``--load``, if there is one.

    Megatron pads the vocabulary to a multiple of ``--make-vocab-size-divisible-by``
    × TP, so another TP would pad it differently; the checkpoint's padding is
    kept whenever the new TP divides it. Rows added beyond it would take part in
    every softmax (a zero row still adds ``exp(0)``), so they cannot be made
    inert: a TP that does not divide it is refused with the sizes and what works.
    """
    if not cfg.run.load:
        return cfg
    saved = saved_padded_vocab_size(cfg.run.load)
    if saved is None or saved == cfg.padded_vocab_size or saved < cfg.vocab_size:
        return cfg  # nothing to keep, or another vocabulary: load_checkpoint names the mismatch
    tp = cfg.layout.tp
    if saved % tp:
        working = [t for t in divisors(saved) if t <= 8 and cfg.model.num_attention_heads % t == 0]
        raise CheckpointError(
            f"{cfg.run.load}: the checkpoint's padded vocabulary ({saved:,} rows for {cfg.vocab_size:,} tokens) "
            f"is not divisible by tensor({tp}), and extra rows would change every softmax; resume under TP in "
            f"{working}. For checkpoints that move between TP 1, 2, 4 and 8, train with "
            f"--make-vocab-size-divisible-by {cfg.model.make_vocab_size_divisible_by * 8} (padding to a multiple "
            "that each of them divides)"
        )
    return dataclasses.replace(cfg, checkpoint_padded_vocab_size=saved)


def _check_shapes(path: Path, model_sd: dict[str, Any], saved: dict[str, Any]) -> None:
    """Every model tensor must exist in the checkpoint with the same global shape.

    The vocabulary tensors too: the run keeps the checkpoint's padding
    (``keep_checkpoint_vocabulary``), so a difference there is an error as well.
    """
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    problems = []
    for item in nested_values(model_sd):
        if not isinstance(item, ShardedTensor):
            continue
        if item.key not in saved:
            problems.append(f"{item.key}: not in the checkpoint")
            continue
        want, have = tuple(item.global_shape), tuple(saved[item.key].global_shape)
        if want != have:
            problems.append(f"{item.key}: checkpoint has shape {have}, this model needs {want}")
    if problems:
        shown = sorted(set(problems))
        more = f"\n  … and {len(shown) - 10} more" if len(shown) > 10 else ""
        raise CheckpointError(
            f"{path} does not match the model given by the arguments:\n  "
            + "\n  ".join(shown[:10])
            + more
            + "\n(check --num-layers, --hidden-size, --ffn-hidden-size, heads/groups, --swiglu, "
            "--untie-embeddings-and-output-weights and --position-embedding-type against the saved run)"
        )


def _optimizer_metadata(cfg: TrainingConfig) -> dict[str, Any]:
    """Megatron-Core's sharded-state-dict metadata for the optimizer format chosen by the flags."""
    run = cfg.run
    return {
        "distrib_optim_sharding_type": "fully_reshardable"
        if run.dist_ckpt_optim_fully_reshardable
        else "dp_reshardable",
        "distrib_optim_fully_reshardable_mem_efficient": run.distrib_optim_fully_reshardable_mem_efficient,
    }


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


def _arguments_record(cfg: TrainingConfig) -> dict[str, Any]:
    """The run's arguments by group (as Megatron-LM keeps ``args``), with the tokenizer's vocabulary: what a
    one-process reader (``megatron_ext.inference``, the Hugging Face export) rebuilds the model and tokenizer
    from. Plain values only, so that ``torch.load(weights_only=True)`` reads them."""
    record: dict[str, Any] = {name: dataclasses.asdict(getattr(cfg, name)) for name in GROUPS}
    record["tokenizer_vocab_size"] = cfg.tokenizer_vocab_size
    return record


def _saved_common(path: Path) -> dict[str, Any]:
    from megatron.core import dist_checkpointing

    try:
        common = dist_checkpointing.load_common_state_dict(str(path))
    except Exception as exc:
        raise CheckpointError(f"{path}/common.pt cannot be read ({type(exc).__name__}: {exc})") from exc
    return common if isinstance(common, dict) else {}


def saved_arguments(path: Path) -> dict[str, Any] | None:
    """The arguments record of one checkpoint directory (None: saved before records were kept)."""
    args = _saved_common(path).get("args")
    return args if isinstance(args, dict) else None


@dataclass(frozen=True)
class SavedRun:
    """What a checkpoint says of the run that wrote it: its configuration, layout included."""

    config: TrainingConfig
    """The run's configuration at the world size it ran on (``config.layout``: its layout)."""
    layout_record: dict[str, Any]
    """The layout as recorded (``common.pt`` ``"layout"``), for ``per_rank_format_refusal``."""


def saved_run(path: Path) -> SavedRun | None:
    """The configuration a checkpoint was written with (None: saved before the records were kept)."""
    common = _saved_common(path)
    args, layout = common.get("args"), common.get("layout")
    if not isinstance(args, dict) or not isinstance(layout, dict):
        return None
    parallel = args["parallel"]
    world = layout["tp"] * parallel.get("context_parallel_size", 1) * layout["pp"] * layout["dp"]
    try:
        # Fields this version does not have are left out; those it added take their defaults.
        groups: dict[str, Any] = {
            name: {k: v for k, v in args[name].items() if k in {f.name for f in dataclasses.fields(cls)}}
            for name, cls in GROUPS.items()
        }
        config = make_config(world_size=world, **groups)
    except (ValueError, KeyError) as exc:  # a record this version cannot rebuild
        raise CheckpointError(f"{path}/common.pt: the saved arguments do not rebuild the run's layout: {exc}") from exc
    return SavedRun(config=config, layout_record=layout)


def _common_state(cfg: TrainingConfig, *, iteration: int, consumed_samples: int) -> dict[str, Any]:
    """What every save records besides tensors and optimizer (one rank's copy; ``common.pt``)."""
    return {
        "iteration": iteration,
        "consumed_samples": consumed_samples,
        "layout": _layout_record(cfg),
        "vocab_size": cfg.vocab_size,
        "args": _arguments_record(cfg),
        "checkpoint_version": 3.0,
    }


def _layout_record(cfg: TrainingConfig) -> dict[str, Any]:
    layout = cfg.layout
    return {
        "tp": layout.tp,
        "pp": layout.pp,
        "vp": layout.vp,
        "dp": layout.dp,
        "distributed_optimizer": layout.use_distributed_optimizer,
        "stages": _stage_record(layout),
    }


def _stage_record(layout: ParallelLayout) -> list[list[int]]:
    """Transformer layers of every [pipeline rank][virtual stage]: what a per-rank optimizer shard covers."""
    return [[chunk.num_layers for chunk in rank] for rank in layout.stages]


def per_rank_format_refusal(saved_layout: dict[str, Any], layout: ParallelLayout) -> str | None:
    """Why a per-rank (``dp_reshardable``) distributed-optimizer state cannot load under ``layout``, or None.

    Each rank's shard is a flat buffer over its chunks' parameters: it survives a change of DP only.
    Checkpoints written before the stage split was recorded compare TP, PP and VP.
    """
    changed = [k for k in ("tp", "pp", "vp") if saved_layout.get(k) != getattr(layout, k)]
    if changed:
        was = " × ".join(f"{k.upper()} {saved_layout.get(k)}" for k in changed)
        now = " × ".join(f"{k.upper()} {getattr(layout, k)}" for k in changed)
    elif saved_layout.get("stages", _stage_record(layout)) != _stage_record(layout):
        was = f"layers per pipeline rank and virtual stage {saved_layout['stages']}"
        now = f"{_stage_record(layout)}"
    else:
        return None
    return (
        f"its distributed-optimizer state was saved per rank (loadable under another DP only) with {was}, "
        f"and this run has {now}. Resume once with the saved layout and --dist-ckpt-optim-fully-reshardable, "
        "or pass --no-load-optim to load only the model"
    )


def _iteration_dirs(root: Path) -> dict[int, Path]:
    found = {}
    for child in root.glob("iter_*"):
        suffix = child.name[len("iter_") :]
        if child.is_dir() and suffix.isdigit():
            found[int(suffix)] = child
    return found


def _remove_incomplete(root: Path, *, also: Path) -> None:
    """Delete directories of saves that never completed (killed before their
    manifest was written), and whatever is in the way of the one about to be
    written: a complete one there belongs to a run that went further than the
    one resumed (its tracker was rolled back)."""
    for path in _iteration_dirs(root).values():
        if not is_complete(path):
            log.warning("removing incomplete checkpoint %s", path)
            shutil.rmtree(path)
        elif path == also:
            log.warning("replacing checkpoint %s, left by a run that went further than this one", path)
            shutil.rmtree(path)


def check_save_directory(root: str | Path, *, start_iteration: int, announce: bool = True) -> None:
    """Refuse a --save directory whose checkpoints this run would overwrite.

    A run continues from ``start_iteration``; a tracker beyond it means the
    directory holds a further run (e.g. ``--finetune`` into the pretraining
    directory), whose checkpoints would be replaced as this one reaches them.
    """
    latest = read_tracker(root)
    if latest is not None and latest > start_iteration:
        raise CheckpointError(
            f"--save {root} already holds checkpoints up to iteration {latest}, beyond this run's start "
            f"({start_iteration}); saving there would replace them. Use another --save directory, or "
            f"--load {root} to continue that run"
        )
    newer = sorted(i for i, p in _iteration_dirs(Path(root)).items() if i > start_iteration and is_complete(p))
    if newer and announce:
        log.warning(
            "--save %s holds complete checkpoints beyond iteration %d (%s): they are replaced as training reaches them",
            root,
            start_iteration,
            ", ".join(map(str, newer)),
        )


def _prune(root: Path, *, keep: int) -> None:
    """Keep the newest ``keep`` complete checkpoints (the tracked one always)."""
    latest = read_tracker(root)
    if latest is None:
        return
    complete = sorted(i for i, path in _iteration_dirs(root).items() if i <= latest and is_complete(path))
    for iteration in complete[:-keep]:
        shutil.rmtree(checkpoint_dir(root, iteration))
        log.info("removed old checkpoint %s (--keep-last-checkpoints %d)", checkpoint_dir(root, iteration), keep)


def save_checkpoint(
    *,
    root: str | Path,
    iteration: int,
    consumed_samples: int,
    chunks: list[torch.nn.Module],
    optimizer: Any,
    scheduler: Any,
    cfg: TrainingConfig,
    async_queue: Any = None,
) -> Path:
    """Save everything needed to resume exactly; returns the checkpoint directory.

    With ``async_queue`` (a Megatron-Core ``AsyncCallsQueue``) the shards are
    written in the background; the tracker is updated by the request's
    finalisation, after every rank's files are complete.
    """
    from megatron.core import dist_checkpointing

    root = Path(root)
    target = checkpoint_dir(root, iteration)
    if dist.get_rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        _remove_incomplete(root, also=target)
        target.mkdir()
    dist.barrier()

    model_sd = _model_sharded_state_dict(chunks)
    state: dict[str, Any] = dict(model_sd)
    metadata = _optimizer_metadata(cfg)
    # No optimizer state before the first successful step: a seed checkpoint, or
    # a run whose steps were all skipped (non-finite losses, fp16 overflows).
    has_optimizer = _optimizer_has_state(optimizer, device=next(chunks[0].parameters()).device)
    if has_optimizer:
        state["optimizer"] = optimizer.sharded_state_dict(model_sd, is_loading=False, metadata=metadata)
    state["has_optimizer_state"] = has_optimizer
    state["optimizer_format"] = metadata["distrib_optim_sharding_type"]
    state["opt_param_scheduler"] = scheduler.state_dict()
    state["rng_state"] = _rng_sharded_object(cfg)
    state.update(_common_state(cfg, iteration=iteration, consumed_samples=consumed_samples))

    def publish() -> None:
        # Runs on every rank once all files are written (also for async saves).
        _publish(root, target, iteration, cfg)

    strategy = _save_strategy()
    if async_queue is not None:
        request = dist_checkpointing.save(
            state, str(target), strategy, content_metadata=metadata, async_sharded_save=True
        )
        request.add_finalize_fn(publish)
        async_queue.schedule_async_request(request)
        return target
    dist_checkpointing.save(state, str(target), strategy, content_metadata=metadata)
    dist.barrier()
    publish()
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
    """Mark a save complete (checksums), then make it the latest (tracker), then prune (every rank calls it)."""
    _write_checksums(target, enabled=not cfg.run.no_checkpoint_checksums)
    if dist.get_rank() == 0:
        _write_tracker(root, iteration)
        if cfg.run.keep_last_checkpoints > 0:
            _prune(root, keep=cfg.run.keep_last_checkpoints)


def save_weights(root: str | Path, model: torch.nn.Module, cfg: TrainingConfig) -> Path:
    """A checkpoint of the weights alone at iteration 0, as a seed checkpoint (``--train-iters 0 --save``) is:
    no optimizer state, so a run that loads it starts training from these weights under any layout. For
    weights made elsewhere (``tools/convert_checkpoint.py from-hf``); one process (a collective)."""
    from megatron.core import dist_checkpointing

    root = Path(root)
    target = checkpoint_dir(root, 0)
    if dist.get_rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        _remove_incomplete(root, also=target)
        target.mkdir()
    dist.barrier()
    state: dict[str, Any] = _model_sharded_state_dict([model])
    state.update(has_optimizer_state=False, rng_state=_rng_sharded_object(cfg))
    state.update(_common_state(cfg, iteration=0, consumed_samples=0))
    dist_checkpointing.save(state, str(target))
    dist.barrier()
    _publish(root, target, 0, cfg)
    dist.barrier()
    return target


def verify_checkpoint(path: Path) -> dict[str, Any]:
    """Every file of one checkpoint directory present, whole and (unless saved without) matching its CRC-32;
    returns the saved tensors' metadata by key (a collective). CheckpointError names what is wrong."""
    saved = _check_files(path)
    _verify_checksums(path)
    return saved


def resolve_iteration(root: str | Path, iteration: int | None) -> Path:
    """The directory of checkpoint ``iteration`` under ``root`` (None: the latest), which must be complete."""
    root = Path(root)
    latest = read_tracker(root)
    if latest is None:
        raise CheckpointError(f"{root} holds no checkpoint ({TRACKER_FILENAME} is missing); check the path")
    if iteration is None:
        iteration = latest
    path = checkpoint_dir(root, iteration)
    if not path.is_dir() or not is_complete(path):
        have = sorted(i for i, d in _iteration_dirs(root).items() if is_complete(d))
        raise CheckpointError(
            f"{root} has no complete checkpoint of iteration {iteration}; complete ones: {have or 'none'}"
        )
    return path


def load_checkpoint(
    *,
    root: str | Path,
    chunks: list[torch.nn.Module],
    optimizer: Any,
    scheduler: Any,
    cfg: TrainingConfig,
    iteration: int | None = None,
) -> LoadedState:
    """Load the latest complete checkpoint under ``root`` (or that of ``iteration``) into the model (and,
    unless told not to, optimizer, scheduler and RNG). Missing → fresh start."""
    from megatron.core import dist_checkpointing

    run = cfg.run
    if iteration is not None:
        iteration = int(resolve_iteration(root, iteration).name.removeprefix("iter_"))
    else:
        iteration = read_tracker(root)
    if iteration is None:
        if run.strict_load:
            raise CheckpointError(
                f"--strict-load: no checkpoint under --load {root} (no {TRACKER_FILENAME}); "
                "check the path, or drop --strict-load to start from scratch"
            )
        log.warning("no checkpoint found under --load %s: starting from scratch", root)
        return LoadedState(iteration=0, consumed_samples=0, path=None)
    path = checkpoint_dir(root, iteration)
    if not path.is_dir():
        raise CheckpointError(f"{root}/{TRACKER_FILENAME} names iteration {iteration} but {path} does not exist")

    saved_tensors = _check_files(path) if run.no_checkpoint_checksums else verify_checkpoint(path)
    try:
        common = dist_checkpointing.load_common_state_dict(str(path))
    except Exception as exc:
        raise CheckpointError(f"{path}/common.pt cannot be read ({type(exc).__name__}: {exc})") from exc
    saved_layout = common.get("layout", {})
    saved_vocab = common.get("vocab_size")
    if saved_vocab is not None and saved_vocab != cfg.vocab_size:
        raise CheckpointError(
            f"{path} was trained with a vocabulary of {saved_vocab:,} tokens and this run's tokenizer has "
            f"{cfg.vocab_size:,}; use the tokenizer (or --vocab-size) of the saved run"
        )
    model_sd = _model_sharded_state_dict(chunks)
    request: dict[str, Any] = dict(model_sd)
    load_optim = not (run.no_load_optim or run.finetune) and bool(common.get("has_optimizer_state", True))
    saved_distributed = saved_layout.get("distributed_optimizer")
    if load_optim and saved_distributed is not None and saved_distributed != cfg.layout.use_distributed_optimizer:
        # The two optimizers keep different state structures (the distributed one
        # holds fp32 master shards and per-group metadata).
        raise CheckpointError(
            f"{path}: the optimizer state was saved "
            f"{'with' if saved_distributed else 'without'} --use-distributed-optimizer and this run is "
            f"{'with' if cfg.layout.use_distributed_optimizer else 'without'} it; use the same setting, "
            "or pass --no-load-optim to load only the model"
        )
    saved_format = common.get("optimizer_format", "fully_reshardable")
    if load_optim and cfg.layout.use_distributed_optimizer and saved_format == "dp_reshardable":
        refusal = per_rank_format_refusal(saved_layout, cfg.layout)
        if refusal:
            raise CheckpointError(f"{path}: {refusal}")
    if load_optim:
        _prepare_distributed_optimizer_for_load(optimizer)
        request["optimizer"] = optimizer.sharded_state_dict(
            model_sd, is_loading=True, metadata={"distrib_optim_sharding_type": saved_format}
        )
    same_grid = saved_layout.get("tp") == cfg.layout.tp and saved_layout.get("pp") == cfg.layout.pp
    load_rng = not (run.no_load_rng or run.finetune) and same_grid
    if not load_rng and not (run.no_load_rng or run.finetune):
        log.warning("checkpoint layout %s differs from this run's TP/PP: RNG states are not restored", saved_layout)
    if load_rng:
        request["rng_state"] = _rng_sharded_object(cfg)

    _check_shapes(path, model_sd, saved_tensors)
    try:
        loaded = dist_checkpointing.load(request, str(path))
    except (Exception, CheckpointException) as exc:  # torch's CheckpointException is a BaseException
        raise CheckpointError(
            f"{path} could not be loaded ({type(exc).__name__}: {str(exc)[:2000]}); "
            "if its files are damaged, resume from an earlier checkpoint"
        ) from exc
    for i, chunk in enumerate(chunks):
        unwrap(chunk).load_state_dict(loaded[_model_key(i, len(chunks))])
    if load_optim:
        # Copies into main parameters that require grad (fp32 training): not a graph operation.
        with torch.no_grad():
            optimizer.load_state_dict(loaded["optimizer"])
        _unshare_adam_steps(optimizer)
        try:
            scheduler.load_state_dict(common["opt_param_scheduler"])
        except AssertionError as exc:
            raise CheckpointError(
                f"{path}: the learning-rate schedule differs from the checkpoint's ({exc}); pass "
                "--override-opt_param-scheduler to use this run's flags or --use-checkpoint-opt_param-scheduler "
                "to keep the checkpoint's"
            ) from exc
    if load_rng:
        _restore_rng(loaded["rng_state"])
    if run.finetune:
        return LoadedState(iteration=0, consumed_samples=0, path=path)
    return LoadedState(iteration=int(common["iteration"]), consumed_samples=int(common["consumed_samples"]), path=path)
