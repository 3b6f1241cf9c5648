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
import sys
import time
from pathlib import Path

import pytest

from megatron_ext.checkpoint.on_disk import (
    CHECKSUMS_FILENAME,
    DAMAGED_SUFFIX,
    SAVING_FILENAME,
    TRACKER_FILENAME,
    DirState,
    is_complete,
    read_tracker,
    states,
)
from megatron_ext.config.exit_codes import ExitCode
from megatron_ext.estimate.metrics_file import read_metrics_file
from megatron_ext.training.save_faults import KILL_AT_VARIABLE, SAVE_STEPS
from tests import waits
from tests.conftest import (
    REPO,
    TINY_MODEL,
    _env,
    launch_command,
    python_warnings,
    read_metrics,
    run_pretrain,
    run_script,
    train_losses,
)
from tests.once import once_per_run
from tests.training.conftest import ITERS, RUN, copy_of, saved_run
from tests.waits import READY_S, STOP_S

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    metrics = (
        once_per_run(
            tmp_path_factory,
            "uninterrupted",
            lambda d: run_pretrain([*RUN, "--metrics-file", str(d / "m.jsonl")], nproc=2),
        )
        / "m.jsonl"
    )
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


def _start(args: list[str], log: Path, *, launcher: str = "ours") -> subprocess.Popen[bytes]:
    """Two ranks of pretrain_gpt.py under our launcher, or under plain ``torchrun`` (``launcher="torchrun"``)."""
    command = launch_command(args, nproc=2)
    if launcher == "torchrun":
        command = [sys.executable, "-m", "torch.distributed.run", *command[3:]]
    with open(log, "wb") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=_env(), cwd=REPO, start_new_session=True
        )


def _wait_for(what: str, predicate, proc: subprocess.Popen[bytes], log: Path) -> None:
    def running() -> None:
        assert proc.poll() is None, "the run ended before the test could interrupt it"

    waits.wait_for(
        what, predicate, timeout=READY_S, every=0.02, check=running, state=lambda: f"--- {log} ---\n{waits.tail(log)}"
    )


@pytest.mark.parametrize(
    ("sig", "launcher"),
    [(signal.SIGUSR1, "ours"), (signal.SIGTERM, "ours"), (signal.SIGTERM, "torchrun")],
    ids=["SIGUSR1", "SIGTERM", "SIGTERM-plain-torchrun"],
)
def test_signal_saves_stops_and_resumes_exactly(
    sig: signal.Signals, launcher: str, tmp_path: Path, uninterrupted: dict[int, float]
) -> None:
    """After periodic saves (whose helper processes the signal must not reach: before, the stop's own save
    then failed with EPIPE, exit 3), every rank saves and exits 75, and the launcher says 75 too."""
    save, metrics = tmp_path / "ckpt", tmp_path / "m.jsonl"
    # SIGUSR1 with a data-loader worker: it must ignore the signal (helper_processes), and resuming must stay
    # exact with workers.
    workers = ["--num-workers", "1"] if sig == signal.SIGUSR1 else []
    log = tmp_path / "log"
    args = [*RUN, *workers, "--save", str(save), "--save-interval", "2", "--exit-signal-handler"]
    proc = _start([*args, "--metrics-file", str(metrics)], log, launcher=launcher)
    after = random.Random(sig).randint(3, 8)
    _wait_for(f"{after} iterations", lambda: metrics.exists() and len(train_losses(metrics)) >= after, proc, log)
    assert (read_tracker(save) or 0) >= 2, "the signal must come after a periodic save"
    os.kill(proc.pid, sig)
    if sig == signal.SIGUSR1:
        # A second signal while the checkpoint is being written must not disturb it.
        os.kill(proc.pid, sig)
    code = waits.wait_exit(proc, f"the run to stop on {sig.name}", timeout=READY_S, log=log)
    output = log.read_text()
    assert "checkpoint of iteration" in output and "exit code 75" in output, output[-3000:]
    if launcher == "ours":
        assert code == ExitCode.SAVED_AND_STOPPED, output[-3000:]
    assert "Overwriting old incomplete" not in output  # Megatron-Core's false alarm on every save
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
    resumed_from = _resume_and_compare(save, metrics, uninterrupted)
    # Both starts are marked, and the reader's run is the resumed one: the rows the killed start logged past
    # the checkpoint the second resumed from are superseded, flagged and kept (estimate.metrics_file).
    marked = read_metrics_file(metrics)
    assert [(s.record["start"], s.resumed_from_iteration) for s in marked.starts] == [(0, 0), (1, resumed_from)]
    first, second = (s.started_at for s in marked.starts)
    assert first is not None and second is not None and first <= second
    continued = [r for r in marked.rows if "lm_loss" in r]
    assert [r["iteration"] for r in continued] == list(range(1, ITERS + 1))
    assert all(r["lm_loss"] == uninterrupted[r["iteration"]] for r in continued)
    past_resume = [r.line for r in marked.all_rows if r.start == 0 and (r.iteration or 0) > resumed_from]
    assert [r.line for r in marked.all_rows if r.superseded] == past_resume
    # The resumed run's save removed every unfinished directory.
    assert not partial.exists()
    assert [p.name for p in save.glob("iter_*") if not is_complete(p)] == []
    assert read_tracker(save) == ITERS


