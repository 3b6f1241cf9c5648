"""``RunArgs``: what a run does besides the model, the layout and the data: iterations, checkpoints, logging,
profiling and the device (the argument group behind Megatron-LM's training, checkpointing and logging flags)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from megatron_ext.config.arguments import ConfigError, _Options
from megatron_ext.config.flags import opt

CHECKPOINT_FORMATS = {
    "torch": "Megatron-LM's legacy format (one file per rank, loadable only under the layout that wrote it)",
    "torch_dcp": "PyTorch's own distributed checkpoint, not Megatron-Core's",
    "fsdp_dtensor": "Megatron-FSDP's format (this project does not use FSDP)",
}
"""Megatron-LM's other ``--ckpt-format`` values and why they are refused."""


@dataclass(frozen=True, kw_only=True)
class RunArgs(_Options):
    train_iters: int = opt(10, "Optimizer steps to train (or give --train-samples).", env="TRAIN_ITERS", minimum=0)
    train_samples: int | None = opt(
        None,
        "Samples (sequences) to train on, instead of --train-iters: the iterations follow from the global batch "
        "and its ramp-up, and the --lr-*-samples flags give the schedule.",
        minimum=1,
    )
    log_interval: int = opt(1, "Log every this many iterations.", env="LOG_INTERVAL", minimum=1)
    eval_interval: int = opt(
        0, "Evaluate every this many iterations (0: only at the end if --eval-iters).", env="EVAL_INTERVAL", minimum=0
    )
    eval_iters: int = opt(0, "Batches per evaluation (0 disables evaluation).", env="EVAL_ITERS", minimum=0)
    save: str | None = opt(None, "Directory to save checkpoints into.")
    load: str | None = opt(None, "Directory to load a checkpoint from.")
    save_interval: int = opt(0, "Save every this many iterations (0: only at the end).", env="SAVE_INTERVAL", minimum=0)
    exit_interval: int = opt(
        0, "Save a checkpoint and stop (exit code 75) after an iteration divisible by this (0: never).", minimum=0
    )
    exit_duration_in_mins: float | None = opt(
        None, "Save and stop (exit code 75) once the longest-running rank has trained this many minutes.", minimum=0
    )
    exit_signal_handler: bool = opt(
        False, "On SIGTERM, SIGUSR1 or SIGUSR2: finish the iteration, save, stop with exit code 75."
    )
    async_save: bool = opt(
        False,
        "Write checkpoints in the background (Megatron-Core's async dist-checkpointing); the tracker "
        "names a checkpoint only once its files are complete.",
    )
    keep_last_checkpoints: int = opt(0, "Keep only the newest K complete checkpoints under --save (0: all).", minimum=0)
    strict_load: bool = opt(
        False,
        "Fail when --load holds no checkpoint instead of starting fresh.",
        aliases=["--exit-on-missing-checkpoint"],
    )
    no_checkpoint_fallback: bool = opt(
        False,
        "Stop (exit code 3) when the checkpoint the tracker under --load names fails its checks (a missing, "
        "truncated or corrupted file) instead of loading the newest earlier one that passes them; the damaged "
        "one is then left as it is. By default a requeued job goes on from that earlier checkpoint, moves the "
        "damaged directory aside (renamed iter_NNNNNNN.damaged, never deleted) and says so.",
    )
    max_consecutive_skipped: int = opt(
        3,
        "Tolerate this many non-finite losses in a row (fp16: overflows at the minimum loss scale); one more "
        "stops the run with an error (exit code 4).",
        minimum=0,
    )
    no_check_for_nan_in_loss_and_grad: bool = opt(
        False,
        "Megatron-LM's switch that stops checking the loss for NaN and infinity: the non-finite-loss guard is off, so "
        "a step whose loss is not finite is taken, not skipped (with --fp16 the loss scaler still skips a step whose "
        "gradients overflowed; with bf16 or fp32 the NaN reaches the weights), and non-finite losses never stop the "
        "run (--max-consecutive-skipped then counts fp16 overflows at the minimum loss scale only).",
    )
    use_checkpoint_args: bool = opt(
        False,
        "Take the model's shape from the checkpoint under --load, as Megatron-LM does: sizes not given here come "
        "from it; the architecture switches (normalization, SwiGLU, biases, positions, dropouts, ...) always do.",
    )
    use_mp_args_from_checkpoint_args: bool = opt(
        False, "With --use-checkpoint-args: also take TP, PP and VP from the checkpoint."
    )
    no_use_tokenizer_model_from_checkpoint_args: bool = opt(
        False,
        "With --use-checkpoint-args: keep this command line's --tokenizer-type and --tokenizer-model.",
        aliases=("--disable-use-tokenizer-model-from-checkpoint-args",),
    )
    no_load_optim: bool = opt(False, "Do not load optimizer state from --load.")
    no_save_optim: bool = opt(
        False, "Do not save the optimizer state: smaller checkpoints; a run resumed from one starts Adam afresh."
    )
    manual_gc: bool = opt(
        False,
        "Turn Python's garbage collector off and collect at set points instead, so that ranks do not pause at "
        "different times.",
    )
    manual_gc_interval: int = opt(
        0, "With --manual-gc: collect every this many iterations (0: only at start and around evaluations).", minimum=0
    )
    no_manual_gc_eval: bool = opt(
        False, "With --manual-gc: do not collect around evaluations.", aliases=["--disable-manual-gc-eval"]
    )
    empty_unused_memory_level: int = opt(
        0,
        "Release PyTorch's cached GPU memory: 1 after each forward-backward, 2 also after each optimizer step.",
        choices=[0, 1, 2],
    )
    ckpt_format: str = opt(
        "torch_dist",
        "Checkpoint format: torch_dist (Megatron-Core's distributed checkpoint, loadable under any layout) is the "
        "one written and read here.",
    )
    dist_ckpt_optim_fully_reshardable: bool = opt(
        False,
        "Save the distributed optimizer's state per parameter, loadable under any TP, PP, VP and DP; it is "
        "gathered over the data-parallel ranks at every save. Default (Megatron-LM's): each rank writes its "
        "own shard in parallel, loadable under another DP only.",
    )
    distrib_optim_fully_reshardable_mem_efficient: bool = opt(
        False, "With --dist-ckpt-optim-fully-reshardable: gather on one rank over gloo (less memory, slower)."
    )
    override_opt_param_scheduler: bool = opt(
        False,
        "On --load, take the learning-rate schedule from this run's flags, not from the checkpoint.",
        flag="--override-opt_param-scheduler",
        aliases=["--override-opt-param-scheduler"],
    )
    use_checkpoint_opt_param_scheduler: bool = opt(
        False,
        "On --load, keep the checkpoint's learning-rate schedule whatever this run's flags say. Without "
        "either flag a schedule that differs from the checkpoint's is an error.",
        flag="--use-checkpoint-opt_param-scheduler",
        aliases=["--use-checkpoint-opt-param-scheduler"],
    )
    no_checkpoint_checksums: bool = opt(
        False, "Do not compute (on save) or verify (on load) the CRC-32 of every checkpoint file."
    )
    no_load_rng: bool = opt(False, "Do not load RNG state from --load.")
    no_save_rng: bool = opt(
        False, "Do not save the RNG states: a run resumed from such a checkpoint draws new dropout masks."
    )
    finetune: bool = opt(False, "Load only the model from --load and start at iteration 0.")
    overwrite_checkpoints: bool = opt(
        False,
        "Start even though --load or --save holds finished checkpoints this run cannot account for (no tracker, "
        "or checkpoints beyond the iteration it starts from), replacing them as training reaches their "
        "iterations. Without it such a run stops before training and says what it found.",
    )
    accept_tokenizer_change: bool = opt(
        False,
        "Resume (or --finetune) from a checkpoint trained with another tokenizer: the checkpoint records its "
        "tokenizer's SHA-256, and a different one is refused without this flag.",
    )
    accept_data_change: bool = opt(
        False,
        "Resume from a checkpoint on other training data: the checkpoint records every dataset's index "
        "SHA-256, the blend's weights and --split, and a difference is refused without this flag.",
    )
    tensorboard_dir: str | None = opt(
        None,
        "Write TensorBoard scalars here (the last rank), with Megatron-LM's tags ('lm loss', 'learning-rate', "
        "'grad-norm', ... and their 'vs samples' twins), and every other metric under its metrics-file name.",
        env="TENSORBOARD_DIR",
    )
    tensorboard_log_interval: int = opt(
        1, "Write the per-iteration TensorBoard and W&B scalars every this many iterations.", minimum=1
    )
    tensorboard_queue_size: int = opt(
        1000, "Scalars TensorBoard's writer queues before it flushes them to disk.", minimum=1
    )
    log_timers_to_tensorboard: bool = opt(
        False,
        "Also write 'iteration-time', 'throughput' and every timer of --timing-log-level ('<name>-time', seconds "
        "per iteration, the slowest rank) at each --log-interval.",
    )
    log_validation_ppl_to_tensorboard: bool = opt(
        False, "Also write the validation perplexity ('lm loss validation ppl')."
    )
    log_memory_to_tensorboard: bool = opt(
        False,
        "Also write the last rank's CUDA memory ('mem-reserved-bytes', 'mem-allocated-bytes', "
        "'mem-max-allocated-bytes', 'mem-allocated-count'; nothing on CPU).",
    )
    log_world_size_to_tensorboard: bool = opt(False, "Also write 'world-size'.")
    no_log_loss_scale_to_tensorboard: bool = opt(
        False,
        "Do not write 'loss-scale' (written by default; 1 without fp16).",
        aliases=("--disable-log-loss-scale-to-tensorboard",),
    )
    wandb_project: str | None = opt(
        None,
        "Log to Weights & Biases in this project (the last rank; needs the wandb package and --wandb-exp-name; "
        "WANDB_MODE=offline keeps the run on disk).",
    )
    wandb_exp_name: str | None = opt(None, "The W&B run's name.")
    wandb_entity: str | None = opt(None, "The W&B team or user (default: the API key's).")
    wandb_save_dir: str | None = opt(None, "Where W&B keeps its files (default: --save/wandb).")
    log_progress: bool = opt(
        False,
        "Append Megatron-LM's progress.txt under --save: the job's start and each save, with this job's and the "
        "cumulative throughput, the floating-point operations and the tokens so far.",
    )
    log_params_norm: bool = opt(
        False,
        "Log the L2 norm of the model's weights at every logged iteration (each weight counted once: the same "
        "under any layout).",
    )
    metrics_file: str | None = opt(
        None, "Append one JSON object per logged iteration (JSON Lines).", env="METRICS_FILE"
    )
    timeline: str | None = opt(
        None,
        "Write the start and end of every forward and backward pass of every rank, for the last few steps, "
        "to this JSON file (a Chrome trace: chrome://tracing or Perfetto; tools/plot_schedule.py --timeline).",
        env="TIMELINE",
    )
    straggler_margin: float = opt(
        0.1,
        "Name a rank as a straggler, in the log and the metrics file, when its compute time per microbatch "
        "exceeds the median of the other ranks of its pipeline stage by more than this fraction in "
        "--straggler-windows consecutive log windows.",
        above=0,
    )
    straggler_windows: int = opt(
        3,
        "Consecutive log windows a rank must be slower than its peers by --straggler-margin before it is named "
        "as a straggler.",
        minimum=1,
    )
    profile: bool = opt(
        False,
        "Profile iterations --profile-step-start+1 to --profile-step-end on --profile-ranks: CUDA profiler API and "
        "NVTX ranges for nsys (GPU), or PyTorch's profiler with --use-pytorch-profiler.",
    )
    use_pytorch_profiler: bool = opt(
        False, "With --profile: PyTorch's profiler, one trace per profiled rank in --tensorboard-dir (CPU too)."
    )
    profile_step_start: int = opt(10, "With --profile: iterations done before the first profiled one.", minimum=0)
    profile_step_end: int = opt(12, "With --profile: the last profiled iteration.", minimum=1)
    profile_ranks: tuple[int, ...] = opt((0,), "With --profile: the global ranks to profile.")
    record_memory_history: bool = opt(
        False,
        "Record CUDA allocations from the start; the last rank writes a snapshot to --memory-snapshot-path at "
        "every logged iteration (GPU).",
    )
    memory_snapshot_path: str = opt("snapshot.pickle", "With --record-memory-history: the snapshot file.")
    dry_run: bool = opt(False, "Validate and print the plan; create no process group; exit 0 if valid.")
    device: str = opt(
        "auto", "Where to run: cuda, cpu, or auto (cuda when available).", choices=["auto", "cuda", "cpu"], env="DEVICE"
    )
    distributed_backend: str | None = opt(
        None,
        "Megatron-LM's backend choice, checked against the device: nccl on GPU, gloo on CPU (the device decides; "
        "default: the device's).",
        choices=["nccl", "gloo"],
    )
    distributed_timeout_minutes: int = opt(
        10,
        "Timeout of collective operations: how long ranks wait for a peer that died without closing its "
        "connections (a lost node) before the run fails.",
        env="COLLECTIVE_TIMEOUT_MINUTES",
        minimum=1,
    )
    timing_log_level: int = opt(
        0,
        "Megatron-Core timers: 0 none, 1 the step (forward-backward, optimizer), 2 also every microbatch's "
        "forward/backward compute and pipeline send/receive waits, which gives the measured pipeline bubble "
        "(synchronises the GPU around each; costs a little speed).",
        choices=[0, 1, 2],
    )

    def _relations(self) -> None:
        self._profile_relations()
        if self.use_checkpoint_args and not self.load:
            raise ConfigError("--use-checkpoint-args takes the model's flags from the checkpoint under --load: give it")
        if (self.use_mp_args_from_checkpoint_args or self.no_use_tokenizer_model_from_checkpoint_args) and not (
            self.use_checkpoint_args
        ):
            raise ConfigError(
                "--use-mp-args-from-checkpoint-args and --no-use-tokenizer-model-from-checkpoint-args apply with "
                "--use-checkpoint-args only"
            )
        if self.wandb_project and not self.wandb_exp_name:
            raise ConfigError("--wandb-project needs --wandb-exp-name, the W&B run's name (as Megatron-LM)")
        if self.wandb_project and not (self.wandb_save_dir or self.save):
            raise ConfigError("--wandb-project keeps its files under --save/wandb: give --save or --wandb-save-dir")
        if self.distributed_backend is not None and self.device != "auto":
            problem = backend_problem(self.distributed_backend, self.device)
            if problem:
                raise ConfigError(problem)
        if (self.manual_gc_interval or self.no_manual_gc_eval) and not self.manual_gc:
            raise ConfigError("--manual-gc-interval and --no-manual-gc-eval apply only with --manual-gc")
        if self.ckpt_format != "torch_dist":
            why = CHECKPOINT_FORMATS.get(self.ckpt_format, "not a checkpoint format Megatron-LM knows")
            raise ConfigError(
                f"--ckpt-format {self.ckpt_format}: {why}; this project saves and loads torch_dist checkpoints "
                "(drop the flag or give torch_dist)"
            )

    def _profile_relations(self) -> None:
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        profiling = ("use_pytorch_profiler", "profile_step_start", "profile_step_end", "profile_ranks")
        changed = [f"--{n.replace('_', '-')}" for n in profiling if getattr(self, n) != defaults[n]]
        if changed and not self.profile:
            raise ConfigError(f"{', '.join(changed)} apply only with --profile")
        if self.memory_snapshot_path != defaults["memory_snapshot_path"] and not self.record_memory_history:
            raise ConfigError("--memory-snapshot-path applies only with --record-memory-history")
        if self.profile and self.profile_step_end <= self.profile_step_start:
            raise ConfigError(
                f"--profile-step-end {self.profile_step_end} must be after --profile-step-start "
                f"{self.profile_step_start}"
            )
        if self.use_pytorch_profiler and self.tensorboard_dir is None:
            raise ConfigError("--use-pytorch-profiler writes its traces into --tensorboard-dir; give one")
        if self.device == "cpu" and self.profile and not self.use_pytorch_profiler:
            raise ConfigError("--profile without --use-pytorch-profiler needs a GPU (nsys); add --use-pytorch-profiler")
        if self.device == "cpu" and self.record_memory_history:
            raise ConfigError("--record-memory-history records CUDA allocations; it needs a GPU")


DEVICE_BACKENDS = {"cuda": "nccl", "cpu": "gloo"}
"""The process-group backend of each device (``training.distributed`` creates it)."""


def backend_problem(backend: str, device: str) -> str | None:
    """Why ``--distributed-backend`` does not fit the device (None: it does)."""
    wanted = DEVICE_BACKENDS[device]
    if backend == wanted:
        return None
    return (
        f"--distributed-backend {backend} does not fit the device ({device}), whose backend is {wanted}: drop the "
        f"flag (the device decides), give --distributed-backend {wanted}, or run on "
        f"{'GPUs' if backend == 'nccl' else 'CPU processes (--device cpu)'}"
    )
