"""Megatron-Core's emerging optimizers (Muon, Lion, SOAP, from the emerging-optimizers package) train the tiny GPT
on CPU, and a run stopped with a checkpoint resumes bit for bit: the same loss and gradient norm at every
iteration as the run that was not stopped (the optimizer's state: Muon's momentum, Lion's moment, SOAP's
preconditioners and moments, and Muon's Adam for the rest, is saved and loaded by Megatron-Core). Muon's loss
equivalence across layouts is a row of ``test_loss_equivalence.py`` (the "muon" family)."""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron_ext.config.exit_codes import ExitCode
from tests.conftest import TINY_MODEL, grad_norms, run_pretrain, train_losses

pytestmark = pytest.mark.distributed

CASES = {
    "muon": (1, ["--optimizer", "muon"]),
    # Megatron-Core's layer-wise distributed optimizer: each DP rank updates whole weights (bf16 only in 0.19.2).
    "muon-dp2-layer-wise-distributed-optimizer": (2, "--optimizer muon --use-distributed-optimizer --bf16".split()),
    "muon-tp2-lion-scalar-optimizer": (
        2,
        "--optimizer muon --tensor-model-parallel-size 2 --muon-scalar-optimizer lion --muon-nesterov".split(),
    ),
    "lion": (1, ["--optimizer", "lion"]),
}
ITERS = 6
STOP = 3


@pytest.mark.parametrize("name", list(CASES))
def test_trains_and_resumes_bit_for_bit(name: str, tmp_path: Path) -> None:
    nproc, flags = CASES[name]
    run = [*TINY_MODEL, "--num-layers", "2", *flags, "--train-iters", str(ITERS)]
    whole, parts, save = tmp_path / "whole.jsonl", tmp_path / "parts.jsonl", tmp_path / "ckpt"
    run_pretrain([*run, "--metrics-file", str(whole)], nproc=nproc)
    run_pretrain(
        [*run, "--save", str(save), "--exit-interval", str(STOP), "--metrics-file", str(parts)],
        nproc=nproc,
        expect=ExitCode.SAVED_AND_STOPPED,
    )
    run_pretrain([*run, "--load", str(save), "--metrics-file", str(parts)], nproc=nproc)
    losses = train_losses(whole)
    assert sorted(losses) == list(range(1, ITERS + 1))
    assert losses[ITERS] < losses[1] - 0.05, f"{name} does not train: {losses}"
    # Bit for bit: equal floats, not approximately equal.
    assert train_losses(parts) == losses
    assert grad_norms(parts) == grad_norms(whole)


def test_soap_trains(tmp_path: Path) -> None:
    """SOAP trains; its checkpoints are refused (Megatron-Core 0.19.2 cannot shard its preconditioners:
    ``tests/config/test_emerging_optimizers.py``)."""
    metrics = tmp_path / "m.jsonl"
    run_pretrain([*TINY_MODEL, "--num-layers", "2", "--optimizer", "soap", "--train-iters", str(ITERS),
                  "--metrics-file", str(metrics)])  # fmt: skip
    losses = train_losses(metrics)
    assert sorted(losses) == list(range(1, ITERS + 1))
    assert losses[ITERS] < losses[1] - 0.05, f"SOAP does not train: {losses}"
