"""The training loop, built from Megatron-Core's own pieces.

``train`` takes the configuration that ``entry.pretrain`` parsed and checked,
initialises the process groups, builds the model chunks with the caller's
provider, wraps them in Megatron-Core DDP, creates Megatron-Core's optimizer
and LR scheduler, and runs Megatron-Core's forward-backward schedule
(interleaved 1F1B when VP > 1) for every step.
"""

from __future__ import annotations

import functools
import logging
import math
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from megatron_ext import notices
from megatron_ext.checkpoint.run_identity import RunIdentity
from megatron_ext.config import iterations
from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.exit_codes import ExitCode
from megatron_ext.config.training_config import TrainingConfig
from megatron_ext.data.tokenizer_base import Tokenizer
from megatron_ext.estimate import derived_numbers
from megatron_ext.estimate.calibration import run_record
from megatron_ext.estimate.flops import flops_per_step
from megatron_ext.estimate.hardware import peak_flops_for
from megatron_ext.training import checkpoint_loading, checkpointing, distributed, helper_processes, resilience, timing
from megatron_ext.training.datasets import Datasets, chunk_iterators
from megatron_ext.training.housekeeping import Housekeeping
from megatron_ext.training.metrics import LogWindow, MetricsWriter, StepResult
from megatron_ext.training.model import (
    aligned_param_gather,
    build_model_chunks,
    check_transformer_engine,
    count_parameters,
    initialize_tp_comm_overlap,
    parameter_norm,
    unwrap,
)
from megatron_ext.training.optimizer_scheduler import optimizer_config_of, param_group_overrides, scheduler_arguments
from megatron_ext.training.profiling import Profiler
from megatron_ext.training.progress_log import ProgressLog
from megatron_ext.training.saving import Saves
from megatron_ext.training.split_backward import WeightGradStore
from megatron_ext.training.stage_timing import StageTimer
from megatron_ext.training.stragglers import StragglerWatch
from megatron_ext.training.tracking import StepScalars, Tracker, cuda_memory, device_facts
from megatron_ext.training.zero_bubble_schedule import zero_bubble

log = logging.getLogger("megatron_ext")

ModelProvider = Callable[..., torch.nn.Module]
ForwardStep = Callable[[Iterator[Any] | None, torch.nn.Module], tuple[torch.Tensor, Callable[..., Any]]]
DatasetsProvider = Callable[[TrainingConfig, Tokenizer], Datasets]


def train(
    cfg: TrainingConfig,
    *,
    tokenizer: Tokenizer,
    started: float,
    model_provider: ModelProvider,
    forward_step: ForwardStep,
    datasets_provider: DatasetsProvider,
    identity: RunIdentity | None = None,
) -> int:
    """Train a checked configuration (``entry.pretrain`` parsed and preflighted it); returns the exit code.

    ``identity``: this run's tokenizer and data digests where the preflight hashed them already (global rank 0).

    ``started`` (``time.monotonic()``) is when the run started, for ``--exit-duration-in-mins``.
    """
    # As early as possible: SLURM's pre-time-limit signal can come during the
    # rendezvous, model building or checkpoint loading, and would kill the process.
    signal_flag = resilience.SignalFlag() if cfg.run.exit_signal_handler else None
    if signal_flag is not None:
        signal_flag.install()
    # Before anything forks or spawns: helpers leave planned stops to this rank and end with it.
    helper_processes.install()
    try:
        ctx = distributed.initialize(
            layout=cfg.layout,
            device_choice=cfg.run.device,
            seed=cfg.optim.seed,
            timeout_minutes=cfg.run.distributed_timeout_minutes,
            backend_choice=cfg.run.distributed_backend,
            tp_pp_dp_order=cfg.parallel.use_tp_pp_dp_mapping,
            pipeline_comm_backend=cfg.parallel.pipeline_model_parallel_comm_backend,
        )
    except ConfigError as exc:  # what only the started run can tell (the device --device auto found)
        log.error("error: %s", exc)
        return ExitCode.INVALID
    try:
        trainer = Trainer(
            cfg=cfg,
            ctx=ctx,
            model_provider=model_provider,
            forward_step=forward_step,
            datasets_provider=datasets_provider,
            tokenizer=tokenizer,
            identity=identity,
        )
        return trainer.train(signal_flag=signal_flag, started=started)
    except ConfigError as exc:
        # What only the started run can tell (the device --device auto found).
        log.error("error: %s", exc)
        return ExitCode.INVALID
    except checkpointing.CheckpointError as exc:
        log.error("checkpoint error: %s", exc)
        return ExitCode.CHECKPOINT
    except resilience.NonFiniteLossError as exc:
        log.error("%s", exc)
        return ExitCode.NON_FINITE
    except RuntimeError as exc:
        # A collective failed because a peer died: one line naming it, not gloo's traceback; anything else as is.
        lost = distributed.lost_peers(exc)
        if lost is None:
            raise
        log.error("%s", lost)
        return ExitCode.ERROR
    finally:
        distributed.destroy()


