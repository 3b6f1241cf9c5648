"""A checkpoint saved under one layout resumes under another with the same losses."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from megatron_ext.checkpoint.on_disk import read_tracker
from megatron_ext.checkpoint.records import per_rank_format_refusal
from megatron_ext.cli.plot_schedule import main as plot_schedule
from megatron_ext.parallel.layout import ParallelLayout
from megatron_ext.training.chrome_trace import load_timeline
from tests.conftest import (
    ITERS,
    TINY_MODEL,
    assert_matches_baseline,
    read_metrics,
    run_pretrain,
    train_from_seed,
    train_losses,
)

pytestmark = pytest.mark.distributed

HALF = ITERS // 2
TP2_PP2_VP2 = (
    "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2".split()
)


@pytest.fixture(scope="module")
def interrupted(seed_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TP2·PP2·VP2 trained to iteration 3 and saved (model, optimizer, scheduler, data position)."""
    save = tmp_path_factory.mktemp("interrupted") / "ckpt"
    train_from_seed(
        seed_checkpoint,
        save.parent / "m.jsonl",
        4,
        TP2_PP2_VP2,
        "--save",
        str(save),
        "--exit-interval",
        str(HALF),
        expect=75,
    )
    assert read_tracker(save) == HALF
    return save


@pytest.mark.parametrize(
    ("name", "nproc", "flags"),
    [
        ("tp1-pp2", 2, ["--pipeline-model-parallel-size", "2"]),
        ("dp4", 4, []),
        # Saved with even stages, resumed uneven: 2 | 4 | 2 layers.
        (
            "pp3-first-and-last-stage-2-layers",
            3,
            "--pipeline-model-parallel-size 3 --decoder-first-pipeline-num-layers 2 "
            "--decoder-last-pipeline-num-layers 2".split(),
        ),
    ],
)
def test_resume_under_another_layout(
    name: str,
    nproc: int,
    flags: list[str],
    interrupted: Path,
    baseline: dict[int, float],
    baseline_grad_norms: dict[int, float],
    tmp_path: Path,
) -> None:
    metrics = tmp_path / "m.jsonl"
    run_pretrain(
        [*TINY_MODEL, *flags, "--train-iters", str(ITERS), "--load", str(interrupted), "--metrics-file", str(metrics)],
        nproc=nproc,
    )
    # Resuming continues at the saved iteration, with the uninterrupted run's losses and norms.
    assert_matches_baseline(metrics, baseline, baseline_grad_norms, name=name, first=HALF + 1)


DISTOPT = ["--use-distributed-optimizer"]


def _distopt_saved_at_half(seed: Path, tmp_path: Path, *extra: str) -> Path:
    """DP2 with the distributed optimizer, trained from the seed and saved at iteration 3."""
    save = tmp_path / "ckpt"
    train_from_seed(
        seed, tmp_path / "a.jsonl", 2, DISTOPT, "--save", str(save), "--exit-interval", str(HALF), *extra, expect=75
    )
    return save


def _resume(save: Path, metrics: Path, nproc: int, *flags: str, expect: int = 0) -> str:
    proc = run_pretrain(
        [
            *TINY_MODEL,
            *DISTOPT,
            *flags,
            "--train-iters",
            str(ITERS),
            "--load",
            str(save),
            "--metrics-file",
            str(metrics),
        ],
        nproc=nproc,
        expect=expect,
    )
    return proc.stdout + proc.stderr


def test_fully_reshardable_distributed_optimizer_reshards_over_tp_and_dp(
    seed_checkpoint: Path, baseline: dict[int, float], baseline_grad_norms: dict[int, float], tmp_path: Path
) -> None:
    """Saved per parameter (--dist-ckpt-optim-fully-reshardable) under DP2, resumed as TP2·DP2."""
    save = _distopt_saved_at_half(seed_checkpoint, tmp_path, "--dist-ckpt-optim-fully-reshardable")
    _resume(save, tmp_path / "b.jsonl", 4, "--tensor-model-parallel-size", "2")
    assert_matches_baseline(tmp_path / "b.jsonl", baseline, baseline_grad_norms, name="dp2 -> tp2-dp2", first=HALF + 1)


def test_default_distributed_optimizer_format_reshards_over_dp_only(
    seed_checkpoint: Path, baseline: dict[int, float], baseline_grad_norms: dict[int, float], tmp_path: Path
) -> None:
    """Megatron-LM's default (each rank's shard, written in parallel): DP2 -> DP4 works, DP2 -> TP2 is refused."""
    save = _distopt_saved_at_half(seed_checkpoint, tmp_path)
    _resume(save, tmp_path / "b.jsonl", 4)
    assert_matches_baseline(tmp_path / "b.jsonl", baseline, baseline_grad_norms, name="dp2 -> dp4", first=HALF + 1)
    out = _resume(save, tmp_path / "c.jsonl", 2, "--tensor-model-parallel-size", "2", expect=3)
    assert "saved per rank (loadable under another DP only) with TP 1, and this run has TP 2" in out
    assert "--dist-ckpt-optim-fully-reshardable" in out


