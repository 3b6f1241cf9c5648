"""A resumed run keeps the checkpoint's padded vocabulary, whatever its TP would pad to (issue: TP changed the model).

Megatron pads the vocabulary to a multiple of ``--make-vocab-size-divisible-by``
× TP. With ``--vocab-size 301`` (301 ids, end of document included) that is
384 rows at TP1 and 512 at TP2 and TP4: a checkpoint that moves between them
must keep its rows, or the new ones enter every softmax with random weights.
Each case trains a reference run that saves at iteration 3 and goes on to 6;
the checkpoint at 3 is then resumed under another layout, which must give the
reference's losses and gradient norms for iterations 6-10 (fp32, 1e-5).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from megatron_ext.config.exit_codes import ExitCode
from megatron_ext.config.runtime import TRACKER_FILENAME
from tests.conftest import ITERS, TINY_MODEL, assert_matches_baseline, grad_norms, run_pretrain, train_losses

pytestmark = pytest.mark.distributed

HALF = ITERS // 2
MODEL = [a if a != "255" else "301" for a in TINY_MODEL]  # 301 ids: 384 rows at TP1, 512 at TP2 and TP4
TP = "--tensor-model-parallel-size"
UNTIED = ["--untie-embeddings-and-output-weights"]
FULLY_RESHARDABLE = ["--use-distributed-optimizer", "--dist-ckpt-optim-fully-reshardable"]


def _reference(tmp_path: Path, nproc: int, *flags: str) -> tuple[Path, Path]:
    """(checkpoint root whose tracker names iteration 3, metrics of the uninterrupted run)."""
    save, metrics = tmp_path / "ref-ckpt", tmp_path / "ref.jsonl"
    run_pretrain(
        [*MODEL, *flags, "--train-iters", str(ITERS), "--save", str(save), "--save-interval", str(HALF),
         "--metrics-file", str(metrics)],
        nproc=nproc,
    )  # fmt: skip
    # Both saves are complete; point the tracker at the one in the middle (a copy, so the run stays as it was).
    resume = tmp_path / "at-5"
    shutil.copytree(save, resume)
    (resume / TRACKER_FILENAME).write_text(f"{HALF}\n")
    return resume, metrics


def _resume(load: Path, metrics: Path, nproc: int, *flags: str) -> str:
    proc = run_pretrain(
        [*MODEL, *flags, "--train-iters", str(ITERS), "--load", str(load), "--metrics-file", str(metrics)],
        nproc=nproc,
    )
    return proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("name", "saved", "resumed"),
    [
        # 384 rows kept at TP2 (which would pad to 512).
        ("tied tp1 -> tp2", (1, []), [(2, [TP, "2"])]),
        # 512 rows kept at TP1 (which would pad to 384); untied, so the output layer's rows too, with the
        # distributed optimizer's state of both.
        ("untied, distributed optimizer tp2 -> dp2", (2, [*UNTIED, *FULLY_RESHARDABLE, TP, "2"]),
         [(2, [*UNTIED, *FULLY_RESHARDABLE])]),
    ],
)  # fmt: skip
def test_resume_under_another_tp_keeps_the_padding(
    name: str, saved: tuple[int, list[str]], resumed: list[tuple[int, list[str]]], tmp_path: Path
) -> None:
    load, reference = _reference(tmp_path, saved[0], *saved[1])
    losses, norms = train_losses(reference), grad_norms(reference)
    for i, (nproc, flags) in enumerate(resumed):
        metrics = tmp_path / f"resumed-{i}.jsonl"
        out = _resume(load, metrics, nproc, *flags)
        assert "(the checkpoint's under --load; TP" in out, out[-3000:]
        assert_matches_baseline(metrics, losses, norms, name=f"{name} ({' '.join(flags)})", first=HALF + 1)


def test_a_tp_that_does_not_divide_the_padding_is_refused_before_launch(tmp_path: Path) -> None:
    """301 rows (--make-vocab-size-divisible-by 1 at TP1) cannot be split over TP2: refused, with what works."""
    save = tmp_path / "ckpt"
    run_pretrain([*MODEL, "--make-vocab-size-divisible-by", "1", "--train-iters", "1", "--save", str(save)])
    proc = run_pretrain(
        [*MODEL, TP, "2", "--train-iters", "2", "--load", str(save), "--world-size", "2", "--dry-run"],
        expect=ExitCode.CHECKPOINT,
    )
    out = proc.stdout + proc.stderr
    assert "the checkpoint's padded vocabulary (301 rows for 301 tokens) is not divisible by tensor(2)" in out
    assert "resume under TP in [1]" in out and "--make-vocab-size-divisible-by" in out
    # --dry-run reports the padding a resumed run will use.
    proc = run_pretrain([*MODEL, "--train-iters", "2", "--load", str(save), "--dry-run"])
    assert (
        "padded vocabulary: 301 (the checkpoint's under --load; TP 1 alone would pad 301 tokens to 384)" in proc.stdout
    )
