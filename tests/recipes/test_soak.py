"""Unattended recovery on the real SLURM cluster of the tests: one training job, hit at random moments by the
faults a cluster deals out, reaches its last iteration with no human action, and its final checkpoint equals
that of an uninterrupted run bit for bit.

The faults, in a shuffled cycle so that each kind comes up:

* ``kill-9``: SIGKILL of one training rank, as a crashed process or a lost GPU;
* ``sigterm``: ``scancel --signal=TERM`` of the job's step, as a preemption (the ranks save and exit 75);
* ``disk-full``: another job's file fills the checkpoint filesystem (a tmpfs) during the run, and is removed
  once a save has failed (or the attempt ended);
* ``damaged``: the ranks are stopped, one file of the newest checkpoint is corrupted, then they are killed, so
  that the next attempt must fall back to the checkpoint before it.

The recipe requeues after a stop with a checkpoint (75) and after a failure (``MAX_FAILED_RESTARTS``). The
short version runs in the default suite; ``-m soak`` runs twelve faults and prints what it recorded
(``docs/checkpoints.md``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import torch

from megatron_ext.checkpoint.on_disk import checkpoint_dir, complete_iterations, read_tracker
from tests import waits
from tests.conftest import read_metrics
from tests.filesystems import small_filesystem
from tests.recipes.slurm_cluster import SlurmCluster
from tests.recipes.test_slurm import Job, submit
from tests.waits import READY_S, RUN_S, STOP_S

pytestmark = pytest.mark.slurm

FAULTS = ("kill-9", "sigterm", "disk-full", "damaged")
SETTINGS = {
    "SAVE_INTERVAL": "2",
    "EVAL_INTERVAL": "0",
    "EVAL_ITERS": "0",
    "EXTRA_ARGS": "--keep-last-checkpoints 3",
    "MAX_FAILED_RESTARTS": "5",
}
"""The recipe's settings for the soak and its reference (saving and pruning do not change the numbers)."""


def _job_processes(job: int) -> list:
    """The job's training ranks: the pretrain_gpt.py processes our launcher started for the job (their forked
    helpers share their command line)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            command = process.info["cmdline"] or []
            parent = process.parent()
            launched = parent is not None and parent.cmdline()[1:3] == ["-m", "megatron_ext.cli.launch"]
            script = any(arg.endswith("pretrain_gpt.py") for arg in command[:3])
            if launched and script and process.environ().get("SLURM_JOB_ID") == str(job):
                found.append(process)
    return found


def _losses(run_dir: Path) -> list[int]:
    """The iterations of every loss the job logged, in order (each attempt appends)."""
    path = run_dir / "metrics.jsonl"
    return [r["iteration"] for r in read_metrics(path) if "lm_loss" in r] if path.exists() else []


def _iteration(run_dir: Path) -> int:
    """The iteration the job last logged a loss for (0: none yet)."""
    return (_losses(run_dir) or [0])[-1]


def _final_state(checkpoint: Path, scratch: Path) -> dict[str, torch.Tensor]:
    """Every tensor of one checkpoint (model, optimizer), read without a process group."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = scratch / f"{checkpoint.parent.parent.name}-{checkpoint.name}.pt"
    dcp_to_torch_save(str(checkpoint), str(out))
    state = torch.load(out, weights_only=False)  # written just now by torch itself from the checkpoint
    return {key: value for key, value in state.items() if isinstance(value, torch.Tensor)}


@dataclass
class Soak:
    job: int
    run_dir: Path
    checkpoints: Path
    faults: list[tuple[str, int]]
    """(fault, the iteration last logged when it was dealt)."""
    seconds: float


