"""A checkpoint saved under 1F1B resumes under each zero-bubble schedule (``--enable-zero-bubble``) and back, to
the same losses.

The schedule is not part of what a checkpoint holds: the weights, optimizer state and data position are
1F1B's either way. One run of six iterations changes schedule at its two saves (1F1B for iterations 1–2, the
zero-bubble schedule for 3–4, 1F1B for 5–6) and must reproduce the uninterrupted 1F1B run: ZB-H1 against 1F1B,
and ZB interleaved against interleaved 1F1B.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from megatron_ext.cli.plot_schedule import main as plot_schedule
from megatron_ext.config.exit_codes import ExitCode
from megatron_ext.training.chrome_trace import load_timeline
from tests.conftest import TINY_MODEL, grad_norms, run_pretrain, train_losses

pytestmark = pytest.mark.distributed

RUN = [*TINY_MODEL, "--pipeline-model-parallel-size", "2", "--train-iters", "6"]


@pytest.mark.parametrize(
    "chunks", [[], ["--virtual-pipeline-model-parallel-size", "2"]], ids=["zb-h1", "zb-interleaved"]
)
def test_1f1b_checkpoint_resumes_under_zero_bubble_and_back(chunks: list[str], tmp_path: Path) -> None:
    whole = tmp_path / "whole.jsonl"
    run_pretrain([*RUN, *chunks, "--metrics-file", str(whole)], nproc=2)
    save, parts = tmp_path / "ckpt", tmp_path / "parts.jsonl"
    common = [*RUN, *chunks, "--save", str(save), "--metrics-file", str(parts)]
    run_pretrain([*common, "--exit-interval", "2"], nproc=2, expect=ExitCode.SAVED_AND_STOPPED)
    trace = tmp_path / "timeline.json"
    run_pretrain([*common, "--load", str(save), "--exit-interval", "4", "--enable-zero-bubble", "--timeline",
                  str(trace)], nproc=2, expect=ExitCode.SAVED_AND_STOPPED)  # fmt: skip
    run_pretrain([*common, "--load", str(save)], nproc=2)
    expected, got = train_losses(whole), train_losses(parts)
    assert sorted(got) == sorted(expected) == list(range(1, 7))
    for it in expected:
        assert got[it] == pytest.approx(expected[it], rel=1e-5), it
        assert grad_norms(parts)[it] == pytest.approx(grad_norms(whole)[it], rel=1e-5), it
    _check_weight_passes(trace, chunks=1 + bool(chunks), tmp_path=tmp_path)


def _check_weight_passes(trace: Path, *, chunks: int, tmp_path: Path) -> None:
    """The zero-bubble steps' timeline marks every F, B and W pass, each W after its B; the picture draws it above
    its own schedule simulated with the measured times."""
    by_stage = load_timeline(trace)
    assert sorted(by_stage) == [0, 1]
    for rank, steps in by_stage.items():
        assert len(steps) == 2  # iterations 3 and 4
        for step in steps:
            passes = {(p.step.kind, p.step.microbatch, p.step.chunk): p for p in step}
            assert sorted(passes) == sorted((k, mb, c) for k in "FBW" for mb in range(4) for c in range(chunks)), rank
            assert all(passes["W", mb, c].start >= passes["B", mb, c].end for _, mb, c in passes)
    out = io.StringIO()
    assert plot_schedule([f"--timeline={trace}", f"--output={tmp_path / 'plot'}"], stdout=out) == 0
    assert f"simulated {'zb-interleaved' if chunks > 1 else 'zb-h1'} " in out.getvalue(), out.getvalue()
    assert (tmp_path / "plot.png").stat().st_size > 0
