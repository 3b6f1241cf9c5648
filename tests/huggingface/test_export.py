"""Checkpoints out to Hugging Face transformers and back, on the runs other tests train anyway:

- the Llama-style GPT trained under PP2 × VP2 on real data (``pipeline_run``), and
- the GPT-2-style tiny GPT trained under TP2 (``tp2_run``).

The exported model's logits in ``transformers`` equal Megatron-Core's forward within 1e-5
(fp32), its validation loss is the one ``pretrain_gpt.py`` reported, and importing the export
and exporting again gives the same files, bit for bit, through a checkpoint with the same tensors.
Export runs as a command line; import too on the first run; the rest in the comparing process. The
README demo (tests/training/test_training_behaviour.py) exports its model and generates from it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, SavedRun, read_metrics
from tests.data.helpers import tool

pytestmark = pytest.mark.distributed

RUNS = {
    "llama-pp2-vp2": ("pipeline_run", "LlamaForCausalLM", 16),
    "gpt2-tp2": ("tp2_run", "GPT2LMHeadModel", 10),
}


def compare(*args: str | Path) -> dict[str, Any]:
    """tests/huggingface/compare.py's findings (a process of its own: Megatron-Core's state is per process)."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "tests.huggingface.compare", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(RUNS))
def test_export_matches_megatron_and_round_trips(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    fixture, architecture, iteration = RUNS[name]
    run: SavedRun = request.getfixturevalue(fixture)
    hf = tmp_path / "hf"
    out = tool("convert_checkpoint", "to-hf", "--load", str(run.checkpoint), "--output", str(hf)).stdout
    assert f"exported iteration {iteration}" in out, out
    config = json.loads((hf / "config.json").read_text())
    assert config["architectures"] == [architecture]

    back, again = tmp_path / "imported", tmp_path / "hf-again"
    if name.startswith("llama"):
        out = tool("convert_checkpoint", "from-hf", "--input", str(hf), "--save", str(back)).stdout
        assert "continue pretraining with: pretrain_gpt.py --load" in out and "--swiglu" in out, out
    # Exported again (and, for the second run, imported too) in the comparing process.
    result = compare(run.checkpoint, hf, back, tmp_path)

    assert result["max_abs"] <= 1e-5 * result["max_logit"], result
    if name.startswith("llama"):
        # The run evaluated 2 global batches of its validation split after its last step; so does transformers.
        valid = [r["valid_loss"] for r in read_metrics(run.metrics) if "valid_loss" in r and r["iteration"] == 16]
        assert len(valid) == 1 and result["batches"] == 2
        assert result["valid_loss"] == pytest.approx(valid[0], rel=1e-5)
        assert (hf / "tokenizer.json").is_file() and (hf / "tokenizer.model").is_file()

    # Import, then export again: the same files, bit for bit, through a checkpoint with the same tensors.
    files = sorted(p.name for p in hf.iterdir())
    assert files == sorted(p.name for p in again.iterdir())
    for file in files:
        assert (hf / file).read_bytes() == (again / file).read_bytes(), f"{file} differs after import and export"
    assert result["keys"] == result["other_keys"] and result["keys"], result
    assert result["different"] == [], result
