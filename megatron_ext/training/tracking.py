"""TensorBoard and Weights & Biases where Megatron-LM's users look: its tags, its intervals, its switches.

Megatron-LM (``megatron/training/training.py``, ``training_log`` and
``evaluate_and_print_results``; ``global_vars.py``) writes from the last rank:

* every ``--tensorboard-log-interval`` iterations: ``learning-rate``,
  ``batch-size``, ``lm loss``, ``loss-scale`` (unless
  ``--no-log-loss-scale-to-tensorboard``), ``grad-norm``, and with their
  switches ``world-size``, ``num-zeros``, ``params-norm`` and the ``mem-*``
  CUDA counters; each (but memory) also against consumed samples as
  ``<tag> vs samples``;
* every ``--log-interval`` with ``--log-timers-to-tensorboard``:
  ``iteration-time`` (seconds, not on the first iteration), ``throughput``
  (TFLOP/s per GPU) and each timer as ``<name>-time`` (seconds per iteration,
  the slowest rank);
* at each evaluation: ``lm loss validation`` (and ``... ppl`` with
  ``--log-validation-ppl-to-tensorboard``), also vs samples;
* at the start, every argument as TensorBoard text.

W&B gets the same scalars, without the ``vs samples`` twins, plus ``samples vs
steps``; ``wandb.init`` as Megatron-LM calls it (project, name, entity, the
arguments as config, ``dir`` = ``--wandb-save-dir`` or ``--save``/wandb).
Two differences, both so that what is asked for is what is written: W&B is
written without a TensorBoard directory too (Megatron-LM writes it only beside
TensorBoard), and the test split's loss is ``lm loss test`` (Megatron-LM files
it under ``validation``). The metrics the metrics file has beyond these
(tokens/s, MFU, stage times, the bubble, stragglers) go to TensorBoard under
their metrics-file names at each ``--log-interval``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from megatron_ext.config.training_config import GROUPS, TrainingConfig
from megatron_ext.training.metrics import StepResult

MEGATRON_LM_NAMED = frozenset(
    {"iteration", "lm_loss", "lr", "grad_norm", "global_batch_size", "params_norm", "num_zeros", "elapsed_ms",
     "tflops_per_gpu", "time_ms", "consumed_samples"}
)  # fmt: skip
"""Metrics-file fields written under Megatron-LM's tags instead (or not a scalar: the timers' dict)."""


@dataclass(frozen=True)
class StepScalars:
    """One iteration's values, as Megatron-LM's per-iteration tags take them."""

    iteration: int
    consumed_samples: int
    batch_size: int
    loss: float
    lr: float
    loss_scale: float
    grad_norm: float | None = None
    decoupled_lr: float | None = None
    num_zeros: int | None = None
    params_norm: float | None = None
    skipped_samples: int = 0

    @classmethod
    def of(
        cls,
        result: StepResult,
        iteration: int,
        consumed_samples: int,
        batch_size: int,
        loss_scale: float,
        params_norm: float | None,
    ) -> StepScalars:
        """The scalars of a step's result after it counted (iteration and samples include it)."""
        return cls(
            iteration=iteration,
            consumed_samples=consumed_samples,
            batch_size=batch_size,
            loss=result.loss,
            lr=result.lr,
            loss_scale=loss_scale,
            grad_norm=result.grad_norm,
            decoupled_lr=result.decoupled_lr,
            num_zeros=result.num_zeros,
            params_norm=params_norm,
        )


def arguments_text(cfg: TrainingConfig) -> dict[str, str]:
    """Every argument by its flag's field name, as text (what Megatron-LM writes to TensorBoard at the start)."""
    out: dict[str, str] = {}
    for group in GROUPS:
        out.update({name: str(value) for name, value in dataclasses.asdict(getattr(cfg, group)).items()})
    return out


