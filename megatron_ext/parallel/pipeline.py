"""Pipeline formulas: the bubble, the warm-up and the activations in flight (one home for each).

For ``p`` pipeline stages, ``v`` model chunks (virtual stages) per stage and
``m`` microbatches per step, with forward + backward time ``T`` of one
microbatch on one stage (Narayanan et al. 2021, "Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM", §2.2):

* **GPipe** (all forwards, then all backwards) and **1F1B** (one forward, one
  backward once warm) both idle ``(p − 1)·T`` per step: the bubble is
  ``(p − 1)/m`` of the ideal ``m·T``, or ``(p − 1)/(m + p − 1)`` of the step.
  1F1B keeps at most ``p`` microbatches of activations in flight, GPipe ``m``.
* **Interleaved 1F1B** gives each stage ``v`` chunks of ``l/(p·v)`` layers; the
  fill and drain shrink to ``(p − 1)·T/v``: the bubble is ``(p − 1)/(v·m)`` of
  the ideal, ``(p − 1)/(v·m + p − 1)`` of the step, at ``v`` times the
  point-to-point messages.

Warm-up and in-flight counts are those of Megatron-Core's schedules
(``megatron/core/pipeline_parallel/schedules.py``, ``get_pp_rank_microbatches``):
rank ``r`` runs ``min(m, p − r − 1)`` warm-up forward passes under 1F1B and
``min(m·v, 2·(p − r − 1) + (v − 1)·n)`` chunk passes interleaved (``n`` the
microbatch group size, ``p`` by default), and so holds
one more than that at its peak. ``pipeline_schedule.py`` turns these into the full order
of passes and a simulated timeline.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from itertools import accumulate
from operator import sub


def bubble_fraction(*, pp: int, vp: int, num_microbatches: int) -> float:
    """Idle time relative to the ideal compute of a step: ``(p − 1)/(v·m)`` (v = 1: 1F1B or GPipe)."""
    return (pp - 1) / (vp * num_microbatches)


def warmup_passes(*, pp: int, vp: int, num_microbatches: int, pipeline_rank: int, group_size: int | None = None) -> int:
    """Forward passes (of one model chunk each) a rank runs before its first backward pass.

    ``group_size``: interleaved 1F1B's microbatch group (``--microbatch-group-size-per-virtual-pipeline-stage``,
    default ``p``); each extra chunk adds one group of warm-up passes.
    """
    if vp == 1:
        return min(num_microbatches, pp - pipeline_rank - 1)
    group = group_size or pp
    return min(num_microbatches * vp, 2 * (pp - pipeline_rank - 1) + (vp - 1) * group)


def in_flight_passes(
    *, pp: int, vp: int, num_microbatches: int, pipeline_rank: int, group_size: int | None = None
) -> int:
    """Most (microbatch, model chunk) forward passes whose activations one rank holds at once.

    The warm-up passes plus the one that starts the steady state; the first
    stage of an interleaved pipeline holds ``(v + 1)·p − 1`` chunks, i.e.
    ``p·(1 + (p − 1)/(p·v))`` microbatches' worth of its layers (Narayanan et
    al. 2021, §2.2.2).
    """
    warmup = warmup_passes(
        pp=pp, vp=vp, num_microbatches=num_microbatches, pipeline_rank=pipeline_rank, group_size=group_size
    )
    return min(num_microbatches * vp, warmup + 1)


def schedule_table(num_microbatches: int, num_chunks: int, group_size: int) -> list[tuple[int, int]]:
    """(microbatch, chunk) of every forward pass in order: groups of ``group_size`` microbatches, all chunks each."""
    table = []
    for first in range(0, num_microbatches, group_size):
        group = range(first, min(first + group_size, num_microbatches))
        if first + group_size >= num_microbatches:
            group = range(first, num_microbatches)  # the last group takes the rest
        table += [(mb, chunk) for chunk in range(num_chunks) for mb in group]
    return table


def peak_held(
    chunk_bytes: Sequence[float], *, pp: int, num_microbatches: int, pipeline_rank: int, group_size: int | None = None
) -> float:
    """Most activation bytes one rank holds at once in Megatron-Core's order, its model chunk ``c`` holding
    ``chunk_bytes[c]`` for one microbatch: each forward pass adds its chunk's bytes, and the backward pass of the
    same microbatch and chunk removes them. With equal chunks, ``in_flight_passes`` of them.

    Uneven chunks (``--pipeline-model-parallel-layout``, a balanced split) are held for different spans: the last
    virtual stage's forward passes are the first the backward passes release, the first stage's the last. After
    backward pass ``k`` the rank holds forward passes ``0 … k + w`` less backward passes ``0 … k`` (``w`` its warm-up
    passes). A whole group of ``N`` microbatches adds and releases ``N`` of every chunk, so that amount repeats with
    the period of a group's passes while both spans lie in whole groups: the peak is found among the first period
    and the passes near the step's end. Whole groups in the middle of the steady state are left out of the sums
    (``_held_sums``; the same peak), which every rank of the pipeline shares.
    """
    vp = len(chunk_bytes)
    count = in_flight_passes(
        pp=pp, vp=vp, num_microbatches=num_microbatches, pipeline_rank=pipeline_rank, group_size=group_size
    )
    if len(set(chunk_bytes)) <= 1:
        return count * (chunk_bytes[0] if chunk_bytes else 0.0)
    group = group_size or pp
    warmup = warmup_passes(
        pp=pp, vp=vp, num_microbatches=num_microbatches, pipeline_rank=pipeline_rank, group_size=group_size
    )
    added, released, whole = _held_sums(tuple(chunk_bytes), pp=pp, num_microbatches=num_microbatches, group=group)
    steady = len(released) - 1 - warmup
    if steady <= 0:
        return added[-1]
    ahead, period = warmup + 1, group * vp
    # Held after backward pass k: added[k + ahead] − released[k], repeating every period while k + ahead + period
    # is within the whole groups; past that, every k to the end.
    head = min(period, steady)
    tail = max(0, min(whole - ahead - period, steady - 1))
    return max(
        max(map(sub, added[ahead : ahead + head], released[:head])),
        max(map(sub, added[tail + ahead : steady + ahead], released[tail:steady])),
    )


@functools.lru_cache(maxsize=256)
def _held_sums(
    chunk_bytes: tuple[float, ...], *, pp: int, num_microbatches: int, group: int
) -> tuple[tuple[float, ...], tuple[float, ...], int]:
    """Running sums of the bytes the forward passes add and the backward passes release (at the mirrored chunk:
    backward pass ``k`` releases forward pass ``k``'s microbatch in the last chunk first), along Megatron-Core's
    order of ``num_microbatches`` with whole groups in the middle left out, and how many passes the whole groups
    cover. Kept for every rank's warm-up: the first rank's, the longest."""
    vp = len(chunk_bytes)
    warmup = warmup_passes(pp=pp, vp=vp, num_microbatches=num_microbatches, pipeline_rank=0, group_size=group)
    m = num_microbatches
    keep = math.ceil((warmup + 1) / vp) + 4 * group
    if m > keep + group:
        m -= (m - keep) // group * group
    table = schedule_table(m, vp, group)
    added = tuple(accumulate((chunk_bytes[c] for _, c in table), initial=0.0))
    released = tuple(accumulate((chunk_bytes[vp - 1 - c] for _, c in table), initial=0.0))
    return added, released, m // group * group * vp  # tuples: the cache shares them


def valid_group_sizes(*, pp: int, num_microbatches: int) -> list[int]:
    """Interleaved 1F1B's microbatch group sizes Megatron-Core accepts: ``p ≤ N ≤ m``, the last group empty or ≥ ``p``.

    (``forward_backward_pipelining_with_interleaving``: a smaller last group would stall the pipeline.)
    """
    m = num_microbatches
    return [n for n in range(pp, m + 1) if not 0 < m % n < pp]


def stage_imbalance(stages: Sequence[float]) -> float:
    """Slowest stage over the mean, minus 1: what an uneven split should bring under 5%."""
    mean = sum(stages) / len(stages)
    return max(stages) / mean - 1.0 if mean > 0 else 0.0


def pipeline_bubble(stages: Sequence[float], *, vp: int) -> float:
    """Fill and drain of one step: every stage but the slowest, once, in chunks of 1/v.

    With ``p`` equal stages of time ``T`` this is ``(p − 1)·T/v``, the bubble
    ``(p − 1)/(v·m)`` of the ideal ``m·T`` (Narayanan et al. 2021, §2.2); with
    uneven stages the slowest runs ``m`` times back to back and the others
    add their time once to fill and drain (``tests/estimate/test_stage_model.py``
    checks it against ``pipeline_schedule.simulate`` with per-stage times).
    """
    return (sum(stages) - max(stages)) / vp


def zb_h1_bubble(*, pp: int, forward_time: float, backward_time: float, weight_time: float) -> float:
    """ZB-H1's idle time per rank (the zero-bubble schedules: ``estimate/zero_bubble.py``): ``(p − 1)·(t_F + t_B − t_W)`` (Qi et al. 2024, §3.1, where ``t_W ≤ t_B``);
    a W longer than a B fills only a B's gap of the cool-down, ``(p − 1)·t_F``."""
    return (pp - 1) * (forward_time + backward_time - min(weight_time, backward_time))


def zb_bubble_scale(*, forward_time: float, backward_time: float, weight_time: float) -> float:
    """A zero-bubble schedule's bubble over its unsplit schedule's, as the step estimate prices it: ZB-H1's
    ``(t_F + t_B − min(t_W, t_B))/(t_F + t_B + t_W)`` (``zb_h1_bubble`` over ``one_f_one_b_bubble``). ZB
    interleaved takes the same share of interleaved 1F1B's bubble: exact at equal F, B and W, and above what the
    simulator places otherwise (``estimate.zero_bubble``, ``tests/estimate/test_zero_bubble.py``)."""
    times = {"forward_time": forward_time, "backward_time": backward_time, "weight_time": weight_time}
    return zb_h1_bubble(pp=2, **times) / one_f_one_b_bubble(pp=2, **times)


def zb_h1_bubble_fraction(*, pp: int, num_microbatches: int) -> float:
    """ZB-H1's bubble relative to the ideal step when F, B and W take equal time: ``(p − 1)/(3·m)``, a third of
    1F1B's ``(p − 1)/m`` (``zb_h1_bubble`` over ``m·(t_F + t_B + t_W)``)."""
    return zb_h1_bubble(pp=pp, forward_time=1, backward_time=1, weight_time=1) / (3 * num_microbatches)


def one_f_one_b_bubble(*, pp: int, forward_time: float, backward_time: float, weight_time: float) -> float:
    """1F1B's idle time per rank with the backward unsplit: ``(p − 1)·(t_F + t_B + t_W)``."""
    return (pp - 1) * (forward_time + backward_time + weight_time)
