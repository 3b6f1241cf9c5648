"""Stopping and resuming on a shared cluster: signals, time limits, kill -9,
damaged checkpoints, pruning, repeated non-finite losses.

The resumed runs must reproduce the uninterrupted run bit for bit: fp32 on
CPU, dropout on (so the per-rank RNG states must come back exactly), PP2×VP2.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from megatron_ext.checkpoint.on_disk import (
    CHECKSUMS_FILENAME,
    SAVING_FILENAME,
    TRACKER_FILENAME,
    is_complete,
    read_tracker,
)
from megatron_ext.config.exit_codes import ExitCode
from tests import waits
from tests.conftest import REPO, TINY_MODEL, _env, launch_command, read_metrics, run_pretrain, train_losses
from tests.training.conftest import ITERS, RUN, copy_of, saved_run
from tests.waits import READY_S, STOP_S

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    metrics = tmp_path_factory.mktemp("uninterrupted") / "m.jsonl"
    run_pretrain([*RUN, "--metrics-file", str(metrics)], nproc=2)
    losses = train_losses(metrics)
    assert sorted(losses) == list(range(1, ITERS + 1))
    return losses


def _resume_and_compare(save: Path, metrics: Path, uninterrupted: dict[int, float]) -> int:
    stopped_at = read_tracker(save)
    assert stopped_at is not None and 0 < stopped_at < ITERS
    run_pretrain([*RUN, "--load", str(save), "--save", str(save), "--metrics-file", str(metrics)], nproc=2)
    resumed = {it: loss for it, loss in train_losses(metrics).items() if it > stopped_at}
    assert sorted(resumed) == list(range(stopped_at + 1, ITERS + 1))
    for it, loss in resumed.items():
        assert loss == uninterrupted[it], f"iteration {it}: resumed {loss!r} != uninterrupted {uninterrupted[it]!r}"
    return stopped_at


def test_exit_interval_then_resume_is_exact(tmp_path: Path, uninterrupted: dict[int, float]) -> None:
    """--exit-interval with asynchronous periodic saves; the synchronous save at exit and its resume are the
    signal tests' and the SLURM requeue and elastic tests'. With Megatron-LM's
    manual garbage collection (--manual-gc): the losses still equal the run without it."""
    save, metrics = tmp_path / "ckpt", tmp_path / "m.jsonl"
    extra = ["--async-save", "--save-interval", "2", "--manual-gc", "--manual-gc-interval", "3"]
    run_pretrain(
        [*RUN, *extra, "--save", str(save), "--exit-interval", "7", "--metrics-file", str(metrics)],
        nproc=2,
        expect=ExitCode.SAVED_AND_STOPPED,
    )
    assert _resume_and_compare(save, metrics, uninterrupted) == 7


def test_exit_duration_saves_and_stops_after_the_first_iteration(tmp_path: Path) -> None:
    """--exit-duration-in-mins 0: stopped after the first iteration with a synchronous save. Resuming from such
    a save is exact: the signal tests and the SLURM requeue test resume from the same kind of save."""
    save, metrics = tmp_path / "ckpt", tmp_path / "m.jsonl"
    run_pretrain(
        [*RUN, "--save", str(save), "--exit-duration-in-mins", "0", "--metrics-file", str(metrics)],
        nproc=2,
        expect=ExitCode.SAVED_AND_STOPPED,
    )
    assert read_tracker(save) == 1
    assert [r["iteration"] for r in read_metrics(metrics) if "lm_loss" in r] == [1]


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            launch_command(args, nproc=2),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_env(),
            cwd=REPO,
            start_new_session=True,
        )


def _wait_for(what: str, predicate, proc: subprocess.Popen[bytes], log: Path) -> None:
    def running() -> None:
        assert proc.poll() is None, "the run ended before the test could interrupt it"

    waits.wait_for(
        what, predicate, timeout=READY_S, every=0.02, check=running, state=lambda: f"--- {log} ---\n{waits.tail(log)}"
    )


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_signal_saves_stops_and_resumes_exactly(
    sig: signal.Signals, tmp_path: Path, uninterrupted: dict[int, float]
) -> None:
    save, metrics = tmp_path / "ckpt", tmp_path / "m.jsonl"
    # SIGUSR1 with a data-loader worker: the launcher forwards the signal to it too
    # (see test_data_loader_signals.py), and resuming must stay exact with workers.
    workers = ["--num-workers", "1"] if sig == signal.SIGUSR1 else []
    log = tmp_path / "log"
    proc = _start([*RUN, *workers, "--save", str(save), "--exit-signal-handler", "--metrics-file", str(metrics)], log)
    after = random.Random(sig).randint(2, 8)
    _wait_for(f"{after} metrics records", lambda: metrics.exists() and len(read_metrics(metrics)) >= after, proc, log)
    os.kill(proc.pid, sig)  # the launcher: torchrun forwards SIGTERM, ours forwards SIGUSR1
    if sig == signal.SIGUSR1:
        # A second signal while the checkpoint is being written must not disturb it.
        _wait_for("a checkpoint directory (the save under way)", lambda: any(save.glob("iter_*")), proc, log)
        os.kill(proc.pid, sig)
    # SIGUSR1: the launcher waits for the workers' save and keeps their code. SIGTERM:
    # torchrun shuts down (the workers save within its grace) and the launcher exits 128 + 15.
    expected = ExitCode.SAVED_AND_STOPPED if sig == signal.SIGUSR1 else 128 + signal.SIGTERM
    code = waits.wait_exit(proc, f"the run to stop on {sig.name}", timeout=READY_S, log=log)
    assert code == expected, log.read_text()[-3000:]
    stopped_at = _resume_and_compare(save, metrics, uninterrupted)
    assert stopped_at >= after


def _kill_9_everything(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the launcher and every worker at once, as a node failure would.

    torchrun starts each worker in a session of its own, so killing the
    launcher's process group would leave the workers running (and saving).
    """
    import psutil

    tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    proc.wait(timeout=STOP_S)
    _, alive = psutil.wait_procs(tree, timeout=STOP_S)
    assert not alive, f"still running after SIGKILL: {alive}"


