"""Derived numbers of a run, computed without building anything.

Used by ``--dry-run`` and printed at the start of every run.
"""

from __future__ import annotations

from megatron_ext.config import iterations
from megatron_ext.config.training_config import TrainingConfig, pad_vocab_size
from megatron_ext.estimate.coverage import approximations
from megatron_ext.estimate.memory import checkpoint_bytes_per_parameter
from megatron_ext.estimate.shapes import ParameterCounts
from megatron_ext.estimate.shapes import parameter_counts as model_parameter_counts
from megatron_ext.estimate.zero_bubble import simulate_zero_bubble
from megatron_ext.parallel.layout import ParallelLayout
from megatron_ext.parallel.pipeline import zb_h1_bubble_fraction


def zero_bubble_line(layout: ParallelLayout) -> str:
    """The pipeline bubble of ``--enable-zero-bubble`` on this layout (ZB-H1, or ZB interleaved with virtual
    stages), with equal F, B and W passes, beside 1F1B's that ``ParallelLayout.describe`` prints."""
    if layout.interleaved:
        zb = simulate_zero_bubble(
            "zb-interleaved", pp=layout.pp, vp=layout.vp, num_microbatches=layout.num_microbatches
        )
        return (
            f"schedule: ZB interleaved (--enable-zero-bubble, {layout.vp} virtual stages): pipeline bubble "
            f"{zb.bubble_of_ideal:.3f} of the compute, simulated with equal F, B and W passes (interleaved 1F1B's: "
            f"(p-1)/(v*m) = {layout.bubble_fraction:.3f})"
        )
    fraction = zb_h1_bubble_fraction(pp=layout.pp, num_microbatches=layout.num_microbatches)
    return (
        f"schedule: ZB-H1 (--enable-zero-bubble): pipeline bubble (p-1)/(3*m) = {fraction:.3f} with equal F, B "
        "and W passes, a third of 1F1B's"
    )


def parameter_counts(cfg: TrainingConfig) -> ParameterCounts:
    """The run's parameter counts (``shapes.parameter_counts`` for its model, vocabulary and layout)."""
    layout = cfg.layout
    return model_parameter_counts(
        cfg.model,
        padded_vocab_size=cfg.padded_vocab_size,
        tp=layout.tp,
        pp=layout.pp,
        stage_layers=layout.layers_per_rank,
    )


def checkpoint_bytes(cfg: TrainingConfig) -> float:
    """The size of one of the run's checkpoints, with optimizer state (``memory.checkpoint_bytes_per_parameter``)."""
    per_parameter = checkpoint_bytes_per_parameter(
        mixed_precision=cfg.optim.bf16 or cfg.optim.fp16, distributed_optimizer=cfg.layout.use_distributed_optimizer
    )
    return parameter_counts(cfg).total * per_parameter


def _kept_padding(cfg: TrainingConfig) -> str:
    if cfg.checkpoint_padded_vocab_size is None:
        return ""
    own = pad_vocab_size(cfg.vocab_size, cfg.model.make_vocab_size_divisible_by, cfg.layout.tp)
    return f" (the checkpoint's under --load; TP {cfg.layout.tp} alone would pad {cfg.vocab_size:,} tokens to {own:,})"


def describe(cfg: TrainingConfig) -> list[str]:
    """The derived numbers as lines (``--dry-run`` and the start of every run): layout, batch, schedule, tokens per
    step, vocabulary, parameters, training length, and what the estimates approximate."""
    counts = parameter_counts(cfg)
    layout = cfg.layout
    tokens = layout.global_batch_size * cfg.model.seq_length
    lines = [f"note: {change}" for change in cfg.adjustments]
    lines += layout.describe()
    if cfg.parallel.enable_zero_bubble:
        lines.append(zero_bubble_line(layout))
    lines += [
        f"tokens per step: {tokens:,} ({layout.global_batch_size} sequences × {cfg.model.seq_length})",
        f"padded vocabulary: {cfg.padded_vocab_size:,}" + _kept_padding(cfg),
        f"parameters: {counts.total:,} in total, {counts.max_per_rank:,} on the most loaded rank",
    ]
    run = cfg.run
    samples = iterations.trained_samples(cfg.batch, layout, run.train_iters)
    asked = f"--train-samples {run.train_samples:,} → " if run.train_samples is not None else ""
    lines.append(
        f"training: {asked}{run.train_iters:,} iterations = {samples:,} samples = {samples * cfg.model.seq_length:,} "
        "tokens"
    )
    ramped = list(iterations.ramp(cfg.batch, layout))
    if ramped:
        sizes = [*sorted(set(ramped)), layout.global_batch_size]
        shown = " → ".join(map(str, sizes)) if len(sizes) <= 5 else f"{sizes[0]} → {sizes[1]} → … → {sizes[-1]}"
        lines.append(
            f"batch ramp-up: global batch {shown} ({len(sizes)} sizes) over the first {len(ramped):,} iterations "
            f"({sum(ramped):,} samples)"
        )
    groups = {"model": cfg.model, "parallel": cfg.parallel, "batch": cfg.batch, "optim": cfg.optim}
    lines += [f"the memory and time estimates approximate {note}" for note in approximations(groups)]
    return lines
