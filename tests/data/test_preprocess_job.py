"""The steps of recipes/preprocess_corpus.sh without SLURM: the plan (balanced, fixed at the first submission),
tasks run as the array runs them, the finish; merged in input order, the output is one preprocess_data.py run's,
byte for byte. tests/recipes/test_preprocess_recipe.py runs the recipe on the SLURM cluster."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_ext.cli import preprocess_job
from megatron_ext.data.preprocess_job import balanced_shares, load_plan
from tests import waits
from tests.conftest import REPO, _env
from tests.data.helpers import preprocess, same_files, shared_data, write_as
from tests.waits import RUN_S

pytestmark = pytest.mark.unit

FORMATS = ("jsonl", "jsonl.gz", "jsonl.zst", "parquet", "jsonl", "arrow", "jsonl.zst", "jsonl.gz")


def corpus(shared: dict[str, Path], root: Path) -> list[Path]:
    """8 files of mixed formats and sizes (the shared corpus cut unevenly), in two directories."""
    lines = shared["corpus"].read_text(encoding="utf-8").splitlines()
    cuts = [0, 40, 60, 200, 230, 300, 320, 400, len(lines)]  # 474 documents
    files = []
    for i, fmt in enumerate(FORMATS):
        directory = root / ("web" if i % 2 == 0 else "code")
        directory.mkdir(parents=True, exist_ok=True)
        files.append(write_as(lines[cuts[i] : cuts[i + 1]], directory / f"part-{i}.{fmt}", fmt))
    return sorted(files)  # the order the job's glob gives


def test_shares_are_contiguous_and_as_even_as_they_can_be() -> None:
    assert balanced_shares([5, 5, 5, 5], 2) == [0, 0, 1, 1]
    assert balanced_shares([10, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], 2) == [0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]
    assert balanced_shares([1, 2, 3], 8) == [0, 1, 2]  # fewer tasks than asked for when fewer files
    shares = balanced_shares([7, 3, 9, 1, 4, 8, 2, 6], 3)
    loads = [sum(s for s, t in zip([7, 3, 9, 1, 4, 8, 2, 6], shares, strict=True) if t == k) for k in range(3)]
    assert shares == sorted(shares) and max(loads) == 16  # the best contiguous split of these sizes


def job(*args: str) -> subprocess.CompletedProcess[str]:
    env = _env()
    return waits.run([sys.executable, "-m", "megatron_ext.cli.preprocess_job", *args], timeout=RUN_S, env=env, cwd=REPO)


def test_tasks_then_finish_give_one_runs_bytes(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shared = shared_data(tmp_path_factory)
    files = corpus(shared, tmp_path / "in")
    args = f"--tokenizer-type GPTSentencePieceTokenizer --tokenizer-model {shared['model']} --append-eod --workers 1"
    inputs = [str(tmp_path / "in" / "*" / "part-*")]
    out = tmp_path / "out"
    plan = ["plan", "--input", *inputs, "--output", str(out), "--tasks", "3", "--preprocess-args", args]

    # A dry run prints the plan and writes nothing.
    assert preprocess_job.main([*plan, "--dry-run"]) == 0
    printed = capsys.readouterr()
    assert printed.out.strip() == "0,1,2" and "8 files" in printed.err and "task 2:" in printed.err
    assert not out.exists()
    assert preprocess_job.main(plan) == 0
    assert capsys.readouterr().out.strip() == "0,1,2"
    fixed = load_plan(out)
    assert [f.path for f in fixed.files] == [str(f) for f in files] and fixed.tasks == 3

    # Other options into the same output are refused; the same ones reuse the plan, and so do options that change
    # no finished task's bytes (skipping bad lines lets a task finish that failed on one).
    assert preprocess_job.main([*plan[:-1], args + " --json-keys body"]) == 2
    assert "with other input files, sizes of finished tasks' files or options" in capsys.readouterr().err
    assert preprocess_job.main([*plan[:-1], args + " --skip-bad-lines"]) == 0
    assert "its plan is kept" in capsys.readouterr().err and "--skip-bad-lines" in load_plan(out).preprocess_args
    assert preprocess_job.main([*plan, "--task-time", "00:10:00"]) == 2
    assert "give at least 15 minutes" in capsys.readouterr().err
    for task in (2, 0):
        assert job("task", "--output", str(out), "--task", str(task)).returncode == 0
    assert preprocess_job.main(plan) == 0
    assert capsys.readouterr().out.strip() == "1"  # only the task without a record is still to run
    assert preprocess_job.main(["finish", "--output", str(out)]) == 1
    assert "tasks 1 of" in capsys.readouterr().err

    # A task directory that is not a finished task's output is named, not taken.
    stray = out / "datasets" / "task-1"
    stray.mkdir(parents=True)
    refused = job("task", "--output", str(out), "--task", "1")
    assert refused.returncode == 1 and "it is not a finished task's output" in refused.stderr, refused.stderr
    stray.rmdir()
    done = job("task", "--output", str(out), "--task", "1")
    assert done.returncode == 0 and "task 1: " in done.stdout, done.stderr
    assert "done before" in job("task", "--output", str(out), "--task", "1").stdout
    assert preprocess_job.main(["finish", "--output", str(out), "--merge"]) == 0
    assert "text: 8 datasets verified" in capsys.readouterr().out

    # Merged in input order: the bytes of one preprocess_data.py run over the same files.
    preprocess([str(f) for f in files], tmp_path / "single", shared["model"], "--append-eod", "--workers", "1")
    assert same_files(out / "corpus_text_document", tmp_path / "single_text_document")
    words = (out / "blend_text.txt").read_text().split()
    prefixes = words[1::2]
    assert prefixes == [fixed.dataset(f, "text") for f in fixed.files]
    assert all(Path(f"{p}.idx").exists() for p in prefixes)
    assert [json.loads(p.read_text())["task"] for p in sorted((out / "job" / "done").iterdir())] == [0, 1, 2]
    assert not (out / "job" / "staging").exists() or not any((out / "job" / "staging").iterdir())
