"""Checkpoints out to Hugging Face transformers and back, on two runs other tests train anyway:

- the Llama-style GPT trained under PP2 × VP2 on real data (``pipeline_run``), and
- the GPT-2-style tiny GPT trained under TP2 (``tp2_run``).

For each, the exported model's logits in ``transformers`` equal Megatron-Core's forward within
1e-5 (fp32), and importing the export and exporting again gives the same files, bit for bit,
through a checkpoint with the same tensors; the Llama run's validation loss in ``transformers``
is the one ``pretrain_gpt.py`` reported. The command lines export and import the first run; the
rest runs in one comparing process (tests/huggingface/compare.py). The README demo
(tests/training/test_training_behaviour.py) exports its model and generates from it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, SavedRun, read_metrics, run_forked
from tests.data.helpers import tool

pytestmark = pytest.mark.distributed


def compare(jobs: list[dict[str, str]], tmp_path: Path) -> list[dict[str, Any]]:
    """tests/huggingface/compare.py's findings, one per job (a process of its own: Megatron-Core's state is
    per process; forked from the rank server, as are the command lines')."""
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    proc = run_forked(REPO / "tests" / "huggingface" / "compare.py", [str(tmp_path / "jobs.json")])
    assert proc.returncode == 0, proc.stderr[-4000:]
    return list(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_exports_match_megatron_and_round_trip(pipeline_run: SavedRun, tp2_run: SavedRun, tmp_path: Path) -> None:
    runs = {"llama-pp2-vp2": pipeline_run, "gpt2-tp2": tp2_run}
    work = {name: tmp_path / name for name in runs}
    llama = work["llama-pp2-vp2"]
    out = tool(
        "convert_checkpoint",
        "to-hf",
        "--load",
        str(pipeline_run.checkpoint),
        "--output",
        str(llama / "hf"),
        forked=True,
    )
    assert "exported iteration 16 as llama" in out.stdout, out.stdout
    dry = tool("convert_checkpoint", "from-hf", "--input", str(llama / "hf"), "--save", str(llama / "imported"),
               "--dry-run", forked=True)  # fmt: skip
    assert not (llama / "imported").exists(), dry.stdout
    out = tool(
        "convert_checkpoint", "from-hf", "--input", str(llama / "hf"), "--save", str(llama / "imported"), forked=True
    )
    assert "continue pretraining with: pretrain_gpt.py --load" in out.stdout and "--swiglu" in out.stdout, out.stdout
    # The dry run prints the same command (the tokenizer's files named where the import puts them).
    assert dry.stdout.splitlines()[-1] == out.stdout.splitlines()[-1], (dry.stdout, out.stdout)
    jobs = [
        {"checkpoint": str(run.checkpoint), "hf": str(work[n] / "hf"), "imported": str(work[n] / "imported"),
         "work": str(work[n])}
        for n, run in runs.items()
    ]  # fmt: skip
    results = dict(zip(runs, compare(jobs, tmp_path), strict=True))

    for name, architecture in (("llama-pp2-vp2", "LlamaForCausalLM"), ("gpt2-tp2", "GPT2LMHeadModel")):
        hf, again, result = work[name] / "hf", work[name] / "hf-again", results[name]
        assert json.loads((hf / "config.json").read_text())["architectures"] == [architecture], name
        assert result["max_abs"] <= 1e-5 * result["max_logit"], (name, result)
        # Import, then export again: the same files, bit for bit, through a checkpoint with the same tensors.
        files = sorted(p.name for p in hf.iterdir())
        assert files == sorted(p.name for p in again.iterdir()), name
        for file in files:
            assert (hf / file).read_bytes() == (again / file).read_bytes(), f"{name}: {file} differs after a round trip"
        assert result["keys"] == result["other_keys"] and result["keys"], (name, result)
        assert result["different"] == [], (name, result)

    # The run evaluated 2 global batches of its validation split after its last step; so does transformers.
    valid = [r["valid_loss"] for r in read_metrics(pipeline_run.metrics) if "valid_loss" in r and r["iteration"] == 16]
    assert len(valid) == 1 and results["llama-pp2-vp2"]["batches"] == 2
    assert results["llama-pp2-vp2"]["valid_loss"] == pytest.approx(valid[0], rel=1e-5)
    assert (llama / "hf" / "tokenizer.json").is_file() and (llama / "hf" / "tokenizer.model").is_file()
