"""Loading a checkpoint into a run: which one (``resume.newest_that_passes``), then the model chunks and, unless
told not to, the optimizer, the learning-rate scheduler and the RNG states.

The save side, the sharded state dicts both sides build and the checks a load runs are in
``megatron_ext.training.checkpointing``; a checkpoint saved under one TP/PP/VP/DP loads under another, because
every tensor is saved under its global key.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.api import CheckpointException

from megatron_ext.checkpoint import on_disk, records
from megatron_ext.checkpoint.on_disk import TRACKER_FILENAME, CheckpointError, read_tracker, resolve_iteration
from megatron_ext.checkpoint.run_identity import RunIdentity
from megatron_ext.config.training_config import TrainingConfig
from megatron_ext.training import checkpointing, resume
from megatron_ext.training.model import unwrap

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedState:
    iteration: int
    consumed_samples: int
    path: Path | None
    skipped: tuple[tuple[int, str, str], ...] = ()
    """Damaged checkpoints passed over to load this one, newest first: (iteration, why, where it was moved)."""


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


def load_checkpoint(
    *,
    root: str | Path,
    chunks: list[torch.nn.Module],
    optimizer: Any,
    scheduler: Any,
    cfg: TrainingConfig,
    identity: RunIdentity | None,
    iteration: int | None = None,
) -> LoadedState:
    """Load the latest complete checkpoint under ``root`` (or that of ``iteration``) into the model (and,
    unless told not to, optimizer, scheduler and RNG). Missing → fresh start, unless ``root`` holds finished
    checkpoints without a tracker (``on_disk.check_load_directory``). ``identity``: this run's tokenizer and
    data, compared with the checkpoint's (None: not compared; the tools compare the tokenizer themselves)."""
    run = cfg.run
    tracked = _iteration_to_load(root, iteration, cfg)
    if tracked is None:
        return LoadedState(iteration=0, consumed_samples=0, path=None)
    # Which checkpoint: the tracked one, or the newest earlier one that passes the checks; then may this run take it.
    path, saved_tensors, common, skipped = resume.newest_that_passes(
        Path(root),
        tracked,
        verify=not run.no_checkpoint_checksums,
        fallback=not (run.no_checkpoint_fallback or iteration is not None),
    )
    records.check_resumable(path, common, cfg)
    if identity is not None:
        records.check_identity(path, common, identity, run)

    # What to read: the model, and the optimizer's and the RNG states where they are taken.
    model_sd = checkpointing.model_sharded_state_dict(chunks)
    request: dict[str, Any] = dict(model_sd)
    load_optim = records.loads_optimizer(common, run)
    if load_optim:
        _prepare_distributed_optimizer_for_load(optimizer)
        request["optimizer"] = optimizer.sharded_state_dict(
            model_sd,
            is_loading=True,
            metadata={"distrib_optim_sharding_type": common.get("optimizer_format", "fully_reshardable")},
        )
    load_rng = _loads_rng(path, common, cfg)
    if load_rng:
        request["rng_state"] = checkpointing.rng_sharded_object(cfg)

    _check_shapes(path, model_sd, saved_tensors)
    from megatron.core import dist_checkpointing

    try:
        loaded = dist_checkpointing.load(request, str(path))
    except (Exception, CheckpointException) as exc:  # torch's CheckpointException is a BaseException
        raise CheckpointError(
            f"{path} could not be loaded ({type(exc).__name__}: {str(exc)[:2000]}); "
            "if its files are damaged, resume from an earlier checkpoint"
        ) from exc

    for i, chunk in enumerate(chunks):
        unwrap(chunk).load_state_dict(loaded[checkpointing.model_key(i, len(chunks))])
    if load_optim:
        _restore_optimizer(path, loaded["optimizer"], common, optimizer, scheduler)
    if load_rng:
        _restore_rng(loaded["rng_state"])
    if run.finetune:
        return LoadedState(iteration=0, consumed_samples=0, path=path, skipped=skipped)
    return LoadedState(
        iteration=int(common["iteration"]), consumed_samples=int(common["consumed_samples"]), path=path, skipped=skipped
    )


def _iteration_to_load(root: str | Path, iteration: int | None, cfg: TrainingConfig) -> int | None:
    """The iteration asked for (``iteration``, which must exist) or tracked under ``root``; None: a fresh start,
    refused by ``--strict-load`` or by finished checkpoints without a tracker."""
    if iteration is not None:
        return int(resolve_iteration(root, iteration).name.removeprefix("iter_"))
    tracked = read_tracker(root)
    if tracked is None:
        on_disk.check_load_directory(root, overwrite=cfg.run.overwrite_checkpoints)
        if cfg.run.strict_load:
            raise CheckpointError(
                f"--strict-load: no checkpoint under --load {root} (no {TRACKER_FILENAME}); "
                "check the path, or drop --strict-load to start from scratch"
            )
        log.warning("no checkpoint found under --load %s: starting from scratch", root)
    return tracked


def _loads_rng(path: Path, common: dict[str, Any], cfg: TrainingConfig) -> bool:
    """Whether the run restores the checkpoint's RNG states: unless told not to (``--no-load-rng``,
    ``--finetune``), when they were saved (a warning if not) and under the same TP and PP (a warning if not:
    the states are per TP and PP rank)."""
    run = cfg.run
    saved_layout = common.get("layout", {})
    same_grid = saved_layout.get("tp") == cfg.layout.tp and saved_layout.get("pp") == cfg.layout.pp
    saved_rng = bool(common.get("has_rng_state", True))
    if not saved_rng and not (run.no_load_rng or run.finetune):
        log.warning("%s was saved without RNG states (--no-save-rng): this run draws new random numbers", path)
    if not same_grid and saved_rng and not (run.no_load_rng or run.finetune):
        log.warning("checkpoint layout %s differs from this run's TP/PP: RNG states are not restored", saved_layout)
    return not (run.no_load_rng or run.finetune) and same_grid and saved_rng


def _restore_optimizer(path: Path, state: Any, common: dict[str, Any], optimizer: Any, scheduler: Any) -> None:
    """The loaded optimizer state into ``optimizer``, and the learning-rate schedule into ``scheduler``."""
    # Copies into main parameters that require grad (fp32 training): not a graph operation.
    with torch.no_grad():
        optimizer.load_state_dict(state)
    _unshare_adam_steps(optimizer)
    try:
        scheduler.load_state_dict(common["opt_param_scheduler"])
    except AssertionError as exc:
        raise CheckpointError(
            f"{path}: the learning-rate schedule differs from the checkpoint's ({exc}); pass "
            "--override-opt_param-scheduler to use this run's flags or --use-checkpoint-opt_param-scheduler "
            "to keep the checkpoint's"
        ) from exc