def _tagged_processes(tag: str) -> list[str]:
    """The processes (a run's ranks and every helper they started) whose environment holds ``tag``."""
    import psutil

    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if process.environ().get(TAG_VARIABLE) == tag:
                found.append(f"{process.pid}: {' '.join(process.info['cmdline'] or [])[:160]}")
    return found


TAG_VARIABLE = "MEGATRON_EXT_TEST_RUN"


@pytest.mark.parametrize(
    ("step", "rank", "published"),
    [
        ("before-shards", 1, 2),
        ("after-shards", 0, 2),
        ("after-checksums", 1, 4),  # rank 0 writes the tracker, then finds rank 1 gone
        ("after-tracker", 0, 4),  # the tracker names it, its in-progress marker is still there
        ("published", 1, 4),
    ],
)
def test_a_rank_killed_at_each_step_of_a_save_loses_no_published_checkpoint(
    step: str, rank: int, published: int, tmp_path: Path, uninterrupted: dict[int, float]
) -> None:
    """kill -9 of one rank at each step of the save of iteration 4 (saves every 2 iterations). Before: a rank
    that died after rank 0 wrote the tracker made rank 0's failure path delete the checkpoint the tracker
    named, leaving no checkpoint (a requeued job could never restart). Now the newest published checkpoint is
    complete and resumes bit for bit, and none of the run's helper processes outlives its rank."""
    assert step in SAVE_STEPS
    save, metrics = tmp_path / "ckpt", tmp_path / "m.jsonl"
    tag = f"{os.getpid()}-{step}"
    proc = run_pretrain(
        [*RUN, "--save", str(save), "--save-interval", "2", "--train-iters", "6"],
        nproc=2,
        expect=None,
        env={KILL_AT_VARIABLE: f"{step}:{rank}:4", TAG_VARIABLE: tag},
    )
    assert proc.returncode != 0
    waits.wait_for("the run's helper processes to end", lambda: not _tagged_processes(tag), timeout=STOP_S,
                   state=lambda: "\n".join(_tagged_processes(tag)))  # fmt: skip
    assert read_tracker(save) == published
    assert states(save)[published] is DirState.COMPLETE
    assert f"error: rank {rank} on host" in proc.stdout, proc.stdout[-3000:]  # the survivor names the dead
    assert _resume_and_compare(save, metrics, uninterrupted) == published


def test_truncated_shard_is_a_clear_error_with_no_fallback(saved: Path, tmp_path: Path) -> None:
    """--no-checkpoint-fallback: the hard stop a person at a terminal may want, changing nothing."""
    save = copy_of(saved, tmp_path)
    shard = sorted((save / "iter_0000003").glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    proc = run_pretrain([*RUN, "--load", str(save), "--no-checkpoint-fallback"], nproc=2, expect=ExitCode.CHECKPOINT)
    assert f"{shard} is truncated" in proc.stderr  # refused before anything is built (resume.preflight_resume)
    assert sorted(p.name for p in save.glob("iter_*")) == ["iter_0000001", "iter_0000002", "iter_0000003"]


def _corrupt(shard: Path) -> None:
    data = bytearray(shard.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])  # same size, other bytes
    shard.write_bytes(bytes(data))


def test_a_damaged_latest_checkpoint_falls_back_and_resumes_exactly(
    saved: Path, tmp_path: Path, uninterrupted: dict[int, float]
) -> None:
    """Before: exit 3 at every requeue, until a person came. Now the newest earlier checkpoint that passes its
    checks is loaded, the damaged one is moved aside (kept), one warning says so, the metrics file records it,
    and training continues exactly as the uninterrupted run did."""
    save, metrics = copy_of(saved, tmp_path), tmp_path / "m.jsonl"
    shard = sorted((save / "iter_0000003").glob("*.distcp"))[-1]
    _corrupt(shard)
    damaged = _snapshot_bytes(save / "iter_0000003")
    args = ["--load", str(save), "--save", str(save), "--save-interval", "3", "--metrics-file", str(metrics)]
    proc = run_pretrain([*RUN, *args], nproc=2)
    _assert_no_dependency_noise(proc)
    warnings = [line for line in proc.stdout.splitlines() if "checkpoint of iteration 3 skipped" in line]
    assert len(warnings) == 1 and f"{shard} is corrupted: CRC-32" in warnings[0], proc.stdout[-3000:]
    assert "resuming from iteration 2 instead" in warnings[0]
    aside = save / f"iter_0000003{DAMAGED_SUFFIX}"
    assert _snapshot_bytes(aside) == damaged  # moved, byte for byte, never deleted
    [event] = [r for r in read_metrics(metrics) if "checkpoint_skipped" in r]
    assert event["checkpoint_skipped"] == 3 and event["moved_to"] == str(aside) and event["iteration"] == 2
    resumed = train_losses(metrics)
    assert sorted(resumed) == list(range(3, ITERS + 1))
    for it, loss in resumed.items():
        assert loss == uninterrupted[it], f"iteration {it}: resumed {loss!r} != uninterrupted {uninterrupted[it]!r}"
    assert read_tracker(save) == ITERS and states(save)[3] is DirState.COMPLETE  # a new save of 3, no collision


