"""Stragglers: the rule (slower than the peers' median by a margin, N windows in a row), per-rank stage records,
and the flags."""

from __future__ import annotations

import pytest

from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.megatron_lm import ALREADY, refusal
from megatron_ext.config.run_args import RunArgs
from megatron_ext.config.training_config import parse_args
from megatron_ext.training.stage_timing import HOST_VALUES, StageCost, host_name, host_values, stage_cost
from megatron_ext.training.stragglers import (
    DEFAULT_MARGIN,
    DEFAULT_WINDOWS,
    MAX_NAMED_IN_LOG,
    Straggler,
    StragglerReport,
    StragglerWatch,
    slow_ranks,
)

pytestmark = pytest.mark.unit

# 8 ranks, PP 2: ranks 0-3 on pipeline rank 0, 4-7 on pipeline rank 1 (whose layers cost more).
PIPELINE = (0, 0, 0, 0, 1, 1, 1, 1)
EVEN = (10.0, 10.0, 10.0, 10.0, 30.0, 30.0, 30.0, 30.0)


def with_rank(times: tuple[float, ...], rank: int, ms: float) -> tuple[float, ...]:
    return tuple(ms if r == rank else t for r, t in enumerate(times))


# ------------------------------------------------------------------ the rule for one window
def test_a_rank_is_slow_against_the_median_of_the_other_ranks_of_its_stage() -> None:
    assert slow_ranks(EVEN, PIPELINE, margin=0.1) == {}
    # Rank 5: 39 ms against 30, 30, 30 → 30% slower. Rank 1: 9 ms is fast, never slow.
    times = with_rank(with_rank(EVEN, 5, 39.0), 1, 9.0)
    assert slow_ranks(times, PIPELINE, margin=0.1) == {5: pytest.approx(0.3)}
    # The median of the peers, not their mean: one very fast peer does not make the others slow.
    times = (10.0, 10.5, 10.5, 2.0, *EVEN[4:])
    assert slow_ranks(times, PIPELINE, margin=0.1) == {}
    # The rank itself is not one of its peers: with two ranks per stage, the slow one is judged against the other.
    assert slow_ranks((10.0, 20.0), (0, 0), margin=0.5) == {1: pytest.approx(1.0)}


def test_ranks_are_never_compared_across_pipeline_stages() -> None:
    # Pipeline rank 1 is three times slower than pipeline rank 0: that is the stage imbalance, not a straggler.
    assert slow_ranks(EVEN, PIPELINE, margin=0.01) == {}
    assert max(EVEN) / min(EVEN) == 3.0


def test_a_lone_rank_per_stage_is_never_judged() -> None:
    # TP = CP = DP = 1: one rank per pipeline rank, no peers.
    assert slow_ranks((1.0, 100.0, 5.0), (0, 1, 2), margin=0.1) == {}
    watch = StragglerWatch(margin=0.1, windows=1)
    for _ in range(5):
        assert watch.update((1.0, 100.0), (0, 1)) == StragglerReport()
    assert watch.slow_for(1) == 0
    # A stage with peers is judged beside a stage without.
    assert slow_ranks((10.0, 10.0, 20.0, 99.0), (0, 0, 0, 1), margin=0.1) == {2: pytest.approx(1.0)}


@pytest.mark.parametrize(
    ("margin", "at_boundary", "just_over"),
    [(0.25, 125.0, 125.001), (0.5, 150.0, 150.001), (DEFAULT_MARGIN, 110.0, 110.001)],
)
def test_the_margin_is_exclusive(margin: float, at_boundary: float, just_over: float) -> None:
    peers = (100.0, 100.0, 100.0)
    assert slow_ranks((*peers, at_boundary), (0, 0, 0, 0), margin=margin) == {}
    slow = slow_ranks((*peers, just_over), (0, 0, 0, 0), margin=margin)
    assert list(slow) == [3] and slow[3] == pytest.approx(just_over / 100.0 - 1.0)
    assert slow[3] > margin


def test_the_default_margin_is_sensible() -> None:
    # A few percent of spread between ranks doing the same work is not flagged; a throttled GPU (tens of %) is.
    assert DEFAULT_MARGIN == 0.1 and DEFAULT_WINDOWS == 3
    assert slow_ranks((100.0, 103.0, 97.0, 105.0), (0, 0, 0, 0), margin=DEFAULT_MARGIN) == {}
    assert list(slow_ranks((100.0, 103.0, 97.0, 125.0), (0, 0, 0, 0), margin=DEFAULT_MARGIN)) == [3]


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="compute times for"):
        slow_ranks((1.0, 2.0), (0,), margin=0.1)
    with pytest.raises(ValueError, match="positive"):
        slow_ranks((1.0,), (0,), margin=0.0)
    with pytest.raises(ValueError, match="margin"):
        StragglerWatch(margin=0.0)
    with pytest.raises(ValueError, match="windows"):
        StragglerWatch(windows=0)


def test_peers_with_nothing_measured_judge_nobody() -> None:
    assert slow_ranks((0.0, 0.0, 5.0), (0, 0, 0), margin=0.1) == {}