class Tracker:
    """TensorBoard and W&B writers of the last rank (``enabled``); every method is a no-op elsewhere."""

    def __init__(self, cfg: TrainingConfig, *, enabled: bool, world_size: int) -> None:
        self.run = cfg.run
        self.world_size = world_size
        self._tb: Any = None
        self._wandb: Any = None
        if not enabled:
            return
        run = self.run
        if run.tensorboard_dir:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:  # tensorboard is optional
                raise RuntimeError("--tensorboard-dir needs the tensorboard package: pip install tensorboard") from exc
            self._tb = SummaryWriter(log_dir=run.tensorboard_dir, max_queue=run.tensorboard_queue_size)
        if run.wandb_project:
            try:
                import wandb
            except ImportError as exc:
                raise RuntimeError("--wandb-project needs the wandb package: pip install wandb") from exc
            directory = run.wandb_save_dir or os.path.join(str(run.save), "wandb")
            os.makedirs(directory, exist_ok=True)
            kwargs: dict[str, Any] = {
                "dir": directory,
                "name": run.wandb_exp_name,
                "project": run.wandb_project,
                "config": arguments_text(cfg),
            }
            if run.wandb_entity:
                kwargs["entity"] = run.wandb_entity
            self._wandb = wandb.init(**kwargs)
        if self._tb is not None:
            for name, text in arguments_text(cfg).items():
                self._tb.add_text(name, text, global_step=0)

    @property
    def active(self) -> bool:
        return self._tb is not None or self._wandb is not None

    def wants_step(self, iteration: int) -> bool:
        """Whether ``step`` writes at this iteration (every rank can ask: the interval is a flag)."""
        return bool(self.run.tensorboard_dir or self.run.wandb_project) and (
            iteration % self.run.tensorboard_log_interval == 0
        )

    def _scalars(self, values: Mapping[str, float], step: int, samples: int | None) -> None:
        for tag, value in values.items():
            if self._tb is not None:
                self._tb.add_scalar(tag, value, step)
                if samples is not None:
                    self._tb.add_scalar(f"{tag} vs samples", value, samples)
        if self._wandb is not None and values:
            self._wandb.log(dict(values), step=step)

    def step(self, s: StepScalars, *, memory: Mapping[str, int] | None = None) -> None:
        """The per-iteration tags (call when ``wants_step``)."""
        if not self.active:
            return
        run = self.run
        if self._wandb is not None:
            self._wandb.log({"samples vs steps": s.consumed_samples}, step=s.iteration)
        values: dict[str, float] = {"learning-rate": s.lr}
        if s.decoupled_lr is not None:
            values["decoupled-learning-rate"] = s.decoupled_lr
        if s.skipped_samples > 0:
            values["skipped-train-samples"] = s.skipped_samples
        values["batch-size"] = s.batch_size
        if math.isfinite(s.loss):
            values["lm loss"] = s.loss
        if not run.no_log_loss_scale_to_tensorboard:
            values["loss-scale"] = s.loss_scale
        if run.log_world_size_to_tensorboard:
            values["world-size"] = self.world_size
        if s.grad_norm is not None:
            values["grad-norm"] = s.grad_norm
        if s.num_zeros is not None:
            values["num-zeros"] = s.num_zeros
        if s.params_norm is not None:
            values["params-norm"] = s.params_norm
        self._scalars(values, s.iteration, s.consumed_samples)
        if memory and run.log_memory_to_tensorboard and self._tb is not None:
            for tag, value in memory.items():  # no "vs samples" twin and no W&B, as Megatron-LM
                self._tb.add_scalar(tag, value, s.iteration)

    def interval(
        self, iteration: int, *, seconds_per_iteration: float, tflops_per_gpu: float, timers_ms: Mapping[str, float]
    ) -> None:
        """``--log-timers-to-tensorboard``'s tags at a logged iteration."""
        if not self.active or not self.run.log_timers_to_tensorboard:
            return
        values: dict[str, float] = {}
        if iteration > 1:  # Megatron-LM skips the first iteration's time (it includes the warm-up)
            values["iteration-time"] = seconds_per_iteration
        values["throughput"] = tflops_per_gpu
        values.update({f"{name}-time": ms / 1000.0 for name, ms in timers_ms.items()})
        self._scalars(values, iteration, None)

    def evaluation(self, iteration: int, consumed_samples: int, *, split: str, loss: float) -> None:
        """``lm loss validation`` (or ``test``), and its perplexity with ``--log-validation-ppl-to-tensorboard``."""
        if not self.active:
            return
        name = "validation" if split == "valid" else split
        self._scalars({f"lm loss {name}": loss}, iteration, consumed_samples)
        if self.run.log_validation_ppl_to_tensorboard and self._tb is not None:
            ppl = math.exp(min(20.0, loss))
            self._tb.add_scalar(f"lm loss {name} ppl", ppl, iteration)
            self._tb.add_scalar(f"lm loss {name} ppl vs samples", ppl, consumed_samples)

    def extra(self, record: Mapping[str, Any]) -> None:
        """The metrics file's other numbers, under their own names (TensorBoard only)."""
        if self._tb is None:
            return
        step = int(record["iteration"])
        for key, value in record.items():
            if key not in MEGATRON_LM_NAMED and isinstance(value, int | float) and not isinstance(value, bool):
                self._tb.add_scalar(key, value, step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def device_facts(device: Any, ranks_on_host: int) -> dict[str, Any]:
    """The device's name and memory, as ``estimate.calibration.run_record`` records them: the GPU's, or ``cpu``
    with this host's memory shared by its ranks."""
    if getattr(device, "type", None) == "cuda":
        import torch

        properties = torch.cuda.get_device_properties(device)
        return {"device": properties.name, "device_memory_bytes": int(properties.total_memory)}
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"device": "cpu", "device_memory_bytes": host // max(ranks_on_host, 1)}


def cuda_memory(device: Any) -> dict[str, int] | None:
    """``--log-memory-to-tensorboard``'s counters of this rank's GPU (Megatron-LM's tags); None on CPU."""
    if getattr(device, "type", None) != "cuda":
        return None
    import torch

    stats = torch.cuda.memory_stats(device)
    return {
        "mem-reserved-bytes": int(stats["reserved_bytes.all.current"]),
        "mem-allocated-bytes": int(stats["allocated_bytes.all.current"]),
        "mem-max-allocated-bytes": int(stats["allocated_bytes.all.peak"]),
        "mem-allocated-count": int(stats["allocation.all.current"]),
    }