MEGATRON_CORE_NOISE = ("GPTModel IS DEPRECATED", "async save is deprecated", "Unable to save MockGPTDataset")
"""Megatron-Core's log lines that a run with --mock-data and saves printed before ``megatron_ext/notices.py``."""


def _assert_no_dependency_noise(proc: subprocess.CompletedProcess[str]) -> None:
    """What users see of a run that loads, trains and saves: no Python warning (stderr), and none of Megatron-Core's
    log lines that do not apply (stdout)."""
    assert python_warnings(proc.stderr) == [], proc.stderr[-3000:]
    assert [line for line in proc.stdout.splitlines() if any(n in line for n in MEGATRON_CORE_NOISE)] == []


def _snapshot_bytes(directory: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(directory.iterdir()) if f.is_file()}


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


def test_without_the_nan_check_a_non_finite_step_is_taken_and_the_run_goes_on(tmp_path: Path) -> None:
    """--no-check-for-nan-in-loss-and-grad, as in Megatron-LM: nothing checks the loss, the optimizer steps on
    (fp32 here: no loss scaler to skip it) and the run ends normally, past --max-consecutive-skipped."""
    metrics = tmp_path / "m.jsonl"
    flags = ["--init-method-std", "1e30", "--train-iters", "3", "--max-consecutive-skipped", "0"]
    run_pretrain([*TINY_MODEL, *flags, "--no-check-for-nan-in-loss-and-grad", "--metrics-file", str(metrics)])
    steps = [r for r in read_metrics(metrics) if "lm_loss" in r]
    assert [(r["iteration"], r["lm_loss"], r["skipped"]) for r in steps] == [(1, None, 0), (2, None, 0), (3, None, 0)]


def test_vocabulary_mismatch_is_refused_before_anything_is_built(saved: Path) -> None:
    """By --dry-run, and so by every rank before it starts torch.distributed (resume.preflight_resume)."""
    # The embedding's padded rows may differ with TP, so the shapes alone cannot tell.
    args = [a if a != "255" else "300" for a in RUN]  # --vocab-size 255 -> 300
    proc = run_script([*args, "--load", str(saved), "--dry-run", "--world-size", "2"])
    assert proc.returncode == ExitCode.CHECKPOINT, proc.stderr[-3000:]
    assert "was trained with a vocabulary of 255 tokens and this run's tokenizer has 300" in proc.stderr


def test_dry_run_names_the_checkpoint_a_resume_falls_back_to_and_moves_nothing(saved: Path, tmp_path: Path) -> None:
    save = copy_of(saved, tmp_path)
    (save / "iter_0000003" / ".metadata").unlink()
    before = sorted(str(p.relative_to(save)) for p in save.rglob("*"))
    dry = [*RUN, "--load", str(save), "--save", str(save), "--dry-run", "--world-size", "2"]
    proc = run_script(dry)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert python_warnings(proc.stderr) == []  # a fresh interpreter: Megatron-Core's imports and a checkpoint read
    assert f"iteration 3 under --load {save} fails its checks ({save}/iter_0000003/.metadata is missing" in proc.stdout
    assert f"resumes from iteration 2 under --load {save}" in proc.stdout
    hard = run_script([*dry, "--no-checkpoint-fallback"])
    assert hard.returncode == ExitCode.CHECKPOINT and "iter_0000003/.metadata is missing" in hard.stderr
    assert sorted(str(p.relative_to(save)) for p in save.rglob("*")) == before


def test_learning_rate_schedule_change_needs_a_choice(saved: Path, tmp_path: Path) -> None:
    save = saved  # loaded, never saved to (no --save)
    longer = [a if a != str(ITERS) else str(2 * ITERS) for a in RUN]  # --lr-decay-iters and --train-iters doubled
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
    assert overridden > kept  # decaying over twice the iterations: a higher lr at iteration 4


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