def test_kill_9_during_saves_leaves_a_loadable_checkpoint(tmp_path: Path, uninterrupted: dict[int, float]) -> None:
    save, metrics = tmp_path / "ckpt", tmp_path / "m.jsonl"
    log = tmp_path / "log"
    proc = _start([*RUN, "--save", str(save), "--save-interval", "1", "--metrics-file", str(metrics)], log)
    # Saving every iteration, the run spends most of its time inside a save.
    _wait_for("the third save", lambda: (read_tracker(save) or 0) >= 3, proc, log)
    time.sleep(random.Random(9).uniform(0.0, 0.5))
    _kill_9_everything(proc)
    latest = read_tracker(save)
    assert latest is not None
    # The kill may land anywhere: inside a save (an unfinished directory with its in-progress
    # marker), or between a save's manifest and its tracker update (the marker is still
    # there: a save is published by the tracker, then loses its marker). Also leave a save
    # that certainly did not finish, as a killed one does.
    partial = save / f"iter_{latest + 1:07d}"
    if not partial.exists():
        shutil.copytree(save / f"iter_{latest:07d}", partial)
        (partial / CHECKSUMS_FILENAME).unlink()  # a killed save never wrote its manifest
        (partial / SAVING_FILENAME).write_text("{}")
        for shard in partial.glob("*.distcp"):
            shard.write_bytes(shard.read_bytes()[:100])
    assert not is_complete(partial)
    _resume_and_compare(save, metrics, uninterrupted)
    # The resumed run's save removed every unfinished directory.
    assert not partial.exists()
    assert [p.name for p in save.glob("iter_*") if not is_complete(p)] == []
    assert read_tracker(save) == ITERS


def test_truncated_shard_is_a_clear_error(saved: Path, tmp_path: Path) -> None:
    save = copy_of(saved, tmp_path)
    shard = sorted((save / "iter_0000003").glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    proc = run_pretrain([*RUN, "--load", str(save)], nproc=2, expect=ExitCode.CHECKPOINT)
    assert f"{shard} is truncated" in proc.stdout


def test_corrupted_shard_is_a_clear_error(saved: Path, tmp_path: Path) -> None:
    save = copy_of(saved, tmp_path)
    shard = sorted((save / "iter_0000003").glob("*.distcp"))[-1]
    data = bytearray(shard.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])  # same size, other bytes
    shard.write_bytes(bytes(data))
    proc = run_pretrain([*RUN, "--load", str(save)], nproc=2, expect=ExitCode.CHECKPOINT)
    assert f"{shard} is corrupted: CRC-32" in proc.stdout


def test_shape_mismatch_is_a_clear_error(saved: Path) -> None:
    save = saved
    args = [a if a != "64" else "128" for a in RUN]  # --hidden-size 64 -> 128
    proc = run_pretrain([*args, "--load", str(save)], nproc=2, expect=ExitCode.CHECKPOINT)
    assert "does not match the model given by the arguments" in proc.stdout
    assert (
        "decoder.layers.mlp.linear_fc1.weight: checkpoint has shape (8, 256, 64), this model needs (8, 512, 128)"
        in proc.stdout
    )


