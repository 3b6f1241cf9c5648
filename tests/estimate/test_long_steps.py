"""Long steps read off shorter ones (``pipeline_schedule.figures_at_scale``) agree with whole steps, and the
comparison's microbatch groups are those whose activations fit."""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import pytest

from megatron_ext.config.arguments import ModelArgs
from megatron_ext.config.presets import get_preset
from megatron_ext.estimate import pipeline_schedule
from megatron_ext.estimate.hardware import get_profile
from megatron_ext.estimate.memory import estimate_memory
from megatron_ext.estimate.pipeline_schedule import (
    Step,
    StepFigures,
    _key_type,
    _steady_shift,
    figures_at_scale,
    place,
    place_all,
    placed_whole,
    schedule_rows,
    simulate,
    whole_steps_together,
)
from megatron_ext.estimate.schedule_comparison import compare_schedules, schedule_figures
from megatron_ext.estimate.search import Cluster, search
from megatron_ext.estimate.workload import Workload
from megatron_ext.estimate.zero_bubble import (
    fixed_orders,
    simulate_zero_bubble,
    zero_bubble_at_scale,
    zero_bubble_figures,
)
from megatron_ext.parallel.layout import ParallelLayout
from megatron_ext.parallel.pipeline import valid_group_sizes

pytestmark = pytest.mark.unit

Times3 = list[list[tuple[float, float, float]]]


def _uneven(rng: random.Random, *, pp: int, vp: int, spread: float) -> Times3:
    """(F, B, W) per chunk, each up to ``spread`` above a common base; one chunk empty now and then (a layout
    string's stage without layers)."""
    base = rng.uniform(0.5, 1.5)
    times = [
        [tuple(base * k * (1 + spread * rng.random()) for k in (1.0, 2.0, 1.0)) for _ in range(vp)] for _ in range(pp)
    ]
    if rng.random() < 0.25:
        times[rng.randrange(pp)][rng.randrange(vp)] = (0.0, 0.0, 0.0)
    return times  # type: ignore[return-value]


def _agree(got: StepFigures, whole: StepFigures) -> bool:
    return (
        got.makespan == pytest.approx(whole.makespan, rel=1e-9)
        and got.in_flight == whole.in_flight
        and got.messages == whole.messages
    )


# Spreads: even stages, nearly even (the slowest by 0.1%: a long transient before the steady state), uneven.
@pytest.mark.parametrize("seed", range(6))
def test_a_long_step_read_off_a_shorter_one_is_the_whole_step(seed: int) -> None:
    """Every schedule the comparison simulates, on uneven stages with transfers, at step lengths where the
    shorter step is read: the same step length, peaks and messages as the step placed pass by pass."""
    rng = random.Random(seed)
    for spread in (0.0, 0.001, 0.3):
        pp, vp = rng.choice([2, 3, 4, 6]), rng.choice([2, 3])
        m = rng.choice([pp * 24, pp * 24 + pp, pp * 40])  # long enough to be read off a step of at most half
        p2p = rng.choice([0.0, 0.02, 0.5])
        split = _uneven(rng, pp=pp, vp=vp, spread=spread)
        flat = [[tuple(sum(t[k] for t in row) for k in range(3))] for row in split]
        merged = [[(f, b + w) for f, b, w in row] for row in split]
        merged_flat = [[(f, b + w) for f, b, w in row] for row in flat]
        group = rng.choice(valid_group_sizes(pp=pp, num_microbatches=m)[:3])
        for schedule, times, n in (
            ("gpipe", merged_flat, None),
            ("1f1b", merged_flat, None),
            ("interleaved", merged, None),
            ("interleaved-group", merged, group),
        ):
            # With the transfers and without, placed together as the comparison does.
            common = dict(pp=pp, num_microbatches=m, chunk_times=times, p2p_times=(p2p, 0.0), group_size=n)
            got = schedule_figures(schedule, **common)  # type: ignore[arg-type]
            whole = schedule_figures(schedule, **common, whole=True)  # type: ignore[arg-type]
            for (short, timeline), (every, _) in zip(got, whole, strict=True):
                assert timeline is None and _agree(short, every), (schedule, pp, vp, m, spread, p2p)
            # Swept side by side, each step is what it is swept alone.
            for t, (every, _) in zip((p2p, 0.0), whole, strict=True):
                alone = schedule_figures(schedule, **common | {"p2p_times": (t,)}, whole=True)  # type: ignore[arg-type]
                assert alone[0][0] == every, (schedule, pp, vp, m, spread, t)
        for schedule, times in (("zb-h1", flat), ("zb-interleaved", split)):
            v = len(times[0])
            common = dict(pp=pp, num_microbatches=m, vp=v, chunk_times=times)
            (with_p2p, free), chosen = zero_bubble_at_scale(schedule, **common, p2p_times=(p2p, 0.0))  # type: ignore[arg-type]
            whole = zero_bubble_figures(simulate_zero_bubble(schedule, **common, p2p_time=p2p))  # type: ignore[arg-type]
            assert _agree(with_p2p, whole), (schedule, pp, vp, m, spread, p2p)
            orders = fixed_orders(schedule, pp=pp, vp=v, num_microbatches=m)[chosen]
            free_whole = place(orders, pp=pp, vp=v, num_microbatches=m, chunk_times=times)
            assert free.makespan == pytest.approx(free_whole.makespan, rel=1e-9), (schedule, pp, vp, m, spread)


