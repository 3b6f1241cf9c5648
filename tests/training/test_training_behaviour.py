"""Determinism, non-finite losses, and the README's demo command."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests import waits
from tests.conftest import REPO, TINY_MODEL, _free_port, read_metrics, run_pretrain, train_losses
from tests.waits import RUN_S

pytestmark = pytest.mark.distributed


def test_same_seed_and_layout_give_identical_losses(tmp_path: Path) -> None:
    flags = [
        *TINY_MODEL,
        "--pipeline-model-parallel-size",
        "2",
        "--virtual-pipeline-model-parallel-size",
        "2",
        "--hidden-dropout",
        "0.1",
        "--train-iters",
        "4",
    ]
    runs = []
    for name in ("a", "b"):
        run_pretrain([*flags, "--metrics-file", str(tmp_path / f"{name}.jsonl")], nproc=2)
        runs.append(train_losses(tmp_path / f"{name}.jsonl"))
    assert runs[0] == runs[1]  # bit-for-bit, dropout included


def test_non_finite_loss_skips_the_step_and_counts_it(tmp_path: Path) -> None:
    metrics = tmp_path / "m.jsonl"
    # Weights of order 1e30 overflow fp32 activations: every loss is inf/nan.
    run_pretrain([*TINY_MODEL, "--init-method-std", "1e30", "--train-iters", "3", "--metrics-file", str(metrics)])
    rows = [r for r in read_metrics(metrics) if "lm_loss" in r]
    assert [r["skipped"] for r in rows] == [1, 1, 1]
    assert [r["skipped_total"] for r in rows] == [1, 2, 3]
    assert all(r["lm_loss"] is None for r in rows)  # non-finite values are written as null


def test_readme_demo_trains_and_checkpoints(tmp_path: Path) -> None:
    # The demo's own knobs, smaller: a 1 MB corpus and a 1,000-piece tokenizer (its default 3 MB and 4,000 take
    # twice as long to build) in a directory of the test's.
    env = dict(
        os.environ,
        OUT_DIR=str(tmp_path / "demo"),
        DATA_DIR=str(tmp_path / "data"),
        ITERS="20",
        CORPUS_MB="1",
        VOCAB="1000",
        MASTER_PORT=str(_free_port()),
    )
    proc = waits.run(["bash", str(REPO / "scripts" / "demo.sh")], timeout=RUN_S, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "checkpoint:" in proc.stdout and "(latest iteration 20)" in proc.stdout
    assert (tmp_path / "demo" / "checkpoints" / "iter_0000020").is_dir()
    # Its loss curve beside them (tools/plot_metrics.py; tests/cli/test_plot_metrics.py checks the picture).
    curve = tmp_path / "demo" / "loss.png"
    assert f"wrote {curve}" in proc.stdout and curve.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    # It ends by exporting the model to transformers and printing a sample generated from the checkpoint
    # (tests/huggingface checks exports of this architecture against Megatron-Core's forward).
    assert "exported iteration 20 as llama" in proc.stdout
    assert json.loads((tmp_path / "demo" / "hf" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    sample = proc.stdout.split("sample (temperature 0.8")[1].split("\n", 1)[1]
    assert sample.startswith("Return the") and len(sample.strip()) > len("Return the"), proc.stdout[-2000:]