# ------------------------------------------------------------------ consecutive windows
def test_a_rank_slow_in_fewer_than_n_windows_is_not_named_and_in_n_consecutive_it_is() -> None:
    watch = StragglerWatch(margin=0.1, windows=3)
    slow = with_rank(EVEN, 6, 40.5)  # 35% over its peers' 30 ms
    assert watch.update(slow, PIPELINE).stragglers == ()
    assert watch.update(slow, PIPELINE).stragglers == ()
    assert watch.slow_for(6) == 2
    report = watch.update(slow, PIPELINE)
    assert report.stragglers == (Straggler(rank=6, pipeline_rank=1, slower=pytest.approx(0.35), windows=3),)
    assert report.recovered == ()
    # Each window it persists it is named again, with the count so far.
    again = watch.update(with_rank(EVEN, 6, 36.0), PIPELINE)
    assert [(s.rank, s.windows, round(s.slower, 6)) for s in again.stragglers] == [(6, 4, 0.2)]


def test_recovery_resets_the_count_and_is_reported_once() -> None:
    watch = StragglerWatch(margin=0.1, windows=3)
    slow = with_rank(EVEN, 2, 20.0)
    for _ in range(2):
        watch.update(slow, PIPELINE)
    watch.update(EVEN, PIPELINE)  # one normal window: back to 0
    assert watch.slow_for(2) == 0
    assert watch.update(slow, PIPELINE).stragglers == ()
    assert watch.update(slow, PIPELINE).stragglers == ()
    named = watch.update(slow, PIPELINE)
    assert [s.rank for s in named.stragglers] == [2] and named.stragglers[0].windows == 3
    recovered = watch.update(EVEN, PIPELINE)
    assert recovered.stragglers == () and recovered.recovered == (2,)
    assert recovered.log_lines() == ["no longer stragglers: rank 2"] and recovered.as_record() == {}
    assert watch.update(EVEN, PIPELINE) == StragglerReport()  # said once


def test_one_window_is_enough_with_windows_1_and_several_ranks_are_named_in_rank_order() -> None:
    watch = StragglerWatch(margin=0.1, windows=1)
    # A data-parallel replica's two ranks (a TP group: they wait for each other) are slow together.
    times = with_rank(with_rank(EVEN, 5, 45.0), 1, 13.0)
    report = watch.update(times, PIPELINE, ("a", "b", "c", "d", "e", "f", "g", "h"))
    assert [(s.rank, s.pipeline_rank, s.host) for s in report.stragglers] == [(1, 0, "b"), (5, 1, "f")]
    # Rank 1 recovers while rank 5 stays: the change is reported beside the remaining straggler.
    report = watch.update(with_rank(EVEN, 5, 45.0), PIPELINE)
    assert [s.rank for s in report.stragglers] == [5] and report.recovered == (1,)


# ------------------------------------------------------------------ reporting
def test_the_record_and_the_log_line_name_rank_stage_slowdown_windows_and_host() -> None:
    straggler = Straggler(rank=13, pipeline_rank=1, slower=0.35, windows=3, host="gpu-a12")
    report = StragglerReport(stragglers=(straggler,))
    assert report.as_record() == {
        "stragglers": [{"rank": 13, "pipeline_rank": 1, "slower": 0.35, "windows": 3, "host": "gpu-a12"}]
    }
    assert report.log_lines() == [
        "straggler: rank 13 (pipeline rank 1, gpu-a12) 35% slower than its peers' median for 3 windows"
    ]
    anonymous = Straggler(rank=2, pipeline_rank=0, slower=0.5, windows=4)
    assert "host" not in anonymous.as_record()
    assert anonymous.describe() == "rank 2 (pipeline rank 0) 50% slower than its peers' median for 4 windows"
    assert StragglerReport().as_record() == {} and StragglerReport().log_lines() == []


def test_the_log_line_stays_short_with_many_stragglers() -> None:
    many = tuple(Straggler(rank=r, pipeline_rank=0, slower=0.2, windows=3) for r in range(MAX_NAMED_IN_LOG + 5))
    report = StragglerReport(stragglers=many)
    (line,) = report.log_lines()
    assert line.startswith("stragglers: rank 0 ") and line.endswith("; and 5 more (metrics file)")
    assert line.count("slower than") == MAX_NAMED_IN_LOG
    assert len(report.as_record()["stragglers"]) == MAX_NAMED_IN_LOG + 5


# ------------------------------------------------------------------ per-rank stage records
def row(pipeline_rank: int, forward_s: float, backward_s: float, microbatches: int, host: str = "") -> list[float]:
    return [float(pipeline_rank), forward_s, backward_s, 0.002, float(microbatches), *host_values(host)]


