"""Evaluate one layout, or enumerate and rank every valid one, for a GPU count.

Every rule comes from ``ParallelLayout`` (``parallel/layout.py``); this module only
generates candidates, asks the layout whether each is valid, and attaches the
memory (``memory_model.py``) and step-time (``step_time.py``) estimates.

The enumeration generates only candidates that can pass the divisibility
rules: TP among the divisors of the GPU count that divide the heads, the
MLP width and the GPUs of a node (a TP group never spans two nodes), CP among
the divisors of the rest (``context_parallel_sizes``), PP among the divisors
of the rest that divide the layers, VP among the divisors of the layers per stage, micro-batch sizes
among the divisors of the sequences per data-parallel rank. Each is then
validated by ``ParallelLayout.check`` (the interleaved schedule's microbatch
rule, sequence-parallel divisibility, …); where the microbatches are not a
multiple of PP, the interleaved schedule is retried with the smallest
microbatch group size Megatron-Core accepts
(``--microbatch-group-size-per-virtual-pipeline-stage``). Memory grows with the micro-batch
size, so the first micro-batch size that does not fit ends that branch.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from megatron_ext.config.arguments import BatchArgs
from megatron_ext.config.flags import options, to_argv
from megatron_ext.config.layout_flags import context_parallel_problem, layout_args, model_layout_facts
from megatron_ext.config.optimizer_args import OptimizerArgs
from megatron_ext.estimate.hardware import GpuProfile
from megatron_ext.estimate.memory import MemoryEstimate, estimate_memory
from megatron_ext.estimate.step_time import StepTimeEstimate, estimate_step_time, unit_times
from megatron_ext.estimate.workload import Workload
from megatron_ext.parallel.factors import divisors
from megatron_ext.parallel.layout import ParallelLayout
from megatron_ext.parallel.stages import SPLIT_FIELDS, balanced_splits

DEFAULT_MEMORY_HEADROOM = 0.10
"""Share of GPU memory reserved for what the model does not count (CUDA context, NCCL buffers, the allocator's
fragmentation): an estimate within it is "tight". Not measured here (no GPU): a reserve, as the docs say."""

VERDICTS = ("fits", "tight", "does not fit")
"""The memory verdicts: within the usable memory; above it but within the card's capacity (it may run: the
reserve is for what the model does not count); above the capacity (exit 5). No published run is estimated above
its card's capacity (``tests/estimate/test_published.py``): the model's measured error leaves the capacity the
line between "tight" and "does not fit"."""


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """The GPUs of one job."""

    gpus: int
    """World size."""
    gpus_per_node: int
    """GPUs per node (TP must stay within a node)."""
    gpu: GpuProfile
    """Hardware profile of every GPU."""
    memory_headroom: float = DEFAULT_MEMORY_HEADROOM
    """Share of memory the estimate may not use."""

    @property
    def nodes(self) -> int:
        return -(-self.gpus // self.gpus_per_node)

    @property
    def usable_memory_bytes(self) -> float:
        return self.gpu.memory_bytes * (1 - self.memory_headroom)

    def problems(self) -> list[str]:
        """Inconsistent counts, each with a fix."""
        p = list(self.gpu.problems())
        if self.gpus < 1:
            p.append(f"--gpus must be at least 1, got {self.gpus}")
        if self.gpus_per_node < 1:
            p.append(f"--gpus-per-node must be at least 1, got {self.gpus_per_node}")
        elif self.gpus > self.gpus_per_node and self.gpus % self.gpus_per_node:
            below = self.gpus // self.gpus_per_node * self.gpus_per_node
            p.append(
                f"--gpus {self.gpus} is not a whole number of {self.gpus_per_node}-GPU nodes; "
                f"use {below} or {below + self.gpus_per_node} GPUs (or --nodes N)"
            )
        if not 0 <= self.memory_headroom < 1:
            p.append(f"--memory-headroom must be in [0, 1), got {self.memory_headroom}")
        return p


def memory_verdict(total_bytes: float, cluster: Cluster) -> str:
    """``fits`` within the usable memory, ``tight`` within the card's capacity (it may run), else ``does not
    fit``: how every estimate of a GPU's memory is judged."""
    if total_bytes <= cluster.usable_memory_bytes:
        return "fits"
    return "tight" if total_bytes <= cluster.gpu.memory_bytes else "does not fit"


