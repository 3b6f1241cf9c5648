"""``pretrain_gpt.py --dry-run``: validation and the plan, without any process group."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_ext.config.exit_codes import ExitCode
from megatron_ext.config.training_config import parse_args
from megatron_ext.training import entry
from tests import waits
from tests.conftest import PRETRAIN, REPO, _env, run_script
from tests.filesystems import read_only_filesystem, small_filesystem
from tests.waits import QUICK_S

pytestmark = pytest.mark.unit

BIG = "--mock-data --num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 --vocab-size 51200 --micro-batch-size 1 --global-batch-size 1536 --tensor-model-parallel-size 8 --pipeline-model-parallel-size 8 --num-layers-per-virtual-pipeline-stage 3 --sequence-parallel --use-distributed-optimizer --bf16 --dry-run".split()


def test_valid_175b_layout_on_1024_gpus_prints_plan() -> None:
    # 1024 "GPUs" on a CPU-only machine: proves no process group or device is touched.
    proc = run_script([*BIG, "--world-size", "1024"])
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "configuration is valid" in out
    assert "world size: 1024 = TP 8 × PP 8 × DP 16 × VP 4 (interleaved 1F1B)" in out
    assert "microbatches per step (gradient accumulation): 96" in out
    assert "layers per pipeline stage: 12, per virtual stage: 3" in out
    assert "tokens per step: 3,145,728" in out
    assert "parameters: 174," in out  # GPT-3 175B with a 51,200-token vocabulary


def test_invalid_world_size_is_refused_with_the_rule() -> None:
    proc = run_script([*BIG, "--world-size", "1000"])
    assert proc.returncode == 2
    assert "world_size=1000 is not divisible by tensor(8) × pipeline(8) = 64" in proc.stderr
    assert "use 960 or 1024 processes" in proc.stderr


def test_invalid_interleaving_is_refused() -> None:
    args = [a if a != "3" else "5" for a in BIG]  # 12 layers per stage / 5 does not divide
    proc = run_script([*args, "--world-size", "1024"])
    assert proc.returncode == 2
    assert "num_layers_per_virtual_pipeline_stage=5 does not divide" in proc.stderr


def test_mlp_width_not_divisible_by_tp_is_refused_before_launch() -> None:
    """Megatron-Core's ColumnParallelLinear would assert divide(171, 2) at model build, after the queue wait."""
    proc = run_script(
        "--mock-data --num-layers 4 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 171 "
        "--tensor-model-parallel-size 2 --world-size 8 --dry-run".split()
    )
    assert proc.returncode == 2, proc.stdout
    assert (
        "ffn_hidden_size=171 is not divisible by tensor(2); use TP in [1, 3] or an ffn_hidden_size of 170 or 172"
        in proc.stderr
    )


def test_world_size_from_environment_variable() -> None:
    env = _env() | {"WORLD_SIZE": "6"}
    proc = subprocess.run(
        [sys.executable, str(PRETRAIN), "--mock-data", "--pipeline-model-parallel-size", "4", "--dry-run"],
        capture_output=True,
        text=True,
        env=env,
        cwd=os.path.dirname(PRETRAIN),
        timeout=QUICK_S,
    )
    assert proc.returncode == 2
    assert "world_size=6 is not divisible by tensor(1) × pipeline(4) = 4" in proc.stderr


def test_the_documented_uneven_stage_examples() -> None:
    """docs/parallelism.md: 30 layers on PP4 × VP2 is refused with uneven fixes; the account-for fix prints its stage
    table."""
    base = "--mock-data --num-layers 30 --pipeline-model-parallel-size 4 --world-size 8 --dry-run".split()
    proc = run_script([*base, "--num-virtual-stages-per-pipeline-rank", "2"])
    assert proc.returncode == 2
    assert (
        "num_layers=30 is not divisible by pipeline(4); try 28 or 32 layers or PP in [1, 2, 3, 5, 6]; or place "
        "the layers unevenly: --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split, or "
        '--decoder-first-pipeline-num-layers 6 --decoder-last-pipeline-num-layers 8, or --pipeline-model-parallel-layout "Et*3|(t*4|)*6,t*3L"'
    ) in proc.stderr
    proc = run_script([*base, "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"])
    assert proc.returncode == 0, proc.stderr
    lines = [line.strip() for line in proc.stdout.splitlines()]
    for row in ("rank 0     E+7t  (7 layers)", "ranks 1-2  8t    (8 layers each)", "rank 3     7t+L  (7 layers)"):
        assert row in lines


