"""A checkpoint knows its tokenizer and data by content: another tokenizer of the same size, or other data, is
refused by resume, export and generation unless accepted with a flag (finding 4 of the checkpoint faults).

Uses the real-data run that tests/training/test_train_on_indexed.py and tests/huggingface share
(``pipeline_run``: a 1,000-piece SentencePiece model), and a second 1,000-piece model trained on half its corpus.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron_ext.config.exit_codes import ExitCode
from tests.conftest import REPO, SavedRun, pipeline_flags, run_forked, run_pretrain, run_script

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def other_model(indexed_datasets: dict[str, Path]) -> Path:
    """Another 1,000-piece SentencePiece model, trained with the same options on dataset B's half of the corpus."""
    from tests.data.helpers import tool

    prefix = indexed_datasets["root"] / "other-sp1k"
    tool(
        "train_tokenizer",
        *("--input", str(indexed_datasets["root"] / "b.jsonl"), "--model-prefix", str(prefix)),
        *("--vocab-size", "1000", "--byte-fallback", "--user-defined-symbols", "<special>"),
    )
    return prefix.with_suffix(".model")


def _resume(datasets: dict[str, Path], run: SavedRun, *changes: str, expect: int, dry: bool = False) -> str:
    """One more iteration from the run's checkpoint (nothing saved), with ``changes`` to its flags; ``dry``: its
    ``--dry-run``, which refuses what needs no model before anything is built (resume.preflight_resume)."""
    flags = [*pipeline_flags(datasets), "--train-iters", "17", "--eval-iters", "0", "--load", str(run.checkpoint)]
    flags.append("--use-checkpoint-opt_param-scheduler")  # one iteration more than the schedule was made for
    if dry:
        proc = run_script([*flags, *changes, "--dry-run", "--world-size", "2"])
        assert proc.returncode == expect, proc.stderr[-3000:]
    else:
        proc = run_pretrain([*flags, *changes], nproc=2, expect=expect)
    return proc.stdout + proc.stderr


def test_resuming_with_another_tokenizer_of_the_same_size_is_refused(
    indexed_datasets: dict[str, Path], pipeline_run: SavedRun, other_model: Path
) -> None:
    """Before: resumed (only the vocabulary size was compared), exit 0. Now refused before anything is built."""
    other = ("--tokenizer-model", str(other_model))
    out = _resume(indexed_datasets, pipeline_run, *other, expect=ExitCode.CHECKPOINT, dry=True)
    assert "the checkpoint was trained with the tokenizer GPTSentencePieceTokenizer at" in out
    assert f"this one is GPTSentencePieceTokenizer at {other_model} (vocabulary 1,000" in out
    assert "--accept-tokenizer-change to go on with this one deliberately" in out


def test_resuming_on_other_data_is_refused_unless_accepted(
    indexed_datasets: dict[str, Path], pipeline_run: SavedRun
) -> None:
    a, b = str(indexed_datasets["a"]), str(indexed_datasets["b"])
    other_blend = ["--data-path", "0.5", a, "0.5", b]
    out = _resume(indexed_datasets, pipeline_run, *other_blend, expect=ExitCode.CHECKPOINT, dry=True)
    assert f"--data-path dataset 1 ({a}): weight 0.7 → 0.5; --data-path dataset 2 ({b}): weight 0.3 → 0.5" in out
    assert "pass --accept-data-change to continue on this data deliberately" in out
    out = _resume(indexed_datasets, pipeline_run, *other_blend, "--accept-data-change", expect=0)
    assert "training data changed (--accept-data-change)" in out and "loaded checkpoint" in out


@pytest.mark.parametrize("tool", ["generate", "to-hf"])
def test_the_tools_refuse_another_tokenizer(
    tool: str, pipeline_run: SavedRun, other_model: Path, tmp_path: Path
) -> None:
    """Before: generate.py printed text decoded with the wrong ids and to-hf shipped the wrong tokenizer, exit 0."""
    load = ["--load", str(pipeline_run.checkpoint), "--tokenizer-model", str(other_model)]
    script, args = (
        ("generate.py", [*load, "--prompt", "The", "--max-new-tokens", "2"])
        if tool == "generate"
        else ("convert_checkpoint.py", ["to-hf", *load, "--output", str(tmp_path / "hf")])
    )
    proc = run_forked(REPO / "tools" / script, args)
    assert proc.returncode == ExitCode.CHECKPOINT, proc.stderr
    assert "the checkpoint was trained with the tokenizer" in proc.stderr
    assert "--accept-tokenizer-change to use this one deliberately" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "hf").exists()
