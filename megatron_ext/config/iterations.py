"""How long a run is and how its batch and learning rate evolve: iterations or samples, and batch ramp-up.

Megatron-LM counts a run in iterations (``--train-iters``, with
``--lr-*-iters``) or in samples (``--train-samples``, with ``--lr-*-samples``
and optionally ``--rampup-batch-size``), never a mix. Its rules and formulas
(``megatron/training/arguments.py`` ``validate_args``, ``training.py``
``update_train_iters`` and ``get_optimizer_param_scheduler``) are here, once,
for ``make_config``, the training loop, the data sizes and the plan.

The number of microbatches of every step comes from Megatron-Core's own
calculator classes (``megatron.core.num_microbatches_calculator``), held by
the run instead of Megatron-LM's process-wide one.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from megatron_ext.parallel.layout import LayoutError, ParallelLayout

if TYPE_CHECKING:
    from megatron_ext.config.arguments import BatchArgs
    from megatron_ext.config.optimizer_args import OptimizerArgs
    from megatron_ext.config.run_args import RunArgs

RAMPUP = "--rampup-batch-size"


def unit_problems(optim: OptimizerArgs, run: RunArgs, batch: BatchArgs, *, train_iters_given: bool) -> list[str]:
    """Iteration and sample counts mixed in one run, each named with its replacement (Megatron-LM's rules)."""
    by_samples = {
        "--lr-decay-samples": optim.lr_decay_samples is not None,
        "--lr-warmup-samples": bool(optim.lr_warmup_samples),
        "--lr-wsd-decay-samples": optim.lr_wsd_decay_samples is not None,
        RAMPUP: batch.rampup_batch_size is not None,
    }
    by_iters = {
        "--lr-decay-iters": optim.lr_decay_iters is not None,
        "--lr-warmup-iters": bool(optim.lr_warmup_iters),
        "--lr-wsd-decay-iters": optim.lr_wsd_decay_iters is not None,
    }
    if run.train_samples is None:
        # Megatron-LM refuses these too ("expected iteration-based training" and the like).
        return [
            f"{flag} needs samples-based training: give --train-samples (and --lr-*-samples) instead of "
            f"--train-iters (and --lr-*-iters), or drop {flag}"
            for flag, given in by_samples.items()
            if given
        ]
    problems = []
    if train_iters_given:
        problems.append("--train-iters and --train-samples both give the run's length; give one of them")
    problems += [
        f"{flag} counts iterations, but --train-samples counts samples: give {flag.replace('-iters', '-samples')}"
        for flag, given in by_iters.items()
        if given
    ]
    return problems


def microbatch_calculator(batch: BatchArgs, layout: ParallelLayout, *, rank: int = 0) -> Any:
    """Megatron-Core's calculator of the microbatches per step (constant, or ramping up with the batch)."""
    with warnings.catch_warnings():
        # Importing megatron.core warns that Transformer Engine and apex are absent; a plan does not need them.
        warnings.simplefilter("ignore")
        from megatron.core.num_microbatches_calculator import (
            ConstantNumMicroBatchesCalculator,
            StepBatchsizeNumMicroBatchesCalculator,
        )

    common = {
        "global_batch_size": layout.global_batch_size,
        "micro_batch_size": layout.micro_batch_size,
        "data_parallel_size": layout.dp,
        "decrease_batch_size_if_needed": batch.decrease_batch_size_if_needed,
        "rank": rank,
    }
    if batch.rampup_batch_size is None:
        return ConstantNumMicroBatchesCalculator(**common)
    # Megatron-Core 0.19 removed RampupBatchsizeNumMicroBatchesCalculator: the same ramp as a step schedule
    # (0.16's rule: batch start + increment·int(consumed / (samples / increments))), sizes rounded down to
    # micro-batch × DP here with --decrease-batch-size-if-needed (the step calculator refuses that flag).
    start, increment, samples = batch.rampup_batch_size
    gbs, block = layout.global_batch_size, layout.micro_batch_size * layout.dp
    increments = (gbs - start) // increment
    steps: dict[int, int] = {}
    for i in range(increments + 1):
        size = start + i * increment
        if batch.decrease_batch_size_if_needed:
            size -= size % block
        steps[math.ceil(i * samples / increments) if increments else 0] = size
    schedule = " ".join(f"{t}:{b}" for t, b in sorted(steps.items()))
    return StepBatchsizeNumMicroBatchesCalculator(
        micro_batch_size=layout.micro_batch_size, data_parallel_size=layout.dp,
        decrease_batch_size_if_needed=False, rank=rank, schedule=schedule,
    )  # fmt: skip


def ramp_problems(batch: BatchArgs, layout: ParallelLayout) -> list[str]:
    """Why ``--rampup-batch-size`` cannot run with this layout (checked before Megatron-Core's asserts)."""
    if batch.rampup_batch_size is None:
        return []
    start, increment, _ = batch.rampup_batch_size
    gbs, block = layout.global_batch_size, layout.micro_batch_size * layout.dp
    if start > gbs:
        return [f"{RAMPUP}: the start, {start}, is larger than --global-batch-size {gbs}; it ramps up to it"]
    if start == gbs:
        return [f"{RAMPUP}: the start equals --global-batch-size {gbs}, so there is nothing to ramp; drop the flag"]
    if (gbs - start) % increment:
        return [
            f"{RAMPUP}: --global-batch-size {gbs} − start {start} = {gbs - start} is not a multiple of the "
            f"increment {increment}; choose an increment that divides it"
        ]
    problems = []
    for size in range(start, gbs, increment):
        running = size - size % block if batch.decrease_batch_size_if_needed else size
        if running == 0:
            problems.append(
                f"{RAMPUP}: global batch {size} is smaller than micro-batch × DP = {block}; start at {block} or more"
            )
            continue
        if size % block and not batch.decrease_batch_size_if_needed:
            problems.append(
                f"{RAMPUP}: global batch {size} is not a multiple of micro-batch × DP = {block}; choose a start and "
                "increment that are, or add --decrease-batch-size-if-needed to round each down"
            )
            continue
        try:
            dataclasses.replace(layout, global_batch_size=running)
        except LayoutError as exc:
            problems += [f"{RAMPUP}, at global batch {running}: {p}" for p in exc.problems]
    return problems


def ramp(batch: BatchArgs, layout: ParallelLayout) -> Iterator[int]:
    """The global batch of iterations 1, 2, ... while it ramps up (after --decrease-batch-size-if-needed's
    rounding); nothing without a ramp-up. The first iteration not listed trains with --global-batch-size."""
    if batch.rampup_batch_size is None:
        return
    calculator = microbatch_calculator(batch, layout, rank=-1)
    consumed = 0
    while True:
        calculator.update(consumed, consistency_check=False)
        size = calculator.get_current_running_global_batch_size()
        if size in (layout.global_batch_size, 0):  # 0: rounded away, which ramp_problems refuses
            return
        yield size
        consumed += size


def training_iterations(run: RunArgs, batch: BatchArgs, layout: ParallelLayout) -> int:
    """``--train-iters``, or the iterations ``--train-samples`` makes (Megatron-LM's ``update_train_iters``).

    Without a ramp-up: samples // global batch. With one: the ramp's iterations
    while no more than its samples (and the run's) are consumed, then whole
    global batches of what is left; a partial last batch is dropped.
    """
    if run.train_samples is None:
        return run.train_iters
    gbs = layout.global_batch_size
    if batch.rampup_batch_size is None:
        return run.train_samples // gbs
    ramp_samples = batch.rampup_batch_size[2]
    calculator = microbatch_calculator(batch, layout, rank=-1)
    iterations = consumed = 0
    while consumed <= ramp_samples and consumed <= run.train_samples:
        calculator.update(consumed, consistency_check=False)
        consumed += calculator.get_current_global_batch_size()
        iterations += 1
    return iterations + max(run.train_samples - consumed, 0) // gbs


def trained_samples(batch: BatchArgs, layout: ParallelLayout, train_iters: int) -> int:
    """Samples the run's iterations consume (what the training split must hold)."""
    ramped = list(itertools.islice(ramp(batch, layout), train_iters))
    return sum(ramped) + (train_iters - len(ramped)) * layout.global_batch_size


def split_samples(run: RunArgs, batch: BatchArgs, layout: ParallelLayout) -> list[int]:
    """Samples the run reads from the train, valid and test splits.

    Training: ``--train-samples`` when given (a ramp-up's iterations may take
    one batch more), else what its iterations consume. Every evaluation reads
    the same first ``--eval-iters`` global batches of the validation split, so
    successive validation losses are comparable; the test split is read once.
    """
    trained = trained_samples(batch, layout, run.train_iters)
    evaluated = run.eval_iters * layout.global_batch_size
    return [max(run.train_samples or 0, trained), evaluated, evaluated]


@dataclass(frozen=True)
class LrSteps:
    """The learning-rate and weight-decay schedule's lengths, in samples (Megatron-Core's scheduler counts
    samples, so that a checkpoint's schedule means the same under any batch size)."""

    warmup: float
    decay: int
    wd_incr: int
    wsd_decay: int | None


def lr_steps(optim: OptimizerArgs, run: RunArgs, global_batch_size: int) -> LrSteps:
    """Megatron-LM's ``get_optimizer_param_scheduler``: iteration counts × global batch, or sample counts.

    The warm-up is the ``-iters``/``-samples`` count, or ``--lr-warmup-fraction``
    of the decay; the decay defaults to the whole run; weight decay changes over
    the whole run.
    """
    if run.train_samples is None:
        decay = (optim.lr_decay_iters or run.train_iters) * global_batch_size
        wd_incr = run.train_iters * global_batch_size
        wsd = None if optim.lr_wsd_decay_iters is None else optim.lr_wsd_decay_iters * global_batch_size
        warmup = float(optim.lr_warmup_iters * global_batch_size)
    else:
        decay = optim.lr_decay_samples or run.train_samples
        wd_incr = run.train_samples
        wsd = optim.lr_wsd_decay_samples
        warmup = float(optim.lr_warmup_samples)
    if optim.lr_warmup_fraction is not None:
        warmup = optim.lr_warmup_fraction * decay
    return LrSteps(warmup=warmup, decay=max(decay, 1), wd_incr=max(wd_incr, 1), wsd_decay=wsd)


def lr_problems(steps: LrSteps) -> list[str]:
    """Schedules Megatron-Core's scheduler would assert on at start-up, said before launch (lengths in samples)."""
    problems = []
    if steps.warmup >= steps.decay:
        problems.append(
            f"the warm-up ({steps.warmup:g} samples) must be shorter than the decay ({steps.decay} samples: "
            "--lr-decay-iters/--lr-decay-samples, default the whole run); lower the warm-up or lengthen the decay"
        )
    if steps.wsd_decay is not None and steps.wsd_decay > steps.decay:
        problems.append(
            f"the WSD anneal ({steps.wsd_decay} samples) is longer than the decay ({steps.decay} samples); "
            "shorten --lr-wsd-decay-iters/--lr-wsd-decay-samples"
        )
    return problems
