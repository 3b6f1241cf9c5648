"""Step timers and the measured pipeline bubble: the accounting, not the speed."""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron_ext.training.timing import COMPUTE_TIMERS, BubbleReport, breakdown_ms, measure_bubble, timer_names
from tests.conftest import TINY_MODEL, read_metrics, run_pretrain


def _rank(fb: float, fwd: float, bwd: float, sync: float = 0.0, **p2p: float) -> dict[str, float]:
    times = dict.fromkeys(timer_names(2), 0.0)
    times.update({"forward-backward": fb, "forward-compute": fwd, "backward-compute": bwd, "all-grads-sync": sync})
    times.update({k.replace("_", "-"): v for k, v in p2p.items()})
    return times


@pytest.mark.unit
def test_bubble_from_hand_computed_timers() -> None:
    # Rank 0 computes 6 s in an 8 s schedule (after 1 s of gradient sync): idle 2 s.
    # Rank 1 computes 4 s in 6 s: idle 2 s.
    report = measure_bubble([_rank(9.0, 2.0, 4.0, sync=1.0), _rank(6.0, 1.0, 3.0)], predicted=0.25)
    assert isinstance(report, BubbleReport)
    assert report.per_rank == pytest.approx((2 / 6, 2 / 4))
    assert report.idle_share_per_rank == pytest.approx((2 / 8, 2 / 6))
    assert report.mean == pytest.approx((2 / 6 + 2 / 4) / 2)
    assert report.predicted_share == pytest.approx(0.25 / 1.25)
    assert "(p-1)/(v*m) = 0.250" in report.describe()


@pytest.mark.unit
def test_bubble_needs_level_2_timers_and_never_goes_negative() -> None:
    assert measure_bubble([_rank(5.0, 0.0, 0.0)], predicted=0.1) is None  # level 1: no compute timers
    # Timer granularity: compute a hair longer than the schedule means no idle time.
    report = measure_bubble([_rank(3.0, 1.0, 2.0001)], predicted=0.0)
    assert report is not None and report.per_rank == (0.0,)


@pytest.mark.unit
def test_breakdown_is_per_iteration_max_over_ranks_with_p2p_total() -> None:
    ms = breakdown_ms(
        [_rank(4.0, 1.0, 2.0, forward_recv=0.2), _rank(4.4, 1.2, 1.8, forward_recv=0.1, backward_send=0.3)],
        iterations=2,
    )
    assert ms["forward-backward"] == pytest.approx(2200.0)
    assert ms["forward-compute"] == pytest.approx(600.0)
    assert ms["backward-compute"] == pytest.approx(1000.0)
    assert ms["p2p-wait"] == pytest.approx(200.0)  # rank 1: (0.1 + 0.3) s / 2 iterations
    assert "all-grads-sync" not in ms  # never ran


@pytest.mark.distributed
def test_interleaved_run_reports_the_bubble_of_every_rank(tmp_path: Path) -> None:
    metrics = tmp_path / "m.jsonl"
    layout = "--pipeline-model-parallel-size 2 --virtual-pipeline-model-parallel-size 2".split()
    run_pretrain(
        [
            *TINY_MODEL,
            *layout,
            *"--train-iters 4 --log-interval 2 --timing-log-level 2".split(),
            "--metrics-file",
            str(metrics),
        ],
        nproc=2,
    )
    rows = read_metrics(metrics)
    steps = [r for r in rows if "lm_loss" in r]
    (summary,) = [r for r in rows if r.get("run_summary")]
    assert [r["iteration"] for r in steps] == [2, 4]
    # 8 sequences / micro-batch 2 = 4 microbatches; p = 2, v = 2.
    predicted = (2 - 1) / (2 * 4)
    for record in [*steps, summary]:
        assert record["bubble_predicted"] == pytest.approx(predicted)
        compute, pipeline = record["bubble_compute_s"], record["bubble_pipeline_s"]
        assert len(compute) == len(pipeline) == 2  # every rank
        for rank in range(2):
            assert 0.0 < compute[rank] <= pipeline[rank]
            idle = pipeline[rank] - compute[rank]
            assert record["bubble_measured_per_rank"][rank] == pytest.approx(idle / compute[rank])
            assert record["bubble_idle_share_per_rank"][rank] == pytest.approx(idle / pipeline[rank])
    # The run's figure is the sum of its windows, not a window's.
    for key in ("bubble_compute_s", "bubble_pipeline_s"):
        for rank in range(2):
            assert summary[key][rank] == pytest.approx(sum(r[key][rank] for r in steps), rel=1e-9)
    for record in steps:
        times = record["time_ms"]
        for name in (*COMPUTE_TIMERS, "forward-backward", "optimizer", "p2p-wait"):
            assert times[name] > 0.0, name
        # The per-iteration maxima bound each rank's window totals (2 iterations per window).
        assert max(record["bubble_compute_s"]) <= 2 * (times["forward-compute"] + times["backward-compute"]) / 1000
        assert max(record["bubble_pipeline_s"]) <= 2 * times["forward-backward"] / 1000 * (1 + 1e-9)


@pytest.mark.distributed
def test_without_timers_nothing_is_measured(tmp_path: Path) -> None:
    metrics = tmp_path / "m.jsonl"
    run_pretrain([*TINY_MODEL, "--train-iters", "2", "--metrics-file", str(metrics)])
    rows = read_metrics(metrics)
    assert rows and all("time_ms" not in r and "bubble_predicted" not in r for r in rows)