@dataclass(frozen=True, kw_only=True)
class LayoutEstimate:
    """One valid layout with its memory and step-time estimates."""

    layout: ParallelLayout
    """The validated layout."""
    memory: MemoryEstimate
    """Memory of the most loaded GPU (and the first and last stage)."""
    time: StepTimeEstimate
    """Step time and its parts."""
    cluster: Cluster
    """Where it runs."""
    seq_length: int
    """Tokens per sequence."""
    peak_flops: float
    """The GPU's peak in the training precision (bf16/fp16 tensor cores, or fp32), FLOP/s."""
    zero_bubble: bool = False
    """Priced under the zero-bubble schedule (``--enable-zero-bubble``; ``schedules``)."""

    @property
    def verdict(self) -> str:
        """``fits``, ``tight`` or ``does not fit`` (``VERDICTS``)."""
        return memory_verdict(self.memory.total_bytes, self.cluster)

    @property
    def fits(self) -> bool:
        """Not estimated above the card's capacity (``fits`` or ``tight``)."""
        return self.memory.total_bytes <= self.cluster.gpu.memory_bytes

    @property
    def fits_with_reserve(self) -> bool:
        """Within the usable memory (verdict ``fits``): what an unattended re-plan asks for."""
        return self.verdict == "fits"

    @property
    def tight(self) -> bool:
        return self.verdict == "tight"

    @property
    def memory_margin_bytes(self) -> float:
        """The card's capacity less the estimate (negative: over it)."""
        return self.cluster.gpu.memory_bytes - self.memory.total_bytes

    @property
    def tokens_per_sec(self) -> float:
        return self.layout.global_batch_size * self.seq_length / self.time.step_s

    @property
    def tflops_per_gpu(self) -> float:
        """Model TFLOP/s per GPU (Megatron-LM's formula, as the training loop reports)."""
        return self.time.model_flops / self.time.step_s / self.layout.world_size / 1e12

    @property
    def hardware_tflops_per_gpu(self) -> float:
        """TFLOP/s per GPU including recomputation (Narayanan et al. 2021's accounting)."""
        return self.time.hardware_flops / self.time.step_s / self.layout.world_size / 1e12

    @property
    def mfu(self) -> float:
        return self.tflops_per_gpu * 1e12 / self.peak_flops

    def to_json(self) -> dict[str, Any]:
        """The calculator's JSON record of this layout (schema in docs/layout-model.md)."""
        lay, mem, t = self.layout, self.memory, self.time
        most = mem.most_loaded
        return {
            "tp": lay.tp,
            "cp": lay.cp,
            "pp": lay.pp,
            "vp": lay.vp,
            "dp": lay.dp,
            "micro_batch_size": lay.micro_batch_size,
            "num_microbatches": lay.num_microbatches,
            "microbatch_group_size": lay.microbatch_group_size_per_vp_stage,
            "global_batch_size": lay.global_batch_size,
            "sequence_parallel": lay.sequence_parallel,
            "use_distributed_optimizer": lay.use_distributed_optimizer,
            "fits": self.fits,
            "memory_verdict": self.verdict,
            "memory_margin_bytes": int(self.memory_margin_bytes),
            "memory": {
                "weights_and_optimizer_bytes": int(most.weights_and_optimizer_bytes),
                "activations_bytes": int(most.activations_bytes),
                "total_bytes": int(most.total_bytes),
                "weights_bytes": int(most.weights_bytes),
                "gradients_bytes": int(most.gradients_bytes),
                "optimizer_states_bytes": int(most.optimizer_bytes),
                "parameters": most.parameters,
                "in_flight_microbatches": most.in_flight_microbatches,
                "most_loaded_stage": most.stage,
                "usable_bytes": int(self.cluster.usable_memory_bytes),
                "capacity_bytes": self.cluster.gpu.memory_bytes,
            },
            "pipeline_split": lay.split.mode,
            "stages": [
                {
                    "pipeline_rank": r,
                    "layers": [c.num_layers for c in lay.stages[r]],
                    "embedding": lay.stages[r][0].embedding,
                    "loss": lay.stages[r][-1].loss,
                    "microbatch_s": t.stage_microbatch_s[r],
                    "memory_bytes": int(mem.stages[r].total_bytes),
                    "parameters": mem.stages[r].parameters,
                }
                for r in range(lay.pp)
            ],
            "stage_imbalance": t.stage_imbalance,
            "schedule": schedule_name(self),
            "bubble_fraction": lay.bubble_fraction * t.bubble_scale,
            "bubble_share_of_step": t.bubble_share,
            "step_time_s": t.step_s,
            "tokens_per_sec": self.tokens_per_sec,
            "tflops_per_gpu": self.tflops_per_gpu,
            "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu,
            "mfu": self.mfu,
            "time": {
                "compute_s": t.compute_s,
                "tp_comm_s": t.tp_comm_s,
                "cp_comm_s": t.cp_comm_s,
                "bubble_s": t.bubble_s,
                "pp_comm_s": t.pp_comm_s,
                "dp_comm_s": t.dp_comm_s,
                "dp_comm_total_s": t.dp_comm_total_s,
                "optimizer_s": t.optimizer_s,
                "housekeeping_s": t.housekeeping_s,
            },
        }


