"""Re-plan a job's layout for another GPU count: the model and the global batch stay, the layout follows.

When a job comes back on fewer (or more) nodes than its checkpoint was written
with, the run continues with the same model, global batch and data order on a
layout chosen for the GPUs it has, and Megatron-Core's resharding load carries
the checkpoint over. Two policies:

* ``any``: the calculator's best fitting layout for the new GPU count (TP
  inside a node, every rule of ``ParallelLayout``, the fastest estimated step);
* ``dp``: keep TP, CP, PP, the virtual stages and the stage split, and change
  only DP (and the micro-batch size, where the global batch needs it).

The sequence parallelism and distributed optimizer settings carry over as given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from megatron_ext.estimate.search import Cluster, LayoutEstimate, evaluate, search_like
from megatron_ext.estimate.workload import Workload
from megatron_ext.parallel.factors import divisors
from megatron_ext.parallel.layout import ParallelLayout

DEFAULT_POLICY = "any"
"""The policy of a re-plan that names none: the best layout for the new GPUs."""
POLICIES = (DEFAULT_POLICY, "dp")
"""``any``: the best layout for the new GPUs; ``dp``: the same model-parallel layout, another DP."""


class RelayoutError(ValueError):
    """No layout of the new GPU count suits the policy: says why and what to change."""


def _summary(layout: ParallelLayout) -> dict[str, Any]:
    return {
        "world_size": layout.world_size,
        "tp": layout.tp,
        "cp": layout.cp,
        "pp": layout.pp,
        "vp": layout.vp,
        "dp": layout.dp,
        "micro_batch_size": layout.micro_batch_size,
        "num_microbatches": layout.num_microbatches,
    }


def gpus(count: int) -> str:
    return f"{count} GPU" + ("s" if count != 1 else "")


def describe(layout: ParallelLayout) -> str:
    cp = f" CP {layout.cp}" if layout.cp > 1 else ""
    return (
        f"TP {layout.tp}{cp} PP {layout.pp} VP {layout.vp} DP {layout.dp}, micro-batch {layout.micro_batch_size} "
        f"({gpus(layout.world_size)})"
    )


@dataclass(frozen=True)
class Relayout:
    """The layout a job had and the one it continues with."""

    old: ParallelLayout
    """The layout the checkpoint was written with."""
    new: LayoutEstimate
    """The layout for the new GPU count, with its estimates."""
    policy: str
    """One of ``POLICIES``."""
    why: str = ""
    """Why the job runs the new layout (a launcher's note; empty: not said)."""

    def changes(self) -> list[str]:
        """Every factor that changed, ``name old -> new``."""
        before, after = _summary(self.old), _summary(self.new.layout)
        names = {"world_size": "GPUs", "micro_batch_size": "micro-batch", "num_microbatches": "microbatches"}
        return [
            f"{names.get(key, key.upper())} {before[key]} -> {after[key]}"
            for key in before
            if before[key] != after[key]
        ]

    def record(self, *, iteration: int | None = None) -> dict[str, Any]:
        """The metrics file's ``relayout`` event (``iteration``: the checkpoint the run resumes from)."""
        out: dict[str, Any] = {"event": "relayout", "policy": self.policy}
        if iteration is not None:
            out["iteration"] = iteration
        if self.why:
            out["why"] = self.why
        return out | {"old": _summary(self.old), "new": _summary(self.new.layout)}


def _same_model_parallelism(
    workload: Workload, old: ParallelLayout, cluster: Cluster
) -> tuple[list[LayoutEstimate], list[str]]:
    """Every micro-batch size of ``old``'s TP, CP, PP, VP and split on the new GPUs, and the first refusal."""
    values = old.as_values() | {"world_size": cluster.gpus, "microbatch_group_size_per_vp_stage": None}
    estimates: list[LayoutEstimate] = []
    refusal: list[str] = []
    for micro_batch in divisors(old.global_batch_size):
        layout, problems = ParallelLayout.check_grouped(**values | {"micro_batch_size": micro_batch})
        if problems:
            refusal = refusal or problems
            continue
        estimates.append(evaluate(workload, layout, cluster))
    return estimates, refusal


def relayout(
    workload: Workload, old: ParallelLayout, cluster: Cluster, *, policy: str, sequence_parallel: bool | None = None
) -> Relayout:
    """The layout ``old``'s job continues with on ``cluster`` (RelayoutError when none suits ``policy``).
    ``sequence_parallel``: the job's ``--sequence-parallel`` flag where it is known (Megatron-LM turns it off at
    TP 1 only, so a job that ran TP 1 with the flag gets it back at TP > 1); None: as ``old`` ran."""
    if policy not in POLICIES:
        raise RelayoutError(f"unknown relayout policy {policy!r}; choose one of {', '.join(POLICIES)}")
    if policy == "dp":
        estimates, refusal = _same_model_parallelism(workload, old, cluster)
        if not estimates:
            raise RelayoutError(
                f"keeping TP {old.tp} × CP {old.cp} × PP {old.pp} (policy dp) on {cluster.gpus} GPUs is not "
                f"possible: {refusal[0] if refusal else 'no micro-batch size divides the global batch'}; use a GPU "
                f"count that is a multiple of {old.tp * old.cp * old.pp}, or let the layout change (policy any)"
            )
        # The old micro-batch size where it still works: the same memory per microbatch, the same numerics.
        # An unattended re-plan keeps the reserve: a tight layout could fail at night.
        fitting = sorted((e for e in estimates if e.fits_with_reserve), key=lambda e: e.time.step_s)
        same = [e for e in fitting if e.layout.micro_batch_size == old.micro_batch_size]
        best: LayoutEstimate | None = (same or fitting)[0] if fitting else None
    else:
        result = search_like(workload, cluster, old, sequence_parallel=sequence_parallel)
        estimates = result.estimates
        best = next((e for e in result.estimates if e.fits_with_reserve), None)
    if best is None:
        least = min((e.memory.total_bytes for e in estimates), default=0.0)
        raise RelayoutError(
            f"no layout of {cluster.gpus} GPUs (policy {policy}) fits the model and the global batch of "
            f"{old.global_batch_size} in {cluster.usable_memory_bytes / 2**30:.1f} GiB per GPU"
            + (f" (the smallest needs {least / 2**30:.1f} GiB)" if least else "")
            + ": use more GPUs (an elastic launch: raise MIN_NODES), or allow more memory savers"
        )
    return Relayout(old=old, new=best, policy=policy)


@dataclass(frozen=True)
class AllocationPlan:
    """The layout a job runs on the GPUs it was given, and how that differs from its checkpoint's."""

    layout: LayoutEstimate
    """What the job runs."""
    why: str
    """One line: the recipe's own layout, or why it was re-planned."""
    relayout: Relayout | None
    """The change from the checkpoint's layout (None: no checkpoint, or the same layout)."""


def same_layout(a: ParallelLayout, b: ParallelLayout) -> bool:
    """Whether two layouts split the model and the batch alike (every factor of the metrics record)."""
    return _summary(a) == _summary(b)


def plan_allocation(
    workload: Workload,
    cluster: Cluster,
    *,
    recipe: ParallelLayout | None,
    recipe_refusal: str,
    base: ParallelLayout,
    saved: ParallelLayout | None,
    policy: str,
    sequence_parallel: bool | None = None,
) -> AllocationPlan:
    """The layout an elastic job runs on ``cluster``.

    ``recipe`` is the recipe's own layout on these GPUs (None where it does not run: ``recipe_refusal`` says
    why). It is kept when it fits, so a job that grows back gets the layout it was written for; otherwise
    ``base`` (the checkpoint's layout, else the recipe's at its own size) is re-planned with ``policy``.
    RelayoutError when nothing suits. ``sequence_parallel``: the job's ``--sequence-parallel`` flag (``relayout``).
    """
    chosen: LayoutEstimate | None = None
    if recipe is not None:
        estimate = evaluate(workload, recipe, cluster)
        if estimate.fits_with_reserve:
            chosen, why = estimate, f"the recipe's layout runs on {gpus(cluster.gpus)}"
        else:
            recipe_refusal = (
                f"the recipe's layout needs {estimate.memory.total_bytes / 2**30:.1f} GiB per GPU of "
                f"{cluster.usable_memory_bytes / 2**30:.1f} GiB on {gpus(cluster.gpus)}"
            )
    if chosen is None:
        chosen = relayout(workload, base, cluster, policy=policy, sequence_parallel=sequence_parallel).new
        why = f"{recipe_refusal}; re-planned with policy {policy}"
    change = None
    if saved is not None and not same_layout(saved, chosen.layout):
        change = Relayout(old=saved, new=chosen, policy=policy, why=why)
    return AllocationPlan(layout=chosen, why=why, relayout=change)
