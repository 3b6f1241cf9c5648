"""recipes/preprocess_corpus.sh on the SLURM cluster (two node daemons on this machine): 8 input files of mixed
formats over an array of 4 tasks on 2 nodes.

One task is stopped mid-run by SLURM's time-limit warning (USR1): it keeps nothing, is requeued and finishes.
Another fails on a bad line: the last step runs after the array and names it, and once the line is fixed,
submitting again runs that task alone and then the last step. Merged in input order the output is one tools/preprocess_data.py run's, byte for
byte, and the CPU rehearsal recipe trains on the blend file.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from megatron_ext.data.preprocess_job import load_plan
from tests import waits
from tests.conftest import REPO, train_losses
from tests.data.helpers import preprocess, same_files, shared_data, write_as
from tests.recipes.slurm_cluster import FINAL_STATES, SlurmCluster
from tests.recipes.test_recipes import recipe_env, run_recipe
from tests.waits import RUN_S

pytestmark = pytest.mark.slurm

RECIPE = REPO / "recipes" / "preprocess_corpus.sh"
FORMATS = ("jsonl", "jsonl.gz", "parquet", "jsonl.zst", "jsonl", "arrow", "jsonl.gz", "jsonl")
BAD = "part-4.jsonl"
BIG = "part-7.jsonl"
BROKEN, FIXED = '{"text": broken  }', '{"text": "fixed!"}'


def corpus(shared: dict[str, Path], root: Path) -> list[Path]:
    """8 files in two directories; the last is big enough (about 40 MB) to be stopped mid-run, part-4 has a line
    that is not JSON (fixed later with one of the same length)."""
    lines = shared["corpus"].read_text(encoding="utf-8").splitlines()
    per = len(lines) // 7
    files = []
    for i, fmt in enumerate(FORMATS):
        part = lines[i * per : (i + 1) * per] if i < 7 else lines * 40
        if f"part-{i}.{fmt}" == BAD:
            part = [*part[:5], BROKEN, *part[5:]]
        directory = root / ("a" if i < 4 else "b")
        directory.mkdir(parents=True, exist_ok=True)
        files.append(write_as(part, directory / f"part-{i}.{fmt}", fmt))
    return files


def element(cluster: SlurmCluster, job: str) -> dict[str, str]:
    """``scontrol show job`` of one job or array element (``ARRAY_TASK``)."""
    out = cluster.run("scontrol", "-o", "show", "job", job).stdout.splitlines()[0]
    return dict(m.groups() for m in re.finditer(r"(\w+(?::\w+)?)=(\S*)", out))


def wait_element(
    cluster: SlurmCluster, job: str, done: Callable[[dict[str, str]], bool] | None = None
) -> dict[str, str]:
    """``element`` once the job has ended (or ``done`` holds)."""

    def ended() -> dict[str, str] | None:
        record = element(cluster, job)
        return record if record.get("JobState") in FINAL_STATES or (done is not None and done(record)) else None

    return waits.wait_for(f"job {job} to end", ended, timeout=RUN_S, every=0.3, state=cluster.diagnostics)


def submit(cluster: SlurmCluster, env: dict[str, str]) -> tuple[str | None, str]:
    """Run the recipe on the 'login node'; the array job's id (None when no task is left) and the last step's."""
    proc = run_recipe(RECIPE, cluster.env(env))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    array = re.search(r"array job (\d+): tasks ([\d,]+)", proc.stdout)
    last = re.search(r"last step: job (\d+)", proc.stdout)
    assert last, proc.stdout
    return (array.group(1) if array else None), last.group(1)


def test_array_job_preprocesses_reruns_what_failed_and_trains(
    cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    shared = shared_data(tmp_path_factory)
    files = corpus(shared, tmp_path / "in")
    out = tmp_path / "out"
    args = f"--tokenizer-type GPTSentencePieceTokenizer --tokenizer-model {shared['model']} --append-eod --workers 1"
    env = recipe_env(tmp_path, INPUT=f"{tmp_path}/in/*/part-*", OUTPUT=str(out), TASKS="4", MERGE="1",
                     PREPROCESS_ARGS=args, SUBMIT_ARGS=f"-p test --chdir={tmp_path}", TASK_CPUS="1")  # fmt: skip

    dry = run_recipe(RECIPE, cluster.env(env | {"DRY_RUN": "1"}))
    assert dry.returncode == 0 and "8 files" in dry.stderr and "--array=0,1,2,3 " in dry.stdout, dry.stdout + dry.stderr
    assert "--cpus-per-task=1" in dry.stdout and "--dependency=afterany:" in dry.stdout, dry.stdout
    assert not out.exists()

    array, last = submit(cluster, env)
    plan = load_plan(out)
    big = next(f.task for f in plan.files if f.path.endswith(BIG))
    bad = next(f.task for f in plan.files if f.path.endswith(BAD))
    assert plan.tasks == 4 and big != bad and [f.path for f in plan.files] == [str(f) for f in files]

    # SLURM's warning before a time limit (--signal=B:USR1@300), sent once the big task is preprocessing.
    staging = out / "job" / "staging"
    waits.wait_for(
        "the big task to start", lambda: next(staging.glob(f"task-{big}.*"), None), timeout=RUN_S, every=0.05
    )
    time.sleep(0.5)  # its tokenizer loaded and reading: about 5 s of work left
    cluster.run("scancel", "--signal=USR1", "--batch", f"{array}_{big}")
    wait_element(cluster, f"{array}_{big}", done=lambda r: r.get("Restarts") not in (None, "0"))
    final = wait_element(cluster, f"{array}_{big}")
    assert (final["JobState"], int(final["Restarts"])) == ("COMPLETED", 1), final
    log = next((out / "job" / "logs").glob(f"task-{big}.*.out")).read_text()
    assert "stopped before its end: requeued" in log, log

    failed = wait_element(cluster, f"{array}_{bad}")
    assert failed["JobState"] == "FAILED", failed
    assert not (out / "datasets" / f"task-{bad}").exists() and not (out / "job" / "done" / f"task-{bad}.json").exists()
    for task in range(plan.tasks):
        wait_element(cluster, f"{array}_{task}")
    # The last step runs after the array whatever became of it (afterany), and names what is missing.
    assert wait_element(cluster, last)["JobState"] == "FAILED"
    missing = next((out / "job" / "logs").glob(f"finish.{last}.out")).read_text()
    assert f"tasks {bad} of {out} have not finished" in missing, missing

    # The line fixed (same size: the plan holds each file's bytes), submitted again: that task alone, then the end.
    bad_file = next(f for f in files if f.name == BAD)
    bad_file.write_bytes(bad_file.read_bytes().replace(BROKEN.encode(), FIXED.encode()))
    array, last = submit(cluster, env)
    assert array is not None
    assert element(cluster, array).get("ArrayTaskId") == str(bad), element(cluster, array)
    finished = wait_element(cluster, last)
    assert finished["JobState"] == "COMPLETED", (finished, list((out / "job" / "logs").glob("finish.*")))
    summary = next((out / "job" / "logs").glob(f"finish.{last}.out")).read_text()
    assert "text: 8 datasets verified" in summary, summary

    # Merged in input order: one preprocess_data.py run over the same files, byte for byte.
    preprocess([str(f) for f in files], tmp_path / "single", shared["model"], "--append-eod", "--workers", "1")
    assert same_files(out / "corpus_text_document", tmp_path / "single_text_document")

    # The CPU rehearsal recipe trains on the blend file (one machine, two processes: PP 2).
    train = recipe_env(tmp_path, NNODES="1", GPUS_PER_NODE="2", DATA_ARGS_PATH=str(out / "blend_text.txt"),
                       TOKENIZER_MODEL=str(shared["model"]), DATA_SPLIT="90,5,5", TRAIN_ITERS="6", SAVE_INTERVAL="0",
                       EVAL_INTERVAL="6", EVAL_ITERS="1", DATA_CACHE_PATH=str(tmp_path / "cache"))  # fmt: skip
    proc = run_recipe(REPO / "recipes" / "gpt_tiny_cpu_pp2_vp2.sh", train, timeout=RUN_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "--data-args-path" in proc.stdout
    losses = train_losses(tmp_path / "run" / "metrics.jsonl")
    assert sorted(losses) == [1, 2, 3, 4, 5, 6] and all(v == v for v in losses.values()), losses