def schedule_name(estimate: LayoutEstimate) -> str:
    """The estimate's pipeline schedule: ``none`` (PP 1), ``1f1b``, ``interleaved-1f1b``, ``zb-h1`` or
    ``zb-interleaved``."""
    lay = estimate.layout
    if lay.pp == 1:
        return "none"
    if estimate.zero_bubble:
        return "zb-interleaved" if lay.interleaved else "zb-h1"
    return "interleaved-1f1b" if lay.interleaved else "1f1b"


def evaluate(workload: Workload, layout: ParallelLayout, cluster: Cluster) -> LayoutEstimate:
    """Memory and step time of one (validated) layout."""
    memory = estimate_memory(workload, layout)
    time = estimate_step_time(
        workload,
        layout,
        cluster.gpu,
        gpus_per_node=cluster.gpus_per_node,
        rank_parameters=max(st.parameters for st in memory.stages),
    )
    peak = cluster.gpu.peak_flops if workload.mixed_precision else cluster.gpu.peak_flops_fp32
    return LayoutEstimate(
        layout=layout,
        memory=memory,
        time=time,
        cluster=cluster,
        seq_length=workload.model.seq_length,
        peak_flops=peak,
        zero_bubble=workload.zero_bubble and layout.pp > 1,
    )


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    """Every valid layout that was estimated, best first."""

    estimates: list[LayoutEstimate] = field(default_factory=list)
    """Fitting layouts by step time, then the ones that do not fit by memory."""
    candidates: int = 0
    """Candidates generated and validated."""
    problems: list[str] = field(default_factory=list)
    """When nothing was valid: the problems of the first candidate (the simplest layout)."""

    @property
    def fitting(self) -> list[LayoutEstimate]:
        return [e for e in self.estimates if e.fits]


def _options(generated: Iterable[int], wanted: int | None) -> list[int]:
    """The generated candidates, or only the one asked for (which the layout then validates)."""
    return list(generated) if wanted is None else [wanted]


