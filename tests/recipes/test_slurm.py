"""The CPU rehearsal recipe on a real SLURM cluster: two node daemons on this machine.

The fixture starts munged, slurmctld and two slurmd (``node1``, ``node2``) from
the Debian packages (``scripts/setup_system.sh`` installs them) and stops them
however the tests end. ``sbatch -N 2`` then runs the recipe as on any cluster:
the batch script validates the layout, ``srun`` starts one task per node running
our torchrun, and the two pipeline stages sit on the two nodes.

Run them alone with ``bash scripts/test.sh -m slurm`` (as root; two to three minutes).
"""

from __future__ import annotations

import contextlib
import math
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TypeVar

import pytest

from megatron_ext.checkpoint.on_disk import read_tracker
from megatron_ext.config.exit_codes import ExitCode
from megatron_ext.training.resilience import STEP_DELAY_VARIABLE
from tests import waits
from tests.conftest import REPO, read_metrics, train_losses
from tests.recipes.slurm_cluster import SlurmCluster
from tests.recipes.test_recipes import recipe_env, run_recipe
from tests.waits import QUICK_S, READY_S, RUN_S, STOP_S

pytestmark = pytest.mark.slurm

RECIPE = REPO / "recipes" / "gpt_tiny_cpu_pp2_vp2.sh"
ITERS = 40
"""The recipe's default TRAIN_ITERS."""
STEP_DELAY_S = 0.5
"""The time-limit job's sleep before each step: most of a step's time, so that its ranks mostly wait."""

T = TypeVar("T")


@dataclass(frozen=True)
class Job:
    id: int
    run_dir: Path
    record: dict[str, str]
    """``scontrol show job`` once it ended."""

    @property
    def output(self) -> str:
        """The batch output, with the recipe's printed commands unwrapped (one line each)."""
        path = self.run_dir / f"slurm-{self.id}.out"
        text = path.read_text(errors="replace") if path.exists() else "(no batch output)"
        return text.replace(" \\\n    ", " ")

    def node_logs(self, attempt: int) -> dict[int, str]:
        """{node index in the job: its log} of one attempt (logs/<job>.<restart>/node<i>-<host>.log)."""
        logs = {}
        for path in (self.run_dir / "logs" / f"{self.id}.{attempt}").glob("node*.log"):
            logs[int(re.match(r"node(\d+)-", path.name).group(1))] = path.read_text(errors="replace")  # type: ignore[union-attr]
        return logs


def submit(cluster: SlurmCluster, run_dir: Path, *sbatch_args: str, **env: str) -> int:
    """``sbatch -N 2`` the rehearsal recipe from the repository root; the job id."""
    proc = subprocess.run(
        ["sbatch", "--parsable", "-N", "2", f"--output={run_dir}/slurm-%j.out", *sbatch_args, str(RECIPE)],
        capture_output=True,
        text=True,
        env=cluster.env(recipe_env(run_dir, RUN_DIR=str(run_dir), **env)),
        cwd=REPO,
        timeout=QUICK_S,
        check=True,
    )
    return int(proc.stdout.strip().split(";")[0])