def _run_identity(cfg: TrainingConfig, tokenizer: Tokenizer, known: RunIdentity | None) -> RunIdentity | None:
    """This run's tokenizer and data by content, for its checkpoints (hashed once, on rank 0, and shared; ``known``
    where rank 0 hashed them already); None when it neither loads nor saves one."""
    if not (cfg.run.load or cfg.run.save):
        return None
    box = [(known or RunIdentity.of(tokenizer, cfg.data)) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class Trainer:
    """State of one run, passed explicitly (no global arguments)."""

    def __init__(
        self,
        *,
        cfg: TrainingConfig,
        ctx: distributed.DistributedContext,
        model_provider: ModelProvider,
        forward_step: ForwardStep,
        datasets_provider: DatasetsProvider,
        tokenizer: Tokenizer,
        identity: RunIdentity | None = None,
    ) -> None:
        from megatron.core import parallel_state
        from megatron.core.distributed import finalize_model_grads
        from megatron.core.optimizer import get_megatron_optimizer
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
        from megatron.core.utils import get_model_config

        self.cfg = cfg
        self.ctx = ctx
        layout = cfg.layout
        check_transformer_engine(cfg, ctx.device)
        initialize_tp_comm_overlap(cfg)
        provider = functools.partial(model_provider, cfg, device=ctx.device)
        self.chunks = build_model_chunks(provider, cfg=cfg, device=ctx.device)
        # Every pass timed: per-stage cost and imbalance in the log, and --timeline.
        self.stage_timer = StageTimer(
            device=ctx.device,
            pipeline_rank=parallel_state.get_pipeline_model_parallel_rank(),
            pipeline_size=layout.pp,
            keep_timeline=cfg.run.timeline is not None,
        )
        self.stage_timer.instrument(self.chunks)
        self.forward_step = self.stage_timer.wrap(forward_step)
        # Ranks consistently slower than the other ranks of their pipeline stage, from the same times.
        self.stragglers = StragglerWatch(margin=cfg.run.straggler_margin, windows=cfg.run.straggler_windows)
        # Megatron-Core's timers (dummies below --timing-log-level) for the schedule and optimizer.
        self.timers = timing.StepTimers(level=cfg.run.timing_log_level, device=ctx.device)

        optimizer_config = optimizer_config_of(
            cfg, params_dtype=get_model_config(self.chunks[0]).params_dtype, timers=self.timers.timers
        )
        self.optimizer = get_megatron_optimizer(
            optimizer_config, self.chunks, config_overrides=param_group_overrides(optimizer_config)
        )
        self.scheduler = OptimizerParamScheduler(self.optimizer, **scheduler_arguments(cfg))
        # Megatron-Core's calculator, held here instead of in its process-wide slot.
        self.microbatches = iterations.microbatch_calculator(cfg.batch, layout, rank=ctx.rank)
        self.housekeeping = Housekeeping(cfg.run, on_gpu=ctx.device.type == "cuda")

        config = get_model_config(self.chunks[0])
        config.finalize_model_grads_func = finalize_model_grads
        config.timers = self.timers.timers
        config.grad_scale_func = self.optimizer.scale_loss
        no_sync = [c.no_sync for c in self.chunks]
        config.no_sync_func = no_sync if layout.interleaved else no_sync[0]
        # Megatron-LM's alignment: every stage starts its reductions (and, interleaved, its all-gathers) from
        # the schedule unless --no-align-grad-reduce (--no-align-param-gather).
        if cfg.parallel.overlap_grad_reduce and not cfg.parallel.no_align_grad_reduce:
            sync = [c.start_grad_sync for c in self.chunks]
            config.grad_sync_func = sync if layout.interleaved else sync[0]
        if aligned_param_gather(cfg):
            config.param_sync_func = [c.start_param_sync for c in self.chunks]
        self.model_config = config
        # --enable-zero-bubble: the linear layers' weight gradients deferred to W passes (ZB-H1, ZB interleaved).
        self.forward_backward_func: Any = None
        if cfg.parallel.enable_zero_bubble:
            store = WeightGradStore()
            split = store.attach(self.chunks)
            self.forward_backward_func = zero_bubble(
                store,
                chunks=self.chunks,
                pipeline_rank=ctx.pp_rank,
                pp=layout.pp,
                vp=layout.vp,
                timed=self.stage_timer.weight_pass,
            )
            log.info(
                "schedule: %s, the weight gradients of %d linear layers in W passes",
                "ZB interleaved" if layout.interleaved else "ZB-H1",
                split,
            )

        self._norm_at: tuple[int, float] = (-1, 0.0)
        self.iteration = 0
        self.consumed_samples = 0
        self.skipped_iterations = 0
        self.identity = _run_identity(cfg, tokenizer, identity)
        skipped: tuple[tuple[int, str, str], ...] = ()
        if cfg.run.load:
            state = checkpoint_loading.load_checkpoint(
                root=cfg.run.load,
                chunks=self.chunks,
                optimizer=self.optimizer,
                scheduler=self.scheduler,
                cfg=cfg,
                identity=self.identity,
            )
            self.iteration, self.consumed_samples, skipped = state.iteration, state.consumed_samples, state.skipped
            self.microbatches.update(self.consumed_samples, consistency_check=True)
            if state.path is not None:
                log.info("loaded checkpoint %s (iteration %d)", state.path, state.iteration)

        self.datasets = datasets_provider(cfg, tokenizer)
        # A per-document mask or the documents' boundaries are applied in every layer: middle chunks read them.
        self.needs_data = [
            cfg.data.reads_every_stage or self._unwrapped(c).pre_process or self._unwrapped(c).post_process
            for c in self.chunks
        ]
        self.metrics = MetricsWriter(enabled=ctx.is_logging_rank, metrics_file=cfg.run.metrics_file)
        self.tracker = Tracker(cfg, enabled=ctx.is_logging_rank, world_size=ctx.world_size)
        self.flops_per_sample = flops_per_step(cfg.model, batch_size=1, padded_vocab_size=cfg.padded_vocab_size)
        self.progress = ProgressLog(
            save=cfg.run.save, enabled=cfg.run.log_progress and ctx.rank == 0, world_size=ctx.world_size,
            flops_per_sample=self.flops_per_sample,
        )  # fmt: skip
        self.progress.start(self.consumed_samples, time.time())
        self.saves = Saves(cfg, progress=self.progress, rank=ctx.rank)
        self.peak_flops = peak_flops_for(torch.cuda.get_device_name(ctx.device)) if ctx.device.type == "cuda" else None
        self._log_start()
        for it, why, where in skipped:
            # A resume that passed over a damaged checkpoint (resume.newest_that_passes).
            self.metrics.write(
                {"iteration": self.iteration, "checkpoint_skipped": it, "reason": why, "moved_to": where}
            )

    # ------------------------------------------------------------------ utils
    @staticmethod
    def _unwrapped(chunk: torch.nn.Module) -> Any:
        return unwrap(chunk)

    def _log_start(self) -> None:
        if self.ctx.rank == 0:
            log.info("device: %s, backend: %s", self.ctx.device, dist.get_backend())
            for line in derived_numbers.describe(self.cfg):
                log.info(line)
        notices.say_applicable(log, device_type=self.ctx.device.type, rank=self.ctx.rank)
        params = torch.tensor([count_parameters(self.chunks)], dtype=torch.long, device=self.ctx.device)
        counts = [torch.zeros_like(params) for _ in range(self.ctx.world_size)]
        dist.all_gather(counts, params)
        if self.ctx.rank == 0:
            per_rank = [int(c.item()) for c in counts]
            log.info("parameters per rank: min %s, max %s", f"{min(per_rank):,}", f"{max(per_rank):,}")
        hosts: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(hosts, socket.gethostname())
        # What ran and where, first in the metrics file (tools/layout.py --calibrate fits a profile to it), marked
        # with the iteration this start continues from (estimate.metrics_file: which earlier rows it supersedes).
        per_node = max(map(hosts.count, hosts))
        record = run_record(self.cfg, gpus_per_node=per_node, **device_facts(self.ctx.device, per_node))
        self.metrics.write_start(record, resumed_from_iteration=self.iteration)

    def _iterators(self, dataset: Any, consumed: int) -> Any:
        iters = chunk_iterators(
            dataset, cfg=self.cfg, consumed_samples=consumed, dp_rank=self.ctx.dp_rank, needs_data=self.needs_data
        )
        return iters if self.cfg.layout.interleaved else iters[0]

    def _forward_backward(
        self, data_iterator: Any, *, forward_only: bool, num_microbatches: int
    ) -> list[dict[str, torch.Tensor]]:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        layout = self.cfg.layout
        seq_length, micro_batch_size = self.cfg.model.seq_length, layout.micro_batch_size
        if self.cfg.data.dataloader_inter_document_masking:
            # A packed micro-batch is one sequence of b·s tokens ([b·s, 1, h] between stages): the schedule's
            # receive buffers must have that shape, not [s, b, h] (same size, so a mismatch would go unnoticed
            # and permute the activations).
            seq_length, micro_batch_size = seq_length * micro_batch_size, 1
        return (self.forward_backward_func or get_forward_backward_func())(
            forward_step_func=self.forward_step,
            data_iterator=data_iterator,
            model=self.chunks if layout.interleaved else self.chunks[0],
            num_microbatches=num_microbatches,
            seq_length=seq_length,
            micro_batch_size=micro_batch_size,
            forward_only=forward_only,
        )

    def _reduce_loss(self, losses: list[dict[str, torch.Tensor]]) -> float:
        """Token-mean loss over the global batch, known on every rank."""
        from megatron.core import parallel_state

        total = torch.zeros(2, dtype=torch.float64, device=self.ctx.device)
        for item in losses:
            total += item["lm loss"].to(total)
        if parallel_state.is_pipeline_last_stage(ignore_virtual=True):
            # Context parallelism: every CP rank holds a share of each sequence's tokens.
            dist.all_reduce(total, group=parallel_state.get_data_parallel_group(with_context_parallel=True))
        else:
            total.zero_()
        # The last stage's value (replicated over its TP ranks) goes to every rank:
        # summing over the pipeline group picks it up from the only non-zero stage.
        dist.all_reduce(total, group=parallel_state.get_pipeline_model_parallel_group())
        return float(total[0] / total[1]) if total[1] > 0 else math.nan

    # ------------------------------------------------------------------ steps
    def train_step(self, data_iterator: Any) -> StepResult:
        """One optimizer step over the current global batch (``self.microbatches``)."""
        for chunk in self.chunks:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        losses = self._forward_backward(data_iterator, forward_only=False, num_microbatches=self.microbatches.get())
        self.housekeeping.after_forward_backward()
        loss = self._reduce_loss(losses)
        self.stage_timer.end_step()
        lr, decoupled_lr = self._learning_rates()
        if not math.isfinite(loss) and not self.cfg.run.no_check_for_nan_in_loss_and_grad:
            # Every rank sees the same value, so all skip together.
            return StepResult(loss=loss, grad_norm=None, skipped=True, lr=lr, decoupled_lr=decoupled_lr)
        self.timers("optimizer", 1).start(barrier=False)
        update_successful, grad_norm, num_zeros = self.optimizer.step()
        self.timers("optimizer", 1).stop()
        self.housekeeping.after_optimizer_step()
        if update_successful:
            self.scheduler.step(increment=self.microbatches.get_current_running_global_batch_size())
        return StepResult(
            loss=loss,
            grad_norm=grad_norm,
            skipped=not update_successful,
            lr=lr,
            decoupled_lr=decoupled_lr,
            num_zeros=num_zeros,
        )

    def _learning_rates(self) -> tuple[float, float | None]:
        """The rate this step uses, and with --decoupled-lr the embedding and output layer's (Megatron-LM logs
        both; a stage without those layers has none)."""
        rates = {bool(g["is_decoupled_lr"]): float(g["lr"]) for g in self.optimizer.param_groups if g["params"]}
        return rates.get(False, 0.0), rates.get(True)

    def evaluate(self, split: str = "valid") -> float | None:
        dataset = getattr(self.datasets, split)
        if dataset is None or self.cfg.run.eval_iters <= 0:
            return None
        self.housekeeping.before_evaluation()
        self._param_sync_for_use()
        for chunk in self.chunks:
            chunk.eval()
        # Evaluation steps are not training steps: keep them out of the timers.
        self.model_config.timers = None
        data_iterator = self._iterators(dataset, 0)
        sums = []
        with torch.no_grad():
            for _ in range(self.cfg.run.eval_iters):
                # Megatron-LM evaluates whole global batches, ramp-up or not.
                losses = self._forward_backward(
                    data_iterator, forward_only=True, num_microbatches=self.cfg.layout.num_microbatches
                )
                sums.append(self._reduce_loss(losses))
        for chunk in self.chunks:
            chunk.train()
        self.model_config.timers = self.timers.timers
        self._restore_param_hooks()
        self.housekeeping.after_evaluation()
        return sum(sums) / len(sums)

    def _param_sync_for_use(self) -> None:
        # With overlapped param gather the newest weights arrive lazily in the next
        # forward; evaluation, checkpoints and the weights' norm need them now.
        if self.cfg.parallel.overlap_param_gather:
            for chunk in self.chunks:
                chunk.disable_forward_pre_hook()

    def _restore_param_hooks(self) -> None:
        if self.cfg.parallel.overlap_param_gather:
            for chunk in self.chunks:
                chunk.enable_forward_pre_hook()

    def save(self, *, periodic: bool = False) -> bool:
        """Save a checkpoint of this iteration (``Saves.write``); returns whether it was written or started."""
        if not self.cfg.run.save:
            return False
        self._param_sync_for_use()
        try:
            return self.saves.write(
                iteration=self.iteration, consumed_samples=self.consumed_samples, chunks=self.chunks,
                optimizer=self.optimizer, scheduler=self.scheduler, identity=self.identity, periodic=periodic,
            )  # fmt: skip
        finally:
            self._restore_param_hooks()

    # ------------------------------------------------------------------- loop
    def train(self, *, signal_flag: resilience.SignalFlag | None = None, started: float | None = None) -> int:
        """Train to --train-iters (exit code 0) or until told to stop early (75, with a checkpoint).

        ``started`` (``time.monotonic()``) is when the process started, for
        ``--exit-duration-in-mins``; default now.
        """
        try:
            return self._train(signal_flag=signal_flag, started=started)
        except resilience.NonFiniteLossError:
            # Every rank raises at the same iteration: a save still in flight is
            # from before the trouble and worth keeping.
            self.saves.finish()
            raise

    def _train(self, *, signal_flag: resilience.SignalFlag | None, started: float | None) -> int:
        run = self.cfg.run
        stop_policy = resilience.StopPolicy(
            exit_interval=run.exit_interval,
            exit_duration_minutes=run.exit_duration_in_mins,
            signal_flag=signal_flag,
            device=self.ctx.device,
            start_time=started,
        )
        data_iterator = self._iterators(self.datasets.train, self.consumed_samples)
        self.saves.last_saved = self.iteration if run.load else None
        if self.ctx.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        self.housekeeping.start()
        profiler = Profiler(
            run,
            rank=self.ctx.rank,
            is_last_rank=self.ctx.rank == self.ctx.world_size - 1,
            device=self.ctx.device,
            first_iteration=self.iteration,
        )
        try:
            stop = self._loop(data_iterator, stop_policy, profiler)
        finally:
            profiler.close()
        finished = stop is None
        self.timers.collect()  # the last, unlogged window counts towards the run's bubble
        self._log_bubble()
        if run.timeline:
            self.stage_timer.write_timeline(Path(run.timeline))
            if self.ctx.rank == 0:
                log.info("timeline of the last %d steps written to %s", len(self.stage_timer.timeline), run.timeline)
        if finished and run.eval_iters > 0 and (run.eval_interval <= 0 or self.iteration % run.eval_interval):
            self._log_eval(self.evaluate("valid"))
        if finished:
            # As Megatron-LM: the test split once, at the end of training.
            self._log_eval(self.evaluate("test"), "test")
        # A periodic save still in flight first: if it fails (once, allowed), the save below makes it again.
        self.saves.finish()
        if run.save and self.saves.last_saved != self.iteration:
            self.save()
        self.saves.finish()
        self.metrics.close()
        self.tracker.close()
        if stop is not None:
            # 75 promises a checkpoint to continue from; without --save there is none,
            # and a requeue would start over.
            code = ExitCode.SAVED_AND_STOPPED if run.save else ExitCode.OK
            if self.ctx.is_logging_rank:
                saved = (
                    f"checkpoint of iteration {self.iteration} saved (run again to continue)"
                    if run.save
                    else "nothing saved (no --save)"
                )
                log.info(
                    "stopping early at iteration %d: %s; %s; exit code %d", self.iteration, stop.message, saved, code
                )
            return code
        if self.ctx.is_logging_rank:
            log.info("done: %d iterations, %d skipped", self.iteration, self.skipped_iterations)
        return ExitCode.OK

    def _loop(
        self,
        data_iterator: Any,
        stop_policy: resilience.StopPolicy,
        profiler: Profiler,
    ) -> resilience.StopReason | None:
        """Train until --train-iters or a stop; returns why it stopped early (None: it did not)."""
        run = self.cfg.run
        consecutive_skipped = 0
        window = LogWindow()
        delay = resilience.step_delay_s()
        while self.iteration < run.train_iters:
            if delay:
                time.sleep(delay)
            profiler.before_step(self.iteration)
            if self._batch_grows() and run.save and self.saves.last_saved != self.iteration:
                # As Megatron-LM: a checkpoint of the last step with the smaller batch.
                self.save()
                self.saves.last_saved = self.iteration
            start = time.perf_counter()
            result = self.train_step(data_iterator)
            samples = self.microbatches.get_current_running_global_batch_size()
            window.add(result, time.perf_counter() - start, samples)
            self.iteration += 1
            self.consumed_samples += samples
            if self.tracker.wants_step(self.iteration):
                self._track_step(result, samples)
            profiler.after_step(self.iteration)
            self.skipped_iterations += int(result.skipped)
            self.housekeeping.after_iteration(self.iteration)
            # fp16 overflows are the loss scaler searching downwards; they count
            # against the run only once the scale cannot go lower.
            guarded = result.non_finite and not run.no_check_for_nan_in_loss_and_grad
            if guarded or (result.skipped and self._loss_scale_at_minimum()):
                consecutive_skipped += 1
            else:
                consecutive_skipped = 0
            if self.iteration % run.log_interval == 0 or self.iteration == run.train_iters:
                self._log_iteration(result=result, window=window, per_rank_timers=self.timers.collect())
                profiler.at_log()
                window = LogWindow()
            if run.eval_iters > 0 and run.eval_interval > 0 and self.iteration % run.eval_interval == 0:
                self._log_eval(self.evaluate("valid"))
            if consecutive_skipped > run.max_consecutive_skipped:
                raise resilience.NonFiniteLossError(
                    f"{consecutive_skipped} consecutive iterations (up to {self.iteration}) had a non-finite "
                    f"loss or overflowed at the minimum loss scale; stopping instead of training on garbage "
                    f"(--max-consecutive-skipped "
                    f"{run.max_consecutive_skipped}). Lower --lr, check the data, or resume from an earlier "
                    "checkpoint."
                )
            periodic = run.save and run.save_interval > 0 and self.iteration % run.save_interval == 0
            if periodic and self.save(periodic=True):
                self.saves.last_saved = self.iteration
            self.saves.finish(blocking=False)
            if self.iteration < run.train_iters:
                stop = stop_policy.check(self.iteration)
                if stop is not None:
                    return stop
        return None

    def _log_bubble(self) -> None:
        """The measured pipeline bubble of the whole run next to (p-1)/(v*m) (level-2 timers)."""
        if self.timers.level < 2:
            return
        report = timing.measure_bubble(self.timers.totals, predicted=self.cfg.layout.bubble_fraction)
        if report is None:
            return
        if self.ctx.is_logging_rank:
            log.info("%s", report.describe())
        self.metrics.write({"iteration": self.iteration, "run_summary": True, **report.as_record()})

    def _batch_grows(self) -> bool:
        """Set the microbatches of the next step (Megatron-Core's calculator, at the samples consumed so far);
        whether a ramp-up made them more than the last step's."""
        before = self.microbatches.get()
        self.microbatches.update(self.consumed_samples, consistency_check=True)
        return self.iteration > 0 and self.microbatches.get() != before

    def _loss_scale_at_minimum(self) -> bool:
        scale = float(self.optimizer.get_loss_scale())
        return scale <= self.optimizer.config.min_loss_scale

    def _log_iteration(
        self,
        *,
        result: StepResult,
        window: LogWindow,
        per_rank_timers: list[dict[str, float]],
    ) -> None:
        """One line and one metrics record for the window; lr and grad norm are the last step's."""
        lr = result.lr
        seconds = window.seconds / window.iterations
        loss = window.mean_loss
        tflops = self.flops_per_sample * window.samples / window.seconds / self.ctx.world_size / 1e12
        record: dict[str, Any] = {
            "iteration": self.iteration,
            "consumed_samples": self.consumed_samples,
            "global_batch_size": self.microbatches.get_current_running_global_batch_size(),
            "lm_loss": loss,
            "lr": lr,
            "grad_norm": result.grad_norm,
            "tokens_per_sec": window.samples * self.cfg.model.seq_length / window.seconds,
            "tflops_per_gpu": tflops,
            "elapsed_ms": seconds * 1000.0,
            "skipped": window.skipped,
            "skipped_total": self.skipped_iterations,
        }
        if result.decoupled_lr is not None:
            record["decoupled_lr"] = result.decoupled_lr
        if result.num_zeros is not None:
            record["num_zeros"] = result.num_zeros
        if self.cfg.run.log_params_norm:
            record["params_norm"] = self._params_norm()
        if self.ctx.device.type == "cuda":
            record["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
            record["peak_reserved_gb"] = torch.cuda.max_memory_reserved() / 2**30  # what the caching allocator held
            if self.peak_flops:
                record["mfu"] = tflops * 1e12 / self.peak_flops
        stages = self.stage_timer.collect()
        straggler_lines: list[str] = []
        if stages is not None:
            record.update(stages.as_record())
            stragglers = self.stragglers.update(stages.rank_compute_ms, stages.rank_pipeline_rank, stages.rank_hosts)
            record.update(stragglers.as_record())
            straggler_lines = stragglers.log_lines()
        if per_rank_timers:
            record["time_ms"] = timing.breakdown_ms(per_rank_timers, iterations=window.iterations)
            bubble = timing.measure_bubble(per_rank_timers, predicted=self.cfg.layout.bubble_fraction)
            if bubble is not None:
                record.update(bubble.as_record())
        if self.ctx.is_logging_rank:
            parts = [
                f"iteration {self.iteration:>6}/{self.cfg.run.train_iters}",
                f"lm loss {loss:.6e}",
                f"lr {lr:.3e}",
                *([f"decoupled lr {result.decoupled_lr:.3e}"] if result.decoupled_lr is not None else []),
                *([f"global batch {record['global_batch_size']}"] if self.cfg.batch.rampup_batch_size else []),
                f"grad norm {result.grad_norm:.3f}" if result.grad_norm is not None else "grad norm -",
                *([f"params norm {record['params_norm']:.3f}"] if "params_norm" in record else []),
                *([f"num zeros {result.num_zeros}"] if result.num_zeros is not None else []),
                f"{record['tokens_per_sec']:,.0f} tokens/s",
                f"{tflops:.2f} TFLOP/s/GPU",
                f"{seconds * 1000:.1f} ms/it",
            ]
            if "mfu" in record:
                parts.append(f"MFU {record['mfu']:.1%}")
            if "peak_memory_gb" in record:
                parts.append(f"peak mem {record['peak_memory_gb']:.1f} GiB")
            if window.skipped:
                parts.append(
                    f"skipped {window.skipped} (non-finite loss or fp16 overflow; {self.skipped_iterations} in all)"
                )
            log.info(" | ".join(parts))
            if stages is not None and self.cfg.layout.pp > 1:
                log.info("  %s", stages.describe())
            for line in straggler_lines:
                log.info("  %s", line)
            if "time_ms" in record:
                log.info("  time per iteration (ms, max over ranks): %s", timing.format_times(record["time_ms"]))
        self.metrics.write(record)
        self.tracker.interval(
            self.iteration, seconds_per_iteration=seconds, tflops_per_gpu=tflops, timers_ms=record.get("time_ms", {})
        )
        self.tracker.extra(record)

    def _params_norm(self) -> float:
        """The weights' norm after this iteration's step (a collective), computed once when both the log line and
        TensorBoard ask for it."""
        if self._norm_at[0] != self.iteration:
            self._param_sync_for_use()
            self._norm_at = (self.iteration, parameter_norm(self.chunks))
            self._restore_param_hooks()
        return self._norm_at[1]

    def _track_step(self, result: StepResult, samples: int) -> None:
        """Megatron-LM's per-iteration TensorBoard/W&B scalars (--log-params-norm's norm is a collective)."""
        params_norm = self._params_norm() if self.cfg.run.log_params_norm else None
        scalars = StepScalars.of(
            result, self.iteration, self.consumed_samples, samples, float(self.optimizer.get_loss_scale()), params_norm
        )
        self.tracker.step(scalars, memory=cuda_memory(self.ctx.device))

    def _log_eval(self, loss: float | None, split: str = "valid") -> None:
        if loss is None:
            return
        ppl = math.exp(min(loss, 20.0))
        if self.ctx.is_logging_rank:
            name = "validation" if split == "valid" else split
            log.info("%s at iteration %d | lm loss %.6e | ppl %.3f", name, self.iteration, loss, ppl)
        self.metrics.write({"iteration": self.iteration, f"{split}_loss": loss, f"{split}_ppl": ppl})
        self.tracker.evaluation(self.iteration, self.consumed_samples, split=split, loss=loss)