def test_switching_optimizer_flavour_is_a_clear_error(interrupted: Path, tmp_path: Path) -> None:
    proc = run_pretrain(
        [*TINY_MODEL, "--use-distributed-optimizer", "--train-iters", str(ITERS), "--load", str(interrupted)],
        nproc=1,
        expect=3,
    )
    assert "saved without --use-distributed-optimizer" in proc.stdout + proc.stderr


UNEVEN_LAYOUT = ["--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", "Ett|ttt|t|ttL"]
"""Interleaved PP2 × VP2 with 2 | 3 | 1 | 2 layers per virtual stage (the embedding and loss at the ends)."""


def test_uneven_stages_save_and_resume_even_with_the_optimizer_resharded(
    seed_checkpoint: Path, baseline: dict[int, float], baseline_grad_norms: dict[int, float], tmp_path: Path
) -> None:
    """A layout string's run matches the baseline, and its checkpoint resumes under even stages."""
    save, trace = tmp_path / "ckpt", tmp_path / "timeline.json"
    train_from_seed(
        seed_checkpoint, tmp_path / "a.jsonl", 2, [*UNEVEN_LAYOUT, *DISTOPT], "--save", str(save),
        "--exit-interval", str(HALF), "--dist-ckpt-optim-fully-reshardable", "--timeline", str(trace), expect=75,
    )  # fmt: skip
    first_half = {it: loss for it, loss in baseline.items() if it <= HALF}
    assert train_losses(tmp_path / "a.jsonl") == pytest.approx(first_half, rel=1e-5)

    # Every run measures its stages (rank 1 holds 5 layers and the loss, rank 0 3 layers and the embedding;
    # which is slower is the machine's to say: on a busy one, either).
    records = [r for r in read_metrics(tmp_path / "a.jsonl") if "stage_imbalance" in r]
    assert len(records) == HALF  # one per logged iteration (--log-interval 1)
    assert all(len(r["stage_forward_ms"]) == 2 and r["stage_imbalance"] > 0 for r in records)
    assert all(min(r["stage_forward_ms"]) > 0 and min(r["stage_backward_ms"]) > 0 for r in records)
    # The timeline: every forward and backward of the kept steps on both ranks, drawn beside its simulation.
    by_stage = load_timeline(trace)
    assert sorted(by_stage) == [0, 1]
    for rank, steps in by_stage.items():
        assert len(steps) == HALF
        for step in steps:
            assert sorted((p.step.kind, p.step.microbatch, p.step.chunk) for p in step) == sorted(
                (k, mb, c) for k in "FB" for mb in range(4) for c in range(2)
            ), rank
            assert all(p.end >= p.start for p in step)
    out = io.StringIO()
    assert plot_schedule([f"--timeline={trace}", f"--output={tmp_path / 'plot'}"], stdout=out) == 0
    # The plot names the rank whose passes of the last step took longest in the trace.
    busy = {rank: sum(p.end - p.start for p in steps[-1]) for rank, steps in by_stage.items()}
    assert f"slowest pipeline rank {max(busy, key=lambda r: busy[r])}" in out.getvalue(), (busy, out.getvalue())
    assert (tmp_path / "plot.png").stat().st_size > 0
    _resume(save, tmp_path / "b.jsonl", 2, "--pipeline-model-parallel-size", "2",
            "--num-virtual-stages-per-pipeline-rank", "2")  # fmt: skip
    assert_matches_baseline(
        tmp_path / "b.jsonl", baseline, baseline_grad_norms, name="layout string -> even pp2-vp2", first=HALF + 1
    )


@pytest.mark.unit
def test_a_per_rank_optimizer_state_refuses_another_stage_split() -> None:
    """Same TP, PP and VP but other layers per rank: the per-rank flat shards no longer line up."""

    def layout(**flags: object) -> ParallelLayout:
        return ParallelLayout.from_flags(world_size=2, pipeline_model_parallel_size=2, num_layers=8,
                                         num_attention_heads=2, global_batch_size=8, **flags)  # fmt: skip

    even = layout()
    uneven = layout(decoder_first_pipeline_num_layers=3)
    saved = {"tp": 1, "pp": 2, "vp": 1, "stages": [[3], [5]]}
    refusal = per_rank_format_refusal(saved, even)
    assert refusal is not None
    assert "layers per pipeline rank and virtual stage [[3], [5]], and this run has [[4], [4]]" in refusal
    assert per_rank_format_refusal(saved, uneven) is None
    # Checkpoints from before the split was recorded: TP, PP and VP decide.
    assert per_rank_format_refusal({"tp": 1, "pp": 2, "vp": 1}, even) is None
    assert "with PP 2, and this run has PP 1" in (per_rank_format_refusal(saved, ParallelLayout.from_flags(
        world_size=1, num_layers=8, num_attention_heads=2, global_batch_size=8)) or "")  # fmt: skip