@pytest.fixture(scope="module")
def plain_run(cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Job:
    """The recipe as shipped, ``sbatch -N 2``, run to the end."""
    run_dir = tmp_path_factory.mktemp("plain")
    job = submit(cluster, run_dir)
    return Job(job, run_dir, cluster.wait_for_job(job, timeout=RUN_S))


def test_rehearsal_recipe_trains_with_the_pipeline_across_two_nodes(plain_run: Job) -> None:
    out, record = plain_run.output, plain_run.record
    assert (record["JobState"], record["ExitCode"]) == ("COMPLETED", "0:0"), out
    assert (record["NumNodes"], record["NodeList"]) == ("2", "node[1-2]")

    # Validated for the job's real world size before launching: one process on each of two nodes.
    assert "world size: 2 = TP 1 × PP 2 × DP 1 × VP 2 (interleaved 1F1B)" in out
    assert "--nnodes 2 --nproc-per-node 1" in out
    # One torchrun per node: pipeline stage 0 (rank 0, which saves) on the job's first
    # node, the last stage (rank 1, which logs the loss) on its second.
    logs = plain_run.node_logs(0)
    assert sorted(logs) == [0, 1], logs
    assert "rank 0] saved checkpoint" in logs[0] and "rank 1]" not in logs[0]
    assert f"rank 1] iteration     {ITERS}/{ITERS}" in logs[1] and "rank 0]" not in logs[1]

    losses = train_losses(plain_run.run_dir / "metrics.jsonl")
    assert sorted(losses) == list(range(1, ITERS + 1))
    assert losses[ITERS] < losses[1] - 0.5, losses
    checkpoints = plain_run.run_dir / "checkpoints"
    assert read_tracker(checkpoints) == ITERS
    assert any((checkpoints / f"iter_{ITERS:07d}").glob("*.distcp"))
    # The job's log directory: the resolved command and the environment summary.
    attempt = plain_run.run_dir / "logs" / f"{plain_run.id}.0"
    assert "megatron_ext.cli.launch --node-rank" in (attempt / "command.sh").read_text()
    assert "SLURM_NNODES=2" in (attempt / "environment.txt").read_text()


def _next_time_limit_check(cluster: SlurmCluster) -> datetime:
    checks = waits.wait_for(
        "slurmctld to log a time-limit check",
        cluster.time_limit_checks,
        timeout=READY_S,
        every=0.5,
        state=cluster.diagnostics,
    )
    upcoming = checks[-1] + timedelta(seconds=30)
    while upcoming < datetime.now():
        upcoming += timedelta(seconds=30)
    return upcoming


def test_time_limit_signal_saves_requeues_and_resumes(cluster: SlurmCluster, plain_run: Job, tmp_path: Path) -> None:
    """``--time=1 --signal=USR1@10``: the training saves, exits 75, is requeued and finishes.

    slurmctld checks time limits every 30 s, and a check sends the signal once at
    most N + 30 s are left (up to 30 s early): with one minute and N = 10, the first
    check at least 20 s into the job. The test submits 9-18 s before a check, so the
    check ~10 s in does not fire and the one ~40 s in does, long after the training
    started; the limit itself is enforced 30 s later at the soonest. The training is
    sized from the plain run's fastest step to last at least 50 s after its start-up,
    so that it is still running when the signal comes (at most 48 s after submission).
    Each step sleeps ``STEP_DELAY_S`` first (``MEGATRON_EXT_STEP_DELAY_S``): the
    minute passes with the CPU left to the other tests, not spent on a few hundred more steps.
    """
    # The fastest steady-state step of the plain run: a busy machine may speed up meanwhile.
    steps = [r["elapsed_ms"] / 1e3 for r in read_metrics(plain_run.run_dir / "metrics.jsonl") if "lm_loss" in r]
    iters = min(4000, math.ceil(50 / (STEP_DELAY_S + min(steps[len(steps) // 2 :]))))
    until_check = (_next_time_limit_check(cluster) - datetime.now()).total_seconds()
    if not 9 <= until_check <= 18:
        time.sleep((until_check - 13) % 30)
    job = submit(
        cluster,
        tmp_path,
        "--time=1",
        "--signal=USR1@10",
        TRAIN_ITERS=str(iters),
        SAVE_INTERVAL="0",  # the only checkpoint before the end is the one the signal asks for
        EVAL_INTERVAL="0",
        EVAL_ITERS="0",
        **{STEP_DELAY_VARIABLE: str(STEP_DELAY_S)},
    )
    # The recipe answers exit code 75 with `scontrol requeue`: the job restarts.
    record = cluster.wait_for_job(
        job, timeout=READY_S, until=lambda r: r["Restarts"] != "0", what="its requeue after USR1 (Restarts != 0)"
    )
    if record["JobState"] == "COMPLETED":
        pytest.fail(f"all {iters} iterations ran before the signal came: this machine got much faster than it was")
    assert record["Restarts"] == "1", f"{record}\n{Job(job, tmp_path, record).output}"
    # The same one-minute limit would stop the next attempt 20-50 s in, and the next,
    # until done; one interruption is what is under test, so give it time to finish.
    cluster.run("scontrol", "update", f"JobId={job}", "TimeLimit=10")
    run = Job(job, tmp_path, cluster.wait_for_job(job, timeout=RUN_S))
    out = run.output
    assert (run.record["JobState"], run.record["ExitCode"], run.record["Restarts"]) == ("COMPLETED", "0:0", "1"), out

    # Attempt 0: USR1 arrived while training, every rank saved, exit 75, requeued.
    first = run.node_logs(0)
    stop = re.search(r"\[(\d\d:\d\d:\d\d) rank 1\] stopping early at iteration (\d+): received SIGUSR1", first[1])
    assert stop is not None, first
    stopped_at = int(stop.group(2))
    assert 0 < stopped_at < iters
    assert f"rank 0] saved checkpoint {tmp_path}/checkpoints/iter_{stopped_at:07d}" in first[0]
    assert f"training exited with {ExitCode.SAVED_AND_STOPPED}" in out
    assert f"job {job} requeued" in out
    environment = (tmp_path / "logs" / f"{job}.0" / "environment.txt").read_text()
    started = datetime.fromisoformat(re.search(r"^date: (\S+)", environment, re.M).group(1)).replace(tzinfo=None)  # type: ignore[union-attr]
    stopped = datetime.combine(started.date(), datetime.strptime(stop.group(1), "%H:%M:%S").time())
    sent = [c for c in cluster.time_limit_checks() if started < c <= stopped + timedelta(seconds=1)]
    print(
        f"\n--time=1 --signal=USR1@10: batch script started {started:%H:%M:%S}, time-limit check at "
        f"{', '.join(f'{c:%H:%M:%S}' for c in sent)}, training stopped at {stopped:%H:%M:%S} "
        f"(iteration {stopped_at} of {iters})"
    )

    # Attempt 1 resumed from that checkpoint: each iteration trained exactly once, the loss continuing.
    assert f"restart 1 of job {job}: resuming from iteration {stopped_at}" in out
    iterations = [r["iteration"] for r in read_metrics(tmp_path / "metrics.jsonl") if "lm_loss" in r]
    assert iterations == list(range(1, iters + 1)), (stopped_at, iterations[:3], iterations[-3:])
    losses = train_losses(tmp_path / "metrics.jsonl")
    before = [losses[i] for i in range(max(1, stopped_at - 4), stopped_at + 1)]
    assert min(before) - 0.5 < losses[stopped_at + 1] < max(before) + 0.5, (before, losses[stopped_at + 1])
    assert losses[stopped_at + 1] < losses[1] - 0.5, "the resumed attempt started from scratch"
    assert read_tracker(tmp_path / "checkpoints") == iters


def test_one_task_per_gpu_launcher(cluster: SlurmCluster, tmp_path: Path) -> None:
    """``LAUNCHER=srun``: srun starts every rank itself (two per node, PP 2 × DP 2), no torchrun.

    Submitted as a site would for this launcher (``--ntasks-per-node=2``); the
    step must get 2 tasks on each node whatever task count sbatch exported.
    """
    job = submit(
        cluster, tmp_path, "--ntasks-per-node=2", LAUNCHER="srun", GPUS_PER_NODE="2", TRAIN_ITERS="6", EVAL_ITERS="0"
    )
    run = Job(job, tmp_path, cluster.wait_for_job(job, timeout=RUN_S))
    assert (run.record["JobState"], run.record["ExitCode"]) == ("COMPLETED", "0:0"), run.output
    assert "RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS" in run.output
    assert "--ntasks 4 --ntasks-per-node 2" in run.output
    assert "megatron_ext.cli.launch" not in (tmp_path / "logs" / f"{job}.0" / "command.sh").read_text()
    logs = run.node_logs(0)
    # Ranks 0-1 (pipeline stage 0) on the first node, 2-3 (stage 1, the logging rank 3) on the second.
    assert "rank 0] saved checkpoint" in logs[0] and "rank 3] iteration      6/6" in logs[1]
    assert "world size: 4 = TP 1 × PP 2 × DP 2" in logs[0]
    assert [r["iteration"] for r in read_metrics(tmp_path / "metrics.jsonl") if "lm_loss" in r] == list(range(1, 7))


def _kill_tasks_on(node: str, job: int) -> int:
    """SIGKILL every task process of ``job`` on ``node``, as if the node died; how many were killed.

    The two slurmd share this machine, so the node's tasks are found by the environment srun gave them.
    """
    import psutil

    killed = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            env = proc.environ()
            if env.get("SLURMD_NODENAME") == node and env.get("SLURM_JOB_ID") == str(job):
                proc.kill()
                killed.append(proc)
    psutil.wait_procs(killed, timeout=STOP_S)
    return len(killed)


def _wait_for[T](what: str, check: Callable[[], T], cluster: SlurmCluster, timeout: float) -> T:
    return waits.wait_for(
        what, check, timeout=timeout, every=0.3, check=cluster.assert_daemons_alive, state=cluster.diagnostics
    )


def _loss_records(path: Path) -> list[dict]:
    return [r for r in read_metrics(path) if "lm_loss" in r] if path.exists() else []


def test_elastic_job_shrinks_when_a_node_fails_and_grows_back(cluster: SlurmCluster, tmp_path: Path) -> None:
    """``ELASTIC=1``, ``sbatch --nodes=1-2``: node 2's tasks die, the job comes back on node 1 re-planned, then
    grows back to two nodes at its next requeue, and every iteration reaches the final checkpoint once.

    Attempt 0 runs the recipe's layout (PP 2 × VP 2 across the nodes) until its first save, when node 2's
    tasks are killed. srun names the failed task, the recipe requeues the job without node 2, and attempt 1
    runs on node 1 alone as PP 1, resuming from that checkpoint; its losses equal those of the same recipe
    run outside SLURM from a copy of the checkpoint. USR1 then stops attempt 1 with a save; the requeue
    gives node 2 back, and attempt 2 returns to the recipe's layout and finishes.
    """
    iters = 40
    run_dir = tmp_path / "job"
    run_dir.mkdir()
    settings = {
        "ELASTIC": "1",
        "MIN_NODES": "1",
        "DISTRIBUTED_OPTIMIZER": "1",  # saved fully reshardable: the only way PP 2 -> 1 can load it
        "TRAIN_ITERS": str(iters),
        "SAVE_INTERVAL": "10",
        "EVAL_INTERVAL": "0",
        "EVAL_ITERS": "0",
        "FAILURE_WAIT": "20",
    }
    job = submit(cluster, run_dir, "--nodes=1-2", **settings)
    checkpoints, metrics = run_dir / "checkpoints", run_dir / "metrics.jsonl"

    # Attempt 0: two nodes; node 2 "dies" right after the first save.
    _wait_for("the first save", lambda: (read_tracker(checkpoints) or 0) >= 10, cluster, timeout=READY_S)
    assert _kill_tasks_on("node2", job) > 0
    record = cluster.wait_for_job(
        job,
        timeout=READY_S,
        until=lambda r: r["Restarts"] == "1" and r["JobState"] == "RUNNING",
        what="its restart without node 2 (Restarts=1, RUNNING)",
    )
    assert record["NodeList"] == "node1" and record["ExcNodeList"] == "node2", record
    resumed = read_tracker(checkpoints)
    assert resumed is not None and resumed >= 10

    # Attempt 1: node 1 alone. Stop it with a save once it has trained a few iterations past its checkpoint.
    first = len(_loss_records(metrics))  # attempt 0's records; attempt 1 is still starting up
    _wait_for(
        "attempt 1 training",
        lambda: any(r["iteration"] >= resumed + 3 for r in _loss_records(metrics)[first:]),
        cluster,
        timeout=READY_S,
    )
    cluster.run("scancel", "--signal=USR1", str(job))
    run = Job(job, run_dir, cluster.wait_for_job(job, timeout=RUN_S))
    out = run.output
    assert (run.record["JobState"], run.record["ExitCode"], run.record["Restarts"]) == ("COMPLETED", "0:0", "2"), out
    assert run.record["NodeList"] == "node[1-2]" and run.record["ExcNodeList"] == "(null)", run.record

    # The failure: srun named node 2's task, the job was requeued without node 2.
    assert "srun --nodes 2 --kill-on-bad-exit=0 --wait 20 " in out  # FAILURE_WAIT bounds the survivors' wait
    assert re.search(r"srun: error: node2: task 1: Killed", out), out
    assert "training failed (exit " in out and f"first on node2: job {job} requeued without node2" in out

    # Attempt 1 ran PP 1 on one node from the checkpoint, and stopped with a save at `stopped`.
    attempt1 = (run_dir / "logs" / f"{job}.1" / "command.sh").read_text()
    assert "--pipeline-model-parallel-size 1" in attempt1 and "--nnodes 1" in attempt1
    stopped = int(re.search(r"stopping early at iteration (\d+)", run.node_logs(1)[0]).group(1))  # type: ignore[union-attr]
    events = [r for r in read_metrics(metrics) if r.get("event") == "relayout"]
    assert [
        (e["iteration"], e["old"]["pp"], e["new"]["pp"], e["old"]["world_size"], e["new"]["world_size"]) for e in events
    ] == [
        (resumed, 2, 1, 2, 1),
        (stopped, 1, 2, 1, 2),
    ], events
    assert events[1]["old"]["vp"] == 1 and events[1]["new"]["vp"] == 2

    # Every iteration trained once into the lineage of the final checkpoint: attempt 0 up to `resumed`
    # (its later iterations died with node 2), attempt 1 from resumed + 1 to stopped, attempt 2 the rest.
    records = _loss_records(metrics)
    iterations = [r["iteration"] for r in records]
    assert iterations[first] == resumed + 1, (first, iterations)
    assert iterations[: iterations.index(resumed) + 1] + iterations[first:] == list(range(1, iters + 1)), iterations
    assert read_tracker(checkpoints) == iters

    # Attempt 1's losses equal an uninterrupted run of the re-planned layout from the same checkpoint: the
    # recipe outside SLURM (torchrun on this machine) on one process, from a copy of it, to the same iteration.
    reference = tmp_path / "reference"
    shutil.copytree(checkpoints / f"iter_{resumed:07d}", reference / "checkpoints" / f"iter_{resumed:07d}")
    (reference / "checkpoints" / "latest_checkpointed_iteration.txt").write_text(f"{resumed}\n")
    env = recipe_env(reference, RUN_DIR=str(reference), NNODES="1", GPUS_PER_NODE="1", **settings)
    too_few = run_recipe(RECIPE, env | {"MIN_NODES": "2"})
    assert too_few.returncode == ExitCode.INVALID
    assert "1 nodes is fewer than MIN_NODES=2: submit with sbatch --nodes=2-2" in too_few.stderr
    proc = run_recipe(RECIPE, env | {"EXTRA_ARGS": f"--exit-interval {stopped}"}, timeout=RUN_S)
    assert proc.returncode == ExitCode.SAVED_AND_STOPPED, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"[elastic] checkpoint of iteration {resumed}: TP 1 PP 2 VP 2 DP 1, micro-batch 2 (2 GPUs)" in proc.stderr
    assert "[elastic] changed: GPUs 2 -> 1, PP 2 -> 1, VP 2 -> 1" in proc.stderr
    assert "outside SLURM this machine runs" in proc.stdout and "--pipeline-model-parallel-size 1 " in proc.stdout
    assert "stopped early with a checkpoint: run the same command again to continue" in proc.stdout
    assert read_tracker(reference / "checkpoints") == stopped
    expected = train_losses(reference / "metrics.jsonl")
    got = {r["iteration"]: r["lm_loss"] for r in records[first:] if r["iteration"] <= stopped}
    assert sorted(got) == sorted(expected) == list(range(resumed + 1, stopped + 1))
    for iteration, loss in expected.items():
        assert got[iteration] == pytest.approx(loss, rel=1e-5), (iteration, got[iteration], loss)
    [event] = [r for r in read_metrics(reference / "metrics.jsonl") if r.get("event") == "relayout"]
    assert event["iteration"] == resumed and event["new"]["world_size"] == 1