# ------------------------------------------------------------------ a job rehearsed on a smaller machine
def _dry_run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """``pretrain_gpt.py --dry-run`` outside any SLURM job, with ``env`` added."""
    clean = {k: v for k, v in _env().items() if k != "SLURM_JOB_ID"}
    return waits.run([sys.executable, str(PRETRAIN), *args], timeout=QUICK_S, env=clean | env, cwd=REPO)


def test_a_job_for_more_ranks_than_this_machine_leaves_the_room_for_its_checkpoints_to_the_run(
    tmp_path: Path,
) -> None:
    """DRY_RUN=1 of a 1,024-GPU job on a laptop: this machine's disk says nothing of the cluster's, so the dry run
    checks what it can here (the directory is writable) and says that the run checks the room where it starts.
    Before: refused, since one checkpoint (2.22 TiB here) did not fit on the laptop's disk. Inside a SLURM job
    (the recipes validate on the job's first node, on the job's own filesystem) the room is checked."""
    with small_filesystem(tmp_path / "small", size_kib=1024) as fs:
        args = [*BIG, "--world-size", "1024", "--save", str(fs / "ckpt")]
        rehearsal = _dry_run(args)
        in_job = _dry_run(args, SLURM_JOB_ID="1")
    assert rehearsal.returncode == 0, rehearsal.stderr
    assert (
        f"--save {fs / 'ckpt'}: writable here; about 2.22 TiB per checkpoint, room the run checks where it starts, "
        "before its first step ("
    ) in rehearsal.stdout
    assert "which does not count: its 1,024 ranks are more than this machine's" in rehearsal.stdout
    assert in_job.returncode == ExitCode.INVALID, in_job.stdout
    assert "one checkpoint of this run needs about 2.22 TiB; free space there" in in_job.stderr


def test_a_rehearsal_still_refuses_a_save_it_cannot_write(tmp_path: Path) -> None:
    with read_only_filesystem(tmp_path / "ro") as ro:
        proc = _dry_run([*BIG, "--world-size", "1024", "--save", str(ro / "ckpt")])
    assert proc.returncode == ExitCode.INVALID, proc.stdout
    assert f"--save {ro / 'ckpt'}: {ro} is on a read-only filesystem (EROFS)" in proc.stderr


def test_which_worlds_run_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU job's ranks beyond this machine's GPUs (or, without any, its CPUs) run elsewhere; CPU processes and
    a dry run inside a SLURM job run here."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)

    def elsewhere(world: int, *extra: str) -> str | None:
        return entry._runs_elsewhere(parse_args(["--mock-data", "--world-size", str(world), *extra]))

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,-1,3")  # CUDA stops at the first invalid entry: 2 GPUs
    assert elsewhere(2) is None
    assert elsewhere(4) == "its 4 ranks are more than this machine's 2 GPUs"
    assert elsewhere(4, "--device", "cuda") == "its 4 ranks are more than this machine's 2 GPUs"
    assert elsewhere(4, "--device", "cpu") is None
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    assert elsewhere(4) is None
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU: CPU processes, one a core
    cpus = len(os.sched_getaffinity(0))
    assert elsewhere(cpus) is None
    assert (
        elsewhere(cpus + 1) == f"its {cpus + 1} ranks are more than this machine's {cpus} CPU{'s' if cpus > 1 else ''}"
    )
