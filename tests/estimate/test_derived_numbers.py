"""The analytic parameter counts of --dry-run equal those of the built model."""

from __future__ import annotations

import re

import pytest

from tests.conftest import run_pretrain

pytestmark = pytest.mark.distributed

SHAPES = {
    "gpt-tied-learned": (1, "--num-layers 2 --hidden-size 64 --num-attention-heads 4".split()),
    "gpt-tied-pp2": (
        2,
        "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --pipeline-model-parallel-size 2".split(),
    ),
    "llama-like-tp2-pp2": (
        4,
        "--num-layers 4 --hidden-size 64 --num-attention-heads 8 --group-query-attention --num-query-groups 2 --swiglu --normalization RMSNorm --disable-bias-linear --untie-embeddings-and-output-weights --position-embedding-type rope --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2".split(),
    ),
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_planned_parameters_match_built_model(name: str) -> None:
    nproc, shape = SHAPES[name]
    proc = run_pretrain(
        [
            *shape,
            "--seq-length",
            "32",
            "--vocab-size",
            "500",
            "--mock-data",
            "--device",
            "cpu",
            "--micro-batch-size",
            "1",
            "--train-iters",
            "0",
        ],
        nproc=nproc,
    )
    planned = re.search(r"parameters: ([\d,]+) in total, ([\d,]+) on the most loaded rank", proc.stdout)
    built = re.search(r"parameters per rank: min ([\d,]+), max ([\d,]+)", proc.stdout)
    assert planned and built, proc.stdout
    total, planned_max = (int(g.replace(",", "")) for g in planned.groups())
    built_max = int(built.group(2).replace(",", ""))
    assert planned_max == built_max
    if nproc == 1:
        assert total == built_max
