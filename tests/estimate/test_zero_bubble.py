"""Zero-bubble schedules in the pass-by-pass simulator (issue 31, items 3 and 5): F, B and W passes.

ZB-H1 is checked against Qi et al. 2024's closed form, ``(p − 1)·(t_F + t_B − t_W)`` of idle time per rank,
against 1F1B's ``(p − 1)·(t_F + t_B + t_W)``, at 1F1B's peak memory. Every schedule's timeline is checked for
what a real run would need: every pass once, every input there before its pass starts, no rank doing two
things at once, and the memory limit kept.
"""

from __future__ import annotations

import itertools

import pytest

from megatron_ext.estimate.pipeline_schedule import simulate
from megatron_ext.estimate.zero_bubble import (
    SCHEDULES,
    Placement,
    ZeroBubbleTimeline,
    memory_limits,
    simulate_zero_bubble,
    zb_h1_order,
)
from megatron_ext.parallel.pipeline import one_f_one_b_bubble, zb_h1_bubble

pytestmark = pytest.mark.unit

TIMES = [(1.0, 1.0, 1.0), (1.0, 1.2, 0.8), (1.0, 1.5, 0.6), (1.0, 0.9, 1.1)]
"""(t_F, t_B, t_W) of a whole stage: equal, and the backward's split as the GEMMs and attention make it."""


def _check_timeline(t: ZeroBubbleTimeline, *, p2p: float = 0.0) -> None:
    placement = Placement(t.pp, t.vp, v_shape=t.schedule == "zb-v")
    stages = placement.stages
    ends = {}
    for q in t.passes:
        key = (q.step.kind, q.step.microbatch, placement.stage(q.rank, q.step.chunk))
        assert key not in ends, f"{key} runs twice"
        ends[key] = (q.end, q.rank)
    assert len(ends) == 3 * t.num_microbatches * stages  # every F, B and W of every microbatch and stage
    for q in t.passes:
        kind, mb, stage = q.step.kind, q.step.microbatch, placement.stage(q.rank, q.step.chunk)
        if kind == "F":
            source = ("F", mb, stage - 1) if stage > 0 else None
        elif kind == "B":
            source = ("F", mb, stage) if stage == stages - 1 else ("B", mb, stage + 1)
        else:
            source = ("B", mb, stage)  # a W needs its own B
        if source is not None:
            end, rank = ends[source]
            assert q.start >= end + (p2p if rank != q.rank else 0.0) - 1e-9, (q, source)
    for rank in range(t.pp):
        row = sorted((q for q in t.passes if q.rank == rank), key=lambda q: q.start)
        assert all(a.end <= b.start + 1e-9 for a, b in itertools.pairwise(row)), f"rank {rank} overlaps itself"
    limits = memory_limits(t.schedule, pp=t.pp, vp=t.vp, num_microbatches=t.num_microbatches)
    assert all(peak <= limit + 1e-9 for peak, limit in zip(t.peak_activations, limits, strict=True))


@pytest.mark.parametrize("pp, m", [(2, 8), (4, 8), (4, 16), (8, 8), (8, 32)])
@pytest.mark.parametrize("f, b, w", TIMES)
def test_zb_h1_has_the_papers_bubble_at_1f1bs_memory(pp: int, m: int, f: float, b: float, w: float) -> None:
    t = simulate_zero_bubble("zb-h1", pp=pp, num_microbatches=m, forward_time=f, backward_time=b, weight_time=w)
    _check_timeline(t)
    assert t.makespan - t.ideal == pytest.approx(zb_h1_bubble(pp=pp, forward_time=f, backward_time=b, weight_time=w))
    # 1F1B with the backward pass whole (Megatron-Core's own schedule, simulated the same way).
    one_f_one_b = simulate(pp=pp, vp=1, num_microbatches=m, forward_time=f, backward_time=b + w)
    expected = one_f_one_b_bubble(pp=pp, forward_time=f, backward_time=b, weight_time=w)
    assert one_f_one_b.makespan - one_f_one_b.ideal == pytest.approx(expected)
    # A third of 1F1B's when the three passes take equal time.
    if f == b == w:
        assert (t.makespan - t.ideal) / (one_f_one_b.makespan - one_f_one_b.ideal) == pytest.approx(1 / 3)
    assert max(t.peak_activations) == min(pp, m)  # 1F1B's rank 0 holds p microbatches too


