"""Runs in progress survive a Megatron-Core upgrade: checkpoints saved with an older release (kept in
``checkpoints/``, made by ``scripts/save_upgrade_checkpoints.py``) resume with the installed one and continue with
the losses that the older release printed after them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_pretrain, train_losses

pytestmark = pytest.mark.distributed

CHECKPOINTS = Path(__file__).parent / "checkpoints"
CASES = sorted(path.name for path in CHECKPOINTS.iterdir() if path.is_dir())
LOSS_REL_TOL = 1e-5
"""The issue's bound: the same numerics within float32 reassociation."""


def test_the_older_release_s_checkpoints_are_here() -> None:
    assert CASES == ["pp2-vp2-dp2-distributed-optimizer", "pp2-zero-bubble"]


@pytest.mark.parametrize("case", CASES)
def test_a_checkpoint_of_an_older_release_resumes_with_its_losses(case: str, tmp_path: Path) -> None:
    record = json.loads((CHECKPOINTS / case / "case.json").read_text())
    checkpoint = tmp_path / "checkpoint"  # a copy: a run never writes into the repository
    shutil.copytree(CHECKPOINTS / case / "checkpoint", checkpoint)
    metrics = tmp_path / "m.jsonl"
    proc = run_pretrain(
        [*record["args"], "--load", str(checkpoint), "--save", str(tmp_path / "save"), "--metrics-file", str(metrics)],
        nproc=record["nproc"],
    )
    assert f"(iteration {record['saved_at']})" in proc.stdout + proc.stderr
    # Trained with --vocab-size 255 when NullTokenizer added the end of document (256 ids): the same command line
    # keeps that vocabulary, and says so.
    assert "--vocab-size 255 (NullTokenizer): " in proc.stdout + proc.stderr
    assert "(256 ids, end of document 255); the run keeps that vocabulary, as --vocab-size 256" in proc.stdout
    expected = {int(it): loss for it, loss in record["losses"].items()}
    got = train_losses(metrics)
    assert sorted(got) == sorted(expected)
    for it, loss in expected.items():
        assert got[it] == pytest.approx(loss, rel=LOSS_REL_TOL), (
            f"iteration {it}: {got[it]!r} with megatron-core installed, {loss!r} with {record['megatron_core']}"
        )