def test_missing_checkpoint_starts_fresh_unless_strict(tmp_path: Path) -> None:
    empty = tmp_path / "nothing-here"
    proc = run_pretrain([*RUN, "--train-iters", "1", "--load", str(empty)], nproc=2)
    assert "no checkpoint found under --load" in proc.stdout
    proc = run_pretrain(
        [*RUN, "--train-iters", "1", "--load", str(empty), "--strict-load"], nproc=2, expect=ExitCode.CHECKPOINT
    )
    assert "--strict-load: no checkpoint under --load" in proc.stdout


def test_keep_last_checkpoints(tmp_path: Path) -> None:
    save = saved_run(tmp_path, "--save-interval", "1", "--keep-last-checkpoints", "2")
    assert sorted(p.name for p in save.glob("iter_*")) == ["iter_0000002", "iter_0000003"]
    assert (save / TRACKER_FILENAME).read_text().strip() == "3"


def test_repeated_non_finite_losses_stop_the_run(tmp_path: Path) -> None:
    proc = run_pretrain(
        [*TINY_MODEL, "--init-method-std", "1e30", "--train-iters", "10", "--max-consecutive-skipped", "2"],
        expect=ExitCode.NON_FINITE,
    )
    assert "3 consecutive iterations (up to 3) had a non-finite loss" in proc.stdout


def test_vocabulary_mismatch_is_a_clear_error(saved: Path) -> None:
    save = saved
    # The embedding's padded rows may differ with TP, so the shapes alone cannot tell.
    args = [a if a != "255" else "300" for a in RUN]  # --vocab-size 255 -> 300 (both pad to 384)
    proc = run_pretrain([*args, "--load", str(save)], nproc=2, expect=ExitCode.CHECKPOINT)
    assert "was trained with a vocabulary of 256 tokens and this run's tokenizer has 301" in proc.stdout


def test_learning_rate_schedule_change_needs_a_choice(saved: Path, tmp_path: Path) -> None:
    save = saved  # loaded, never saved to (no --save)
    longer = [a if a != "40" else "80" for a in RUN]  # --lr-decay-iters 40 -> 80 (and --train-iters)
    proc = run_pretrain([*longer, "--load", str(save)], nproc=2, expect=ExitCode.CHECKPOINT)
    assert "the learning-rate schedule differs from the checkpoint's" in proc.stdout
    assert "--override-opt_param-scheduler" in proc.stdout

    def first_resumed_lr(*flag: str) -> float:
        metrics = tmp_path / f"lr{len(flag)}{flag[0][2:6] if flag else ''}.jsonl"
        run_pretrain(
            [*longer, "--train-iters", "4", "--load", str(save), *flag, "--metrics-file", str(metrics)], nproc=2
        )
        return next(r["lr"] for r in read_metrics(metrics) if "lm_loss" in r)

    kept, overridden = (
        first_resumed_lr("--use-checkpoint-opt_param-scheduler"),
        first_resumed_lr("--override-opt-param-scheduler"),
    )
    assert overridden > kept  # decaying over 80 iterations instead of 40: a higher lr at iteration 4


def test_finetuning_into_the_pretraining_directory_is_refused(saved: Path, tmp_path: Path) -> None:
    save = copy_of(saved, tmp_path)
    proc = run_pretrain(
        [*RUN, "--finetune", "--load", str(save), "--save", str(save)], nproc=2, expect=ExitCode.CHECKPOINT
    )
    assert f"--save {save} already holds checkpoints up to iteration 3" in proc.stdout + proc.stderr
    assert sorted(p.name for p in save.glob("iter_*")) == ["iter_0000001", "iter_0000002", "iter_0000003"]


@pytest.mark.parametrize("optimizer", ["regular", "distributed"])
def test_save_before_any_successful_step_is_loadable(optimizer: str, tmp_path: Path) -> None:
    # Every loss is non-finite, so the optimizer never steps and has no state to save.
    flags = [*TINY_MODEL, "--init-method-std", "1e30", "--max-consecutive-skipped", "10"]
    if optimizer == "distributed":
        flags.append("--use-distributed-optimizer")
    save = tmp_path / "ckpt"
    run_pretrain(
        [*flags, "--train-iters", "4", "--save", str(save), "--exit-interval", "2"],
        nproc=2,
        expect=ExitCode.SAVED_AND_STOPPED,
    )
    assert read_tracker(save) == 2
    proc = run_pretrain([*flags, "--train-iters", "3", "--load", str(save)], nproc=2)
    assert "loaded checkpoint" in proc.stdout


def test_stopping_early_without_save_is_not_a_requeue(tmp_path: Path) -> None:
    # 75 means "a checkpoint is there, run again": without --save it would loop from scratch.
    proc = run_pretrain([*TINY_MODEL, "--train-iters", "4", "--exit-interval", "2"])
    assert "stopping early at iteration 2" in proc.stdout and "nothing saved" in proc.stdout