def test_zb_h1_keeps_r_weight_passes_back_on_rank_r() -> None:
    order = zb_h1_order(pp=4, num_microbatches=8, pipeline_rank=2)
    kinds = "".join(s.kind for s in order)
    assert kinds.count("F") == kinds.count("B") == kinds.count("W") == 8
    assert kinds.endswith("BWWW")  # the last B, then the two W passes kept back and its own
    first_w = kinds.index("W")
    assert kinds[:first_w].count("B") == 3  # two B passes ran before W 0 did


@pytest.mark.parametrize("pp, m", [(2, 8), (4, 8), (4, 16), (8, 16)])
@pytest.mark.parametrize("f, b, w", TIMES)
def test_zero_bubble_interleaving_beats_interleaved_1f1b_at_its_memory(
    pp: int, m: int, f: float, b: float, w: float
) -> None:
    t = simulate_zero_bubble("zb-interleaved", pp=pp, num_microbatches=m, forward_time=f, backward_time=b,
                             weight_time=w)  # fmt: skip
    _check_timeline(t)
    interleaved = simulate(pp=pp, vp=2, num_microbatches=m, forward_time=f, backward_time=b + w)
    assert t.makespan < interleaved.makespan
    assert max(t.peak_activations) <= memory_limits("zb-interleaved", pp=pp, vp=2, num_microbatches=m)[0]


@pytest.mark.parametrize("pp, m", [(2, 8), (4, 8), (4, 16), (8, 16)])
@pytest.mark.parametrize("f, b, w", TIMES)
def test_zb_v_is_valid_at_1f1bs_memory(pp: int, m: int, f: float, b: float, w: float) -> None:
    t = simulate_zero_bubble("zb-v", pp=pp, num_microbatches=m, forward_time=f, backward_time=b, weight_time=w)
    _check_timeline(t)
    assert max(t.peak_activations) <= min(pp, m)
    one_f_one_b = simulate(pp=pp, vp=1, num_microbatches=m, forward_time=f, backward_time=b + w)
    assert t.makespan < one_f_one_b.makespan


def test_zb_v_holds_the_first_and_last_stage_on_rank_0() -> None:
    v = Placement(4, 2, v_shape=True)
    assert [v.stage(0, 0), v.stage(0, 1)] == [0, 7]
    assert [v.stage(3, 0), v.stage(3, 1)] == [3, 4]
    assert all(v.holder(v.stage(r, c)) == (r, c) for r in range(4) for c in range(2))
    # Equal passes: half ZB-H1's bubble at the same memory.
    t = simulate_zero_bubble("zb-v", pp=4, num_microbatches=8)
    h1 = simulate_zero_bubble("zb-h1", pp=4, num_microbatches=8)
    assert t.makespan - t.ideal <= (h1.makespan - h1.ideal) / 2
    assert max(t.peak_activations) <= max(h1.peak_activations)


def test_point_to_point_time_is_waited_for() -> None:
    for schedule in SCHEDULES:
        t = simulate_zero_bubble(schedule, pp=4, num_microbatches=8, p2p_time=0.3)
        _check_timeline(t, p2p=0.3)
        assert t.makespan > simulate_zero_bubble(schedule, pp=4, num_microbatches=8).makespan


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown zero-bubble schedule"):
        simulate_zero_bubble("zb-h2", pp=4, num_microbatches=8)
    with pytest.raises(ValueError, match="two chunks per rank"):
        simulate_zero_bubble("zb-v", pp=4, num_microbatches=8, vp=3)
    with pytest.raises(ValueError, match="pp >= 2"):
        simulate_zero_bubble("zb-h1", pp=1, num_microbatches=8)
