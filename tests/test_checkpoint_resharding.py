"""A checkpoint saved under one layout resumes under another with the same losses."""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron_ext.checkpointing import read_tracker
from tests.conftest import ITERS, REL_TOL, TINY_MODEL, run_pretrain, train_from_seed, train_losses

pytestmark = pytest.mark.distributed

HALF = ITERS // 2
TP2_PP2_VP2 = (
    "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2".split()
)


@pytest.fixture(scope="module")
def interrupted(seed_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TP2·PP2·VP2 trained to iteration 5 and saved (model, optimizer, scheduler, data position)."""
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
    ],
)
def test_resume_under_another_layout(
    name: str, nproc: int, flags: list[str], interrupted: Path, baseline: dict[int, float], tmp_path: Path
) -> None:
    metrics = tmp_path / "m.jsonl"
    run_pretrain(
        [*TINY_MODEL, *flags, "--train-iters", str(ITERS), "--load", str(interrupted), "--metrics-file", str(metrics)],
        nproc=nproc,
    )
    losses = train_losses(metrics)
    assert sorted(losses) == list(range(HALF + 1, ITERS + 1)), "resume must continue at the saved iteration"
    for it in losses:
        assert losses[it] == pytest.approx(baseline[it], rel=REL_TOL), f"{name}: iteration {it}"


def test_distributed_optimizer_reshards_over_tp_and_dp(
    seed_checkpoint: Path, baseline: dict[int, float], tmp_path: Path
) -> None:
    """DP2 with the distributed optimizer, saved at 5, resumed as TP2·DP2 (optimizer shards regrouped)."""
    save = tmp_path / "ckpt"
    train_from_seed(
        seed_checkpoint,
        tmp_path / "a.jsonl",
        2,
        ["--use-distributed-optimizer"],
        "--save",
        str(save),
        "--exit-interval",
        str(HALF),
        expect=75,
    )
    metrics = tmp_path / "b.jsonl"
    run_pretrain(
        [
            *TINY_MODEL,
            "--use-distributed-optimizer",
            "--tensor-model-parallel-size",
            "2",
            "--train-iters",
            str(ITERS),
            "--load",
            str(save),
            "--metrics-file",
            str(metrics),
        ],
        nproc=4,
    )
    losses = train_losses(metrics)
    assert sorted(losses) == list(range(HALF + 1, ITERS + 1))
    for it in losses:
        assert losses[it] == pytest.approx(baseline[it], rel=REL_TOL), f"iteration {it}"


def test_switching_optimizer_flavour_is_a_clear_error(interrupted: Path, tmp_path: Path) -> None:
    proc = run_pretrain(
        [*TINY_MODEL, "--use-distributed-optimizer", "--train-iters", str(ITERS), "--load", str(interrupted)],
        nproc=1,
        expect=3,
    )
    assert "saved without --use-distributed-optimizer" in proc.stdout + proc.stderr