def test_stage_cost_keeps_every_global_rank_in_order_with_its_stage_and_host() -> None:
    rows = [
        row(0, 0.010, 0.020, 10, "node-0"),  # 3 ms per microbatch
        row(1, 0.040, 0.080, 10, "node-0"),  # 12 ms
        row(0, 0.012, 0.024, 10, "node-1"),  # 3.6 ms: the slowest of pipeline rank 0
        row(1, 0.040, 0.078, 10, "node-1"),  # 11.8 ms
    ]
    cost = stage_cost(rows, pipeline_size=2)
    assert cost is not None
    assert cost.rank_compute_ms == pytest.approx((3.0, 12.0, 3.6, 11.8))
    assert cost.rank_pipeline_rank == (0, 1, 0, 1)
    assert cost.rank_hosts == ("node-0", "node-0", "node-1", "node-1")
    # Per pipeline rank: still the slowest of its ranks.
    assert cost.compute_ms == pytest.approx((3.6, 12.0))
    assert cost.forward_ms == pytest.approx((1.2, 4.0)) and cost.idle_ms == pytest.approx((2.0, 2.0))
    record = cost.as_record()
    assert record["rank_compute_ms"] == pytest.approx([3.0, 12.0, 3.6, 11.8])
    assert record["rank_pipeline_rank"] == [0, 1, 0, 1]
    assert len(record["stage_forward_ms"]) == 2
    # The watch reads the same record: rank 2 is 20% over its one peer; rank 1 is within 2% of its own.
    report = StragglerWatch(margin=0.1, windows=1).update(
        cost.rank_compute_ms, cost.rank_pipeline_rank, cost.rank_hosts
    )
    assert [(s.rank, s.host, round(s.slower, 6)) for s in report.stragglers] == [(2, "node-1", 0.2)]


def test_stage_cost_without_a_measurement_is_none() -> None:
    assert stage_cost([row(0, 0.01, 0.02, 0), row(1, 0.01, 0.02, 5)], pipeline_size=2) is None
    assert stage_cost([row(0, 0.01, 0.02, 5), row(0, 0.01, 0.02, 5)], pipeline_size=2) is None
    # Rows without the host part (as before): hosts unknown.
    cost = stage_cost([[0.0, 0.01, 0.02, 0.0, 5.0]], pipeline_size=1)
    assert cost is not None and cost.rank_hosts == ("",) and cost.rank_compute_ms == pytest.approx((6.0,))


def test_stage_cost_needs_one_entry_per_rank() -> None:
    with pytest.raises(ValueError, match="one entry per global rank"):
        StageCost(forward_ms=(1.0,), backward_ms=(1.0,), idle_ms=(0.0,), rank_compute_ms=(2.0, 2.0),
                  rank_pipeline_rank=(0,))  # fmt: skip
    with pytest.raises(ValueError, match="one entry per global rank"):
        StageCost(forward_ms=(1.0,), backward_ms=(1.0,), idle_ms=(0.0,), rank_compute_ms=(2.0,),
                  rank_pipeline_rank=(0,), rank_hosts=("a", "b"))  # fmt: skip


@pytest.mark.parametrize("name", ["gpu-node-0017", "", "a" * 48, "nœud-α.cluster", "x" * 47 + "é", "n" * 80])
def test_host_names_travel_as_exact_floats(name: str) -> None:
    values = host_values(name)
    assert len(values) == HOST_VALUES and all(v == int(v) and 0 <= v < 2**48 for v in values)
    decoded = host_name(values)
    size = HOST_VALUES * 6
    if len(name.encode()) <= size:
        assert decoded == name
    else:
        # Cut to 48 bytes; a character cut in two ends the name with U+FFFD.
        assert decoded.rstrip("\ufffd") == name.encode()[:size].decode(errors="ignore")


# ------------------------------------------------------------------ flags
def test_the_flags_and_their_bounds() -> None:
    run = parse_args(["--mock-data"]).run
    assert (run.straggler_margin, run.straggler_windows) == (DEFAULT_MARGIN, DEFAULT_WINDOWS)
    assert RunArgs().straggler_margin == DEFAULT_MARGIN
    run = parse_args(["--mock-data", "--straggler-margin", "0.25", "--straggler-windows", "1"]).run
    assert (run.straggler_margin, run.straggler_windows) == (0.25, 1)
    with pytest.raises(ConfigError, match="--straggler-margin"):
        parse_args(["--mock-data", "--straggler-margin", "0"])
    with pytest.raises(ConfigError, match="--straggler-windows"):
        parse_args(["--mock-data", "--straggler-windows", "0"])


def test_megatron_lms_log_straggler_is_accepted_and_its_detectors_options_refused() -> None:
    assert "--log-straggler" in ALREADY and refusal("--log-straggler") is None
    assert parse_args(["--mock-data", "--log-straggler"]) == parse_args(["--mock-data"])
    for flag in ("--straggler-minmax-count", "--straggler-ctrlr-port", "--disable-straggler-on-startup"):
        why = refusal(flag)
        assert why is not None and "StragglerDetector" in why and "--straggler-margin" in why
    with pytest.raises(ConfigError, match=r"--straggler-minmax-count: .*StragglerDetector"):
        parse_args(["--mock-data", "--straggler-minmax-count", "2"])