def test_a_long_step_is_read_off_a_short_one_only_once_it_repeats() -> None:
    """Even stages settle at once: the step of 1,000 microbatches is read off one of 3·(p + 1) + 2. Stages
    within 0.1% of each other take longer to settle (the faster ones use up the slack of the warm-up first):
    a longer step is placed, not a wrong one extended."""
    placed: list[int] = []

    def placing(times: list[list[tuple[float, float]]], *, blocking: bool):  # type: ignore[no-untyped-def]
        def at(n: int, which: Sequence[int]) -> list[tuple[StepFigures, np.ndarray]]:
            assert list(which) == [0]
            placed.append(n)
            orders = [schedule_rows(pp=4, vp=1, num_microbatches=n, pipeline_rank=r) for r in range(4)]
            step = place(
                orders, pp=4, vp=1, num_microbatches=n, chunk_times=times, p2p_time=0.01, blocking_p2p=blocking
            )
            return [(StepFigures(step.makespan, (0,) * 4, (n,) * 4), step.end)]

        return at

    even = [[(1.0, 2.0)]] * 4
    (got,) = figures_at_scale(placing(even, blocking=True), num_microbatches=1000, pp=4)
    assert placed == [3 * (4 + 1) + 2]  # three spans of rank 0's warm-up (p − 1) and two microbatches, two periods
    whole = simulate(pp=4, vp=1, num_microbatches=1000, chunk_times=even, p2p_time=0.01, blocking_p2p=True)
    assert got.makespan == pytest.approx(whole.makespan, rel=1e-12) and got.messages == (1000,) * 4
    placed.clear()
    nearly = [[(1.0, 2.0)], [(1.0, 2.0)], [(1.0, 2.003)], [(1.0, 2.0)]]
    (got,) = figures_at_scale(placing(nearly, blocking=False), num_microbatches=1000, pp=4)
    assert placed == [17, 34, 68, 136, 272, 1000]  # not 544: more than half the step
    whole = simulate(pp=4, vp=1, num_microbatches=1000, chunk_times=nearly, p2p_time=0.01)
    assert got.makespan == pytest.approx(whole.makespan, rel=1e-12)


def test_the_best_microbatch_group_is_one_whose_activations_fit() -> None:
    """Megatron 530B on 512 H100s, TP 8 PP 16 VP 4 with 128 microbatches (the search's layout): a group of all
    128 microbatches hides the most transfers but holds (v − 1)·(N − p) more chunks than fit; the comparison
    takes the fastest group that fits, which still beats the default."""
    workload = Workload(model=ModelArgs(**get_preset("megatron-530b").model_flags()), precision="bf16")
    cluster = Cluster(gpus=512, gpus_per_node=8, gpu=get_profile("h100-sxm"))
    found = search(workload, cluster, global_batch_size=512, sequence_parallel=True, use_distributed_optimizer=True)
    estimate = next(
        e
        for e in found.estimates
        if (e.layout.tp, e.layout.pp, e.layout.vp, e.layout.num_microbatches) == (8, 16, 4, 128)
    )
    options = {o.schedule: o for o in compare_schedules(workload, estimate)}
    default, grouped = options["interleaved"], options["interleaved-group"]
    assert grouped.run is not None and grouped.layout is not None and default.fits
    assert grouped.fits and grouped.step_s < default.step_s and 16 < grouped.run.group_size < 128  # type: ignore[operator]
    everything, _ = ParallelLayout.check(**grouped.layout.as_values() | {"microbatch_group_size_per_vp_stage": 128})
    assert everything is not None and estimate_memory(workload, everything).total_bytes > cluster.gpu.memory_bytes