def _soak(cluster: SlurmCluster, run_dir: Path, fs: Path, *, faults: int, iters: int, seed: int) -> Soak:
    rng = random.Random(seed)
    run_dir.mkdir()
    checkpoints = fs / "checkpoints"
    started = time.monotonic()
    job = submit(cluster, run_dir, TRAIN_ITERS=str(iters), CHECKPOINT_DIR=str(checkpoints), **SETTINGS)
    order: list[str] = []
    dealt: list[tuple[str, int]] = []
    while len(dealt) < faults:
        if not order:
            order = rng.sample(FAULTS, len(FAULTS))
        fault = order.pop()
        # Fault k when the job reaches its share of the iterations: spread over the run, whatever the speed.
        target = iters * (len(dealt) + 1) // (faults + 2)
        logged = len(_losses(run_dir))

        def training(target: int = target, fault: str = fault, logged: int = logged) -> bool:
            record = cluster.job(job)
            if record.get("JobState") == "COMPLETED":
                pytest.fail(f"the job finished after {len(dealt)} of {faults} faults")
            # Training in this attempt (a loss logged since the last fault), past the target.
            losses = _losses(run_dir)
            running = record.get("JobState") == "RUNNING" and len(losses) > logged and losses[-1] >= target
            # A damaged latest checkpoint needs an earlier one to fall back to (with none, the job stops: exit 3).
            enough = fault != "damaged" or len(complete_iterations(checkpoints)) >= 2
            return running and enough and bool(_job_processes(job))

        waits.wait_for(f"the job to reach iteration {target} before fault {len(dealt) + 1} ({fault})", training,
                       timeout=READY_S, every=0.1, check=cluster.assert_daemons_alive, state=cluster.diagnostics)  # fmt: skip
        time.sleep(rng.uniform(0.0, 0.3))
        restarts = int(cluster.job(job)["Restarts"])
        dealt.append((fault, _iteration(run_dir)))
        if fault == "sigterm":
            cluster.run("scancel", "--signal=TERM", str(job))
        elif fault == "disk-full":
            _fill_until_a_save_fails(cluster, job, run_dir, fs, restarts)
            continue
        else:
            victims = _job_processes(job)
            if fault == "damaged":
                # The ranks (and their savers) stopped first: a save published while the file is corrupted would
                # leave the damaged checkpoint behind a newer one, and nothing would need to fall back.
                for process in victims:
                    with contextlib.suppress(psutil.Error):
                        process.suspend()
                latest = read_tracker(checkpoints)
                if latest is not None:
                    for shard in sorted(checkpoint_dir(checkpoints, latest).glob("*.distcp"))[:1]:
                        data = bytearray(shard.read_bytes())
                        data[len(data) // 2] ^= 0xFF
                        shard.write_bytes(bytes(data))
                for process in victims:  # all of them: a stopped rank would not notice its peer's death
                    with contextlib.suppress(psutil.Error):
                        process.kill()
            elif victims:
                rng.choice(victims).kill()
        cluster.wait_for_job(job, timeout=READY_S, until=lambda r, n=restarts: int(r["Restarts"]) > n,
                             what=f"its requeue after {fault}")  # fmt: skip
    record = cluster.wait_for_job(job, timeout=RUN_S)
    output = Job(job, run_dir, record).output
    assert (record["JobState"], record["ExitCode"]) == ("COMPLETED", "0:0"), output[-4000:]
    return Soak(job, run_dir, checkpoints, dealt, time.monotonic() - started)


def _fill_until_a_save_fails(cluster: SlurmCluster, job: int, run_dir: Path, fs: Path, restarts: int) -> None:
    """Another job's file takes all the room left on the checkpoint filesystem until a save has failed on it (or
    the attempt ended, or 30 s passed), then is removed."""
    failed_saves = _failed_saves(run_dir)
    ballast = fs / "another-jobs-file"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while os.write(fd, b"\0" * (1 << 20)):  # until the filesystem is full (a save may be writing too)
            pass
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
    finally:
        os.close(fd)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if _failed_saves(run_dir) > failed_saves or int(cluster.job(job)["Restarts"]) > restarts:
                return
            time.sleep(0.2)
    finally:
        ballast.unlink()


def _failed_saves(run_dir: Path) -> int:
    return sum(
        log.read_text(errors="replace").count("periodic save failed") for log in run_dir.glob("logs/*/node*.log")
    )


def _check(soak: Soak, reference: Path, iters: int, scratch: Path) -> None:
    """Every iteration trained, the final checkpoint the reference's bit for bit."""
    assert read_tracker(soak.checkpoints) == iters
    iterations = {r["iteration"] for r in read_metrics(soak.run_dir / "metrics.jsonl") if "lm_loss" in r}
    assert iterations == set(range(1, iters + 1))
    mine = _final_state(checkpoint_dir(soak.checkpoints, iters), scratch)
    theirs = _final_state(checkpoint_dir(reference, iters), scratch)
    assert sorted(mine) == sorted(theirs)
    different = [key for key in mine if not torch.equal(mine[key], theirs[key])]
    assert not different, f"{len(different)} tensors differ from the uninterrupted run's: {different[:5]}"
    kinds = {fault for fault, _ in soak.faults}
    records = read_metrics(soak.run_dir / "metrics.jsonl")
    fell_back = [r["checkpoint_skipped"] for r in records if "checkpoint_skipped" in r]
    # A damaged latest checkpoint, then a killed rank: the next attempt passed over it.
    assert ("damaged" in kinds) <= bool(fell_back), "no resume fell back from the damaged checkpoint"
    print(
        f"\nsoak: job {soak.job}, {len(soak.faults)} faults ({', '.join(f for f, _ in soak.faults)}), "
        f"{soak.seconds:.0f} s, no intervention, final checkpoint equal to the uninterrupted run's "
        f"({len(mine)} tensors); resumes that fell back from a damaged checkpoint: {len(fell_back)}"
    )


def _reference(cluster: SlurmCluster, run_dir: Path, iters: int) -> Path:
    """The same job, uninterrupted, saving only at its end (saves do not change the numbers: the comparison
    checks that too)."""
    run_dir.mkdir()
    job = submit(cluster, run_dir, TRAIN_ITERS=str(iters), **(SETTINGS | {"SAVE_INTERVAL": str(iters)}))
    record = cluster.wait_for_job(job, timeout=RUN_S)
    assert (record["JobState"], record["ExitCode"]) == ("COMPLETED", "0:0"), Job(job, run_dir, record).output
    return run_dir / "checkpoints"


def _run(cluster: SlurmCluster, tmp_path: Path, *, faults: int, iters: int, seed: int) -> None:
    reference = _reference(cluster, tmp_path / "reference", iters)
    with small_filesystem(tmp_path / "fs", size_kib=32 * 1024) as fs:
        soak = _soak(cluster, tmp_path / "soak", fs, faults=faults, iters=iters, seed=seed)
        _check(soak, reference, iters, tmp_path)
    waits.wait_for("the soak's processes to end", lambda: not _job_processes(soak.job), timeout=STOP_S)


def test_a_job_hit_by_four_kinds_of_fault_finishes_with_the_uninterrupted_weights(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    """The short version: one fault of each kind, at iterations 20, 40, 60 and 80 of 120 (each attempt restarts
    the ranks, whose start-up is most of the soak's time; the twelve-fault soak has room to spare)."""
    _run(cluster, tmp_path, faults=len(FAULTS), iters=120, seed=43)


@pytest.mark.soak
def test_soak_twelve_faults(cluster: SlurmCluster, tmp_path: Path) -> None:
    _run(cluster, tmp_path, faults=12, iters=600, seed=2026)
