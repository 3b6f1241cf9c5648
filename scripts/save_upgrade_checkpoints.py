"""Save the small checkpoints that a Megatron-Core upgrade must resume, with the losses that followed them.

Run it with the release being left, before the pin moves::

    .venv/bin/python scripts/save_upgrade_checkpoints.py

For each case it trains a tiny GPT to iteration ``SAVED_AT`` and stops with a checkpoint (exit code 75), keeps
a copy of that checkpoint under ``tests/upgrade/checkpoints/<case>/``, resumes from it to ``TRAIN_ITERS`` and
writes the losses of the resumed iterations, the flags and the versions that made them to ``case.json`` beside
it. ``tests/upgrade/test_resume_across_upgrade.py`` resumes each copy with the installed release and compares.
An existing case is replaced only with ``--replace``: the point of these files is that they come from an older
release.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from megatron_ext.cli.launch import local_command
from megatron_ext.config.exit_codes import ExitCode
from megatron_ext.estimate.metrics_file import read_metrics_file

REPO = Path(__file__).resolve().parent.parent

CHECKPOINTS = REPO / "tests" / "upgrade" / "checkpoints"
SAVED_AT = 3
"""The iteration each checkpoint holds."""
TRAIN_ITERS = 8
"""The iteration the resumed runs end at: their losses are the comparison."""
CASE_FILE = "case.json"

# Small enough to keep in git (about 1 MB a case); dropout on, so the RNG states must come back exactly.
TINY = (
    "--num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --vocab-size 255 --micro-batch-size 2 "
    "--global-batch-size 8 --hidden-dropout 0.1 --attention-dropout 0.1 --lr 1e-3 --lr-warmup-iters 2 "
    f"--lr-decay-iters {TRAIN_ITERS} --lr-decay-style cosine --mock-data --device cpu --seed 1234 "
    f"--train-iters {TRAIN_ITERS}"
).split()


@dataclass(frozen=True)
class Case:
    name: str
    nproc: int
    """CPU processes (ranks) of the run."""
    flags: str
    """The layout and schedule flags, after ``TINY``."""

    @property
    def args(self) -> list[str]:
        return [*TINY, *self.flags.split()]


CASES = (
    # Interleaved 1F1B with the distributed optimizer sharded over two data-parallel ranks.
    Case(
        "pp2-vp2-dp2-distributed-optimizer",
        4,
        "--pipeline-model-parallel-size 2 --virtual-pipeline-model-parallel-size 2 --use-distributed-optimizer",
    ),
    # ZB-H1: the schedule that splits the backward pass.
    Case("pp2-zero-bubble", 2, "--pipeline-model-parallel-size 2 --enable-zero-bubble"),
)


def _train(case: Case, extra: list[str], *, expect: int, log: Path) -> None:
    command = local_command(REPO / "pretrain_gpt.py", [*case.args, *extra], nproc=case.nproc)
    with open(log, "w") as out:
        code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, check=False).returncode
    if code != expect:
        sys.exit(f"{case.name}: pretrain_gpt.py exited {code}, expected {expect}; its output is in {log}")


def _losses(metrics: Path) -> dict[str, float]:
    """The loss of each iteration of the run that continued (the resumed run's, after the stop)."""
    return {str(r["iteration"]): r["lm_loss"] for r in read_metrics_file(metrics).rows if "lm_loss" in r}


def save_case(case: Case, work: Path) -> Path:
    """Train, stop at ``SAVED_AT`` and resume to ``TRAIN_ITERS`` in ``work``; the case's directory, in ``work``."""
    stopped, resumed, metrics = work / "stopped", work / "resumed", work / "metrics.jsonl"
    _train(case, ["--save", str(stopped), "--exit-interval", str(SAVED_AT)], expect=ExitCode.SAVED_AND_STOPPED,
           log=work / "first.log")  # fmt: skip
    staged = work / case.name
    shutil.copytree(stopped, staged / "checkpoint")
    _train(case, ["--load", str(stopped), "--save", str(resumed), "--metrics-file", str(metrics)], expect=0,
           log=work / "resumed.log")  # fmt: skip
    losses = _losses(metrics)
    if sorted(map(int, losses)) != list(range(SAVED_AT + 1, TRAIN_ITERS + 1)):
        sys.exit(f"{case.name}: the resumed run logged iterations {sorted(losses)}, expected {SAVED_AT + 1}..")
    record = {
        "nproc": case.nproc,
        "args": case.args,
        "saved_at": SAVED_AT,
        "losses": losses,
        "megatron_core": version("megatron-core"),
        "torch": version("torch"),
        "python": platform.python_version(),
    }
    (staged / CASE_FILE).write_text(json.dumps(record, indent=1) + "\n")
    return staged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replace", action="store_true", help="replace cases that exist (made by another release)")
    args = parser.parse_args(argv)
    CHECKPOINTS.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        target = CHECKPOINTS / case.name
        if target.exists() and not args.replace:
            made_with = json.loads((target / CASE_FILE).read_text())["megatron_core"]
            print(f"{case.name}: kept (made with megatron-core {made_with}); --replace makes it again")
            continue
        # Built beside its final place and published by one rename: an interrupted run leaves no half case.
        with tempfile.TemporaryDirectory(dir=CHECKPOINTS) as work:
            staged = save_case(case, Path(work))
            if target.exists():
                target.rename(Path(work) / "replaced")
            staged.rename(target)
        print(f"{case.name}: saved at iteration {SAVED_AT} with megatron-core {version('megatron-core')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