def search(
    workload: Workload,
    cluster: Cluster,
    *,
    global_batch_size: int,
    sequence_parallel: bool = False,
    use_distributed_optimizer: bool = False,
    tp: int | None = None,
    cp: int | None = None,
    pp: int | None = None,
    vp: int | None = None,
    micro_batch_size: int | None = None,
    uneven: bool = True,
    split: Mapping[str, Any] | None = None,
) -> SearchResult:
    """All valid layouts of ``cluster.gpus`` GPUs (optionally with some factors fixed), best first.

    ``sequence_parallel`` applies to the candidates with TP > 1 (Megatron-LM
    itself turns it off at TP = 1). Context parallelism is searched where the
    model builds Transformer Engine's flash or fused attention (``context_parallel_sizes``).
    ``uneven``: also estimate uneven stage splits (``stages.balanced_splits``),
    for pipeline sizes that do not divide the layers too; one is kept where it
    is more than ``UNEVEN_GAIN`` faster than the even split of the same
    factors, or where the even split is invalid or does not fit. ``split``: placement flags given
    (``--account-for-embedding-in-pipeline-split``, ``--account-for-loss-in-pipeline-split``), applied to
    every candidate instead of the search's own uneven splits.
    """
    model = workload.model
    world, layers = cluster.gpus, model.num_layers
    estimates: list[LayoutEstimate] = []
    candidates = 0
    first_problems: list[str] = []
    heads, ffn = model.num_attention_heads, model.effective_ffn_hidden_size
    # TP groups are consecutive ranks: a size that does not divide a node's GPUs would put some across two nodes,
    # whose collectives the estimate prices at NVLink speed.
    tps = [t for t in divisors(world) if cluster.gpus_per_node % t == 0 and heads % t == 0 and ffn % t == 0]
    factors = [(t, c) for t in _options(tps, tp) for c in _options(context_parallel_sizes(workload, world // t), cp)]
    for t, c in factors:
        # Placement flags need a pipeline: PP 1 is no candidate then.
        pps = (
            p
            for p in divisors(world // (t * c))
            if p <= layers and (uneven or split or layers % p == 0) and (p > 1 or not split)
        )
        for p in _options(pps, pp):
            dp = world // (t * c * p) if world % (t * c * p) == 0 else 0
            per_dp = global_batch_size // dp if dp and global_batch_size % dp == 0 else 0
            vps = divisors(layers // p) if layers % p == 0 else [v for v in UNEVEN_VPS if p > 1 and p * v <= layers]
            for v in _options(vps, vp):
                if v > 1 and p <= 2 and not workload.overlap_p2p_comm:
                    continue  # Megatron-LM refuses blocking interleaved transfers between two stages
                for b in _options(divisors(per_dp) if per_dp else [1], micro_batch_size):
                    values: dict[str, Any] = dict(
                        world_size=world,
                        tensor_model_parallel_size=t,
                        context_parallel_size=c,
                        pipeline_model_parallel_size=p,
                        virtual_pipeline_model_parallel_size=v if v > 1 else None,
                        sequence_parallel=sequence_parallel and t > 1,
                        use_distributed_optimizer=use_distributed_optimizer,
                        micro_batch_size=b,
                        global_batch_size=global_batch_size,
                        **model_layout_facts(model),
                        gpus_per_node=cluster.gpus_per_node,
                        **(split or {}),
                    )
                    candidates += 1
                    # Microbatches that PP does not divide: the smallest group size Megatron-Core accepts
                    # (the least memory; the time is the same), kept for the uneven splits too.
                    layout, problems = ParallelLayout.check_grouped(**values)
                    values["microbatch_group_size_per_vp_stage"] = layout.microbatch_group_size_per_vp_stage
                    first_problems = first_problems or problems
                    found = []
                    ranked = schedules(workload, pp=p)
                    candidates += len(ranked) - 1
                    for scheduled in ranked:
                        even = [] if problems else [evaluate(scheduled, layout, cluster)]
                        if uneven and not split and p > 1:
                            kept, tried = _uneven_estimates(
                                scheduled, cluster, values, layout, even[0] if even else None
                            )
                            candidates += len(tried)
                            even += kept
                        found += even
                    estimates += found
                    if found and not any(e.fits for e in found):
                        break  # larger micro-batches only need more memory
    # What fits first, then what is tight (it may run), each by step time; then the rest by memory.
    estimates.sort(
        key=lambda e: (not e.fits, e.tight, e.time.step_s if e.fits else e.memory.total_bytes, e.memory.total_bytes)
    )
    return SearchResult(estimates=estimates, candidates=candidates, problems=[] if estimates else first_problems)


CP_MIN_TOKENS_PER_RANK = 4096
"""The search tries a context-parallel size only where each rank keeps at least this many tokens of a sequence:
the fewest any published CP run the model is validated on gives a rank (Llama 3.1 8B, 70B and 405B at 8k with
CP 2, ``tests/estimate/published.py``). Below it the estimate is unchecked (the GEMMs run on slivers of a
sequence and the key/value exchange grows against them); such a layout can still be evaluated
(``--context-parallel-size``)."""


def context_parallel_sizes(workload: Workload, gpus: int) -> list[int]:
    """The context-parallel sizes the search tries on ``gpus`` GPUs (those left after TP): 1, and where the model's
    attention can split sequences (``layout_flags.context_parallel_problem``), every divisor whose two chunks a
    rank holds split the sequence evenly (``seq_length`` divisible by 2 × CP) and that leaves each rank
    ``CP_MIN_TOKENS_PER_RANK`` tokens of it."""
    s = workload.model.seq_length
    if context_parallel_problem(workload.model, 2) is not None:
        return [1]
    return [c for c in divisors(gpus) if c == 1 or (s % (2 * c) == 0 and s // c >= CP_MIN_TOKENS_PER_RANK)]


def zero_bubble_possible(workload: Workload, *, pp: int) -> bool:
    """Whether a run could take ``--enable-zero-bubble`` (``layout_flags.zero_bubble_problems``): a pipeline, and
    no ``--tp-comm-overlap``, whose bulk weight-gradient overlap Transformer Engine's deferred weight gradients
    exclude (or the flag asked for, which the run checks)."""
    return pp > 1 and (workload.zero_bubble or not workload.tp_comm_overlap)


def schedules(workload: Workload, *, pp: int) -> list[Workload]:
    """The pipeline schedules a layout is ranked under: 1F1B (interleaved with virtual stages) and, where the run
    can use it (``zero_bubble_possible``) with the local spec, the zero-bubble one (``--enable-zero-bubble``: ZB-H1,
    or ZB interleaved); only that one where it was asked for."""
    one_f_one_b = dataclasses.replace(workload, zero_bubble=False)
    # Transformer Engine's deferred weight gradients are accepted but not yet measured on a GPU here: not
    # proposed unasked.
    if not zero_bubble_possible(workload, pp=pp) or not (
        workload.zero_bubble or workload.model.local_spec_flag is not None
    ):
        return [one_f_one_b]
    zero_bubble = dataclasses.replace(workload, zero_bubble=True)
    return [zero_bubble] if workload.zero_bubble else [one_f_one_b, zero_bubble]


def scheduled(workload: Workload, estimate: LayoutEstimate) -> Workload:
    """``workload`` under the schedule ``estimate`` was priced with (what its command line asks for)."""
    return dataclasses.replace(workload, zero_bubble=estimate.zero_bubble)


def search_like(
    workload: Workload, cluster: Cluster, layout: ParallelLayout, *, sequence_parallel: bool | None = None
) -> SearchResult:
    """Every layout of ``cluster`` with ``layout``'s global batch, sequence parallelism and distributed optimizer.
    ``sequence_parallel``: the ``--sequence-parallel`` flag as given, where known (Megatron-LM turns it off at TP 1
    only, so a layout at TP 1 does not say whether the others would have it); None: as ``layout`` has it."""
    return search(
        workload,
        cluster,
        global_batch_size=layout.global_batch_size,
        sequence_parallel=layout.sequence_parallel if sequence_parallel is None else sequence_parallel,
        use_distributed_optimizer=layout.use_distributed_optimizer,
    )


@dataclass(frozen=True, kw_only=True)
class SaverSearch:
    """A search that turned memory savers on because nothing fitted without them."""

    result: SearchResult
    """The search that found fitting layouts (or, when none did, the one with every saver)."""
    workload: Workload
    """Its workload (recomputation is a workload option)."""
    sequence_parallel: bool
    use_distributed_optimizer: bool
    added: tuple[str, ...] = ()
    """The ``pretrain_gpt.py`` flags the search added to the ones given (empty: none was needed)."""
    tried: tuple[tuple[str, ...], ...] = ()
    """Every set of added flags that was searched, in order."""


def saver_steps(
    workload: Workload, *, sequence_parallel: bool, use_distributed_optimizer: bool
) -> list[tuple[tuple[str, ...], Workload, bool, bool]]:
    """The memory savers not already on, cheapest first and cumulative: the distributed optimizer with
    sequence parallelism (both cost no compute: the optimizer's all-reduce becomes a reduce-scatter and an
    all-gather of the same volume, and SP's collectives replace TP's all-reduces), then selective
    recomputation (the attention core again in the backward pass), then full recomputation (every layer's
    forward again, uniform, one layer per group: Megatron-LM's settings for the largest models)."""
    steps = []
    flags: tuple[str, ...] = ()
    if not use_distributed_optimizer:
        flags += ("--use-distributed-optimizer",)
    if not sequence_parallel:
        flags += ("--sequence-parallel",)
    if flags:
        steps.append((flags, workload, True, True))
    if workload.recompute_granularity == "none":
        selective = dataclasses.replace(workload, recompute_granularity="selective")
        steps.append(((*flags, "--recompute-granularity selective"), selective, True, True))
    if workload.recompute_granularity != "full":
        full = dataclasses.replace(
            workload, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1
        )
        recompute = "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
        steps.append(((*flags, recompute), full, True, True))
    return steps


def search_with_savers(
    workload: Workload,
    cluster: Cluster,
    *,
    global_batch_size: int,
    sequence_parallel: bool = False,
    use_distributed_optimizer: bool = False,
    micro_batch_size: int | None = None,
    uneven: bool = True,
    split: Mapping[str, Any] | None = None,
) -> SaverSearch:
    """``search`` as given; when no valid layout fits with the reserve to spare, again with the memory savers
    (``saver_steps``) until one does. The first step where something fits is kept: a later one only adds
    recomputation. When none fits with the reserve, the first step where a layout is ``tight`` (it may run) is
    kept, else the last."""

    def run(w: Workload, sp: bool, distopt: bool) -> SearchResult:
        return search(
            w,
            cluster,
            global_batch_size=global_batch_size,
            sequence_parallel=sp,
            use_distributed_optimizer=distopt,
            micro_batch_size=micro_batch_size,
            uneven=uneven,
            split=split,
        )

    given = run(workload, sequence_parallel, use_distributed_optimizer)
    found = SaverSearch(
        result=given,
        workload=workload,
        sequence_parallel=sequence_parallel,
        use_distributed_optimizer=use_distributed_optimizer,
    )

    def comfortable(result: SearchResult) -> bool:
        return any(e.verdict == "fits" for e in result.estimates)

    if comfortable(given) or not given.estimates:
        return found
    runnable = found if given.fitting else None
    tried: list[tuple[str, ...]] = []
    for flags, w, sp, distopt in saver_steps(
        workload, sequence_parallel=sequence_parallel, use_distributed_optimizer=use_distributed_optimizer
    ):
        tried.append(flags)
        result = run(w, sp, distopt)
        found = SaverSearch(
            result=result,
            workload=w,
            sequence_parallel=sp,
            use_distributed_optimizer=distopt,
            added=flags,
            tried=tuple(tried),
        )
        if comfortable(result):
            return found
        if runnable is None and result.fitting:
            runnable = found
    return runnable or found


UNEVEN_VPS = (1, 2, 4)
"""Virtual pipeline sizes tried when the pipeline size does not divide the layers."""
UNEVEN_GAIN = 0.01
"""An uneven split is recommended over the even one only when it is this much faster (1%)."""


def _uneven_estimates(
    workload: Workload,
    cluster: Cluster,
    values: dict[str, Any],
    layout: ParallelLayout,
    even: LayoutEstimate | None,
) -> tuple[list[LayoutEstimate], list[dict[str, Any]]]:
    """(the uneven splits worth keeping, every split tried) for the factors in ``values``."""
    # The loss's weight in layers depends on TP, micro-batch and SP only, which ``layout`` carries even
    # when its even split is invalid.
    loss = unit_times(workload, layout, cluster.gpu, gpus_per_node=cluster.gpus_per_node).output_in_layers
    tried = balanced_splits(layout.num_layers, layout.pp, layout.vp, loss=loss)
    kept = []
    for flags in tried:
        candidate, problems = ParallelLayout.check(**values, **flags)
        if problems:
            continue
        estimate = evaluate(workload, candidate, cluster)
        if (
            even is None
            or (estimate.fits and not even.fits)
            or (estimate.fits and estimate.time.step_s < even.time.step_s * (1 - UNEVEN_GAIN))
        ):
            kept.append(estimate)
    return kept, tried


def better_split(workload: Workload, cluster: Cluster, estimate: LayoutEstimate) -> LayoutEstimate | None:
    """The fastest uneven split of ``estimate``'s factors, when it beats the even one by ``UNEVEN_GAIN``."""
    layout = estimate.layout
    if layout.pp == 1 or layout.uneven:
        return None
    values = {name: value for name, value in layout.as_values().items() if name not in SPLIT_FIELDS}
    kept, _ = _uneven_estimates(workload, cluster, values, layout, estimate)
    return min(kept, key=lambda e: e.time.step_s, default=None)


def pretrain_flags(workload: Workload, layout: ParallelLayout) -> list[str]:
    """The ``pretrain_gpt.py`` flags of this model and layout, ready for a recipe (the flag table's spelling)."""
    m = workload.model
    full = workload.recompute_granularity == "full"
    parallel = layout_args(
        layout, overlap_grad_reduce=workload.overlap_grad_reduce, overlap_param_gather=workload.overlap_param_gather
    )
    parallel = dataclasses.replace(
        parallel,
        enable_zero_bubble=workload.zero_bubble,
        no_overlap_p2p_communication=not workload.overlap_p2p_comm,
        ddp_bucket_size=workload.ddp_bucket_size,
        ddp_num_buckets=workload.ddp_num_buckets,
        tp_comm_overlap=workload.tp_comm_overlap and layout.sequence_parallel,
    )
    batch = BatchArgs(micro_batch_size=layout.micro_batch_size, global_batch_size=layout.global_batch_size)
    training = OptimizerArgs(
        bf16=workload.precision == "bf16",
        fp16=workload.precision == "fp16",
        grad_reduce_in_bf16=workload.grad_reduce_in_bf16,
        fp8_format=workload.fp8_format,
        fp8_recipe=workload.fp8_recipe,
        recompute_granularity=None if workload.recompute_granularity == "none" else workload.recompute_granularity,
        recompute_method=workload.recompute_method if full else None,
        recompute_num_layers=workload.recompute_num_layers if full else None,
    )
    shape = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size")
    groups: list[tuple[Any, tuple[str, ...]]] = [
        (m, shape),
        (parallel, ("tensor_model_parallel_size", "pipeline_model_parallel_size")),
        (batch, ("micro_batch_size", "global_batch_size")),
        (training, ()),
    ]

    def fields_of(values: Any) -> list[str] | None:
        # The whole model (rotary base, norm epsilon, rope scaling: another model without them); of the rest,
        # what the estimate depends on.
        return None if values is m else [f.name for f in options(type(values), estimate=True)]

    pairs = [
        pair for values, always in groups for pair in _pairs(to_argv(values, only=fields_of(values), always=always))
    ]
    # The flags the estimate approximates: the run must still be given them (--squared-relu is another model).
    given = {pair[0] for pair in pairs}
    # Megatron-Core refuses a deferred output-layer weight gradient without a pipeline: not emitted there.
    dropped = given | ({"--defer-embedding-wgrad-compute", "--wgrad-deferral-limit"} if layout.pp == 1 else set())
    pairs += [pair for pair in _pairs(list(workload.approximated)) if pair[0] not in dropped]
    return [shlex.join(pair) for pair in pairs]  # a layout string holds | ( ) *: quoted for the shell


def _pairs(argv: list[str]) -> list[list[str]]:
    """Split a command line into one list per flag with its values (for one flag per line)."""
    out: list[list[str]] = []
    for arg in argv:
        if arg.startswith("--") or not out:
            out.append([arg])
        else:
            out[-1].append(arg)
    return out


def slurm_counts(cluster: Cluster) -> dict[str, int]:
    """Node and task counts of the job: one torchrun per node, or one task per GPU."""
    per_node = min(cluster.gpus, cluster.gpus_per_node)
    return {
        "nodes": cluster.nodes,
        "gpus_per_node": per_node,
        "world_size": cluster.gpus,
        "ntasks_per_node_torchrun": 1,
        "ntasks_per_node_srun": per_node,
    }