def test_the_window_repeats_only_when_every_pass_in_it_does() -> None:
    """The steady state is read only when every kind of pass, on every rank, ends the same time after its
    namesake one period earlier: forward passes already in step while a backward pass still drifts is not it."""
    n, period, span = 40, 1, 5
    microbatch = np.arange(n, dtype=float)
    end = np.full((2, 3, n, 1), np.nan)  # two ranks, kinds F B W, one chunk; no W passes
    end[:, 0, :, 0] = 3.0 * microbatch
    end[:, 1, :, 0] = 3.0 * microbatch + 1.0
    assert _steady_shift(end, period=period, span=span, step=float(end[:, :2].max())) == 3.0
    end[1, 1, :, 0] += 0.5 * 0.9**microbatch  # rank 1's backward passes still settling
    assert _steady_shift(end, period=period, span=span, step=float(end[:, :2].max())) is None


def test_whole_steps_placed_together_are_each_step_placed_alone() -> None:
    """The comparison's group sizes whose steps are placed whole anyway share one sweep
    (``pipeline_schedule.whole_steps_together``): each one's figures, with transfers and without, are its own
    step's, uneven stages included."""
    rng = random.Random(7)
    pp, vp, m = 4, 3, 36
    times = [[(rng.uniform(1, 2), rng.uniform(2, 4)) for _ in range(vp)] for _ in range(pp)]
    groups = [n for n in valid_group_sizes(pp=pp, num_microbatches=m) if placed_whole(num_microbatches=m, pp=pp,
                                                                                     vp=vp, group_size=n)]  # fmt: skip
    assert len(groups) >= 3, groups
    together = whole_steps_together("interleaved-group", pp=pp, num_microbatches=m, chunk_times=times,
                                    p2p_times=(0.3, 0.0), group_sizes=groups)  # fmt: skip
    for n in groups:
        alone = schedule_figures("interleaved-group", pp=pp, num_microbatches=m, chunk_times=times,
                                 p2p_times=(0.3, 0.0), group_size=n)  # fmt: skip
        assert together[n] == [figures for figures, _ in alone], n


def test_a_sweep_with_wide_keys_places_every_pass_as_with_narrow_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """``place_all`` keeps its keys in int32 where they fit (``_key_type``) and in int64 past 2³¹ keys, which no
    test can allocate: forced to int64, the same steps (interleaved with uneven chunks and transfers, and zero
    bubble's F, B and W) start and end every pass at the same times."""
    rng = random.Random(11)
    pp, vp, m = 4, 2, 16
    times = _uneven(rng, pp=pp, vp=vp, spread=0.5)
    two = [[row[:2] for row in rank] for rank in times]
    steps = [
        Step([schedule_rows(pp=pp, vp=vp, num_microbatches=m, pipeline_rank=r, group_size=6) for r in range(pp)],
             two, 0.2),
        Step(fixed_orders("zb-interleaved", pp=pp, vp=vp, num_microbatches=m)[0], times, 0.1),
    ]  # fmt: skip
    assert _key_type(3 * m * vp * pp) is np.int32 and _key_type(2**31) is np.int64
    narrow = place_all(steps, pp=pp, vp=vp, num_microbatches=m)
    monkeypatch.setattr(pipeline_schedule, "_key_type", lambda keys: np.int64)
    wide = place_all(steps, pp=pp, vp=vp, num_microbatches=m)
    for a, b in zip(narrow, wide, strict=True):
        assert a.start is not None and b.start is not None
        np.testing.assert_array_equal(a.start, b.start)
        np.testing.assert_array_equal(a.end, b.end)
        assert not np.isnan(a.end[:, :2]).all()
