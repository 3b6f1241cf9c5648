"""The steps of ``recipes/preprocess_corpus.sh`` (a corpus preprocessed as a SLURM job array)::

    python -m megatron_ext.cli.preprocess_job plan --input 'corpus/*.jsonl.zst' --output data/corpus --tasks 64 \\
        --preprocess-args '--tokenizer-type GPTSentencePieceTokenizer --tokenizer-model tok.model --append-eod'
    python -m megatron_ext.cli.preprocess_job task --output data/corpus --task 3
    python -m megatron_ext.cli.preprocess_job finish --output data/corpus [--merge]

``plan`` fixes the job's plan (``--dry-run``: prints it and writes nothing); the plan goes to stderr and the
tasks still to run, comma-separated, to stdout. ``task`` runs one task; ``finish`` verifies, totals and writes
the blends. See ``megatron_ext.data.preprocess_job``. Exit codes: 0 done, 1 a failed task or a finish that found
missing tasks or broken datasets, 2 bad options or inputs, 75 a task stopped by a signal (requeue it).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from megatron_ext.config.exit_codes import ExitCode, fail
from megatron_ext.config.flags import Parser
from megatron_ext.data.atomic_files import WriteError
from megatron_ext.data.indexed import IndexedDatasetError
from megatron_ext.data.preprocess_job import (
    JobError,
    check_task_time,
    finish,
    fix_plan,
    load_plan,
    make_plan,
    pending_tasks,
    run_task,
)
from megatron_ext.data.sources import DataError


def _keys(preprocess_args: list[str]) -> list[str]:
    """The JSON keys of ``preprocess_args``, which ``tools/preprocess_data.py``'s own parser checks (at
    submission, not in every task)."""
    from megatron_ext.cli.preprocess_data import build_parser

    try:
        args = build_parser().parse_args([*preprocess_args, "--input", "-", "--output-prefix", "-"])
    except SystemExit:
        raise JobError(
            f"PREPROCESS_ARGS {shlex.join(preprocess_args)!r}: tools/preprocess_data.py refuses them"
        ) from None
    return list(args.json_keys)


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    steps = p.add_subparsers(dest="step", required=True)
    plan = steps.add_parser("plan", help="fix the job's plan (or print it with --dry-run)")
    plan.add_argument("--input", nargs="+", required=True, help="Files and globs, as tools/preprocess_data.py.")
    plan.add_argument("--output", required=True, help="The job's directory (datasets, blends, records).")
    plan.add_argument("--tasks", type=int, required=True, help="Array tasks (fewer when there are fewer files).")
    plan.add_argument("--preprocess-args", default="", help="tools/preprocess_data.py's other options, one string.")
    plan.add_argument("--dry-run", action="store_true", help="Print the plan; write nothing.")
    plan.add_argument("--task-time", help="The tasks' SLURM time limit, checked against SLURM's warning before it.")
    task = steps.add_parser("task", help="run one array task")
    task.add_argument("--output", required=True)
    task.add_argument("--task", type=int, required=True)
    task.add_argument("--workers", type=int, help="Worker processes (default: the CPUs this task may use).")
    end = steps.add_parser("finish", help="verify, total, write the blends (and merge)")
    end.add_argument("--output", required=True)
    end.add_argument("--merge", action="store_true", help="Also merge each key's datasets into one, in input order.")
    args = p.parse_args(argv)
    try:
        if args.step == "plan":
            return _plan(args)
        if args.step == "task":
            workers = args.workers or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None)
            return run_task(load_plan(args.output), args.task, workers=workers)
        done = finish(load_plan(args.output), merge=args.merge)
    except JobError as exc:
        return fail(exc, ExitCode.INVALID if args.step == "plan" else ExitCode.ERROR)
    except (DataError, IndexedDatasetError, WriteError) as exc:  # a dataset, the blend or a full disk: named
        return fail(exc, ExitCode.ERROR)
    for key in done.documents:
        print(
            f"{key}: {done.datasets:,} datasets verified, {done.documents[key]:,} documents, {done.tokens[key]:,} tokens"
        )
    for path in [*done.blends, *done.merged]:
        print(f"  {path}")
    return ExitCode.OK


def _plan(args: argparse.Namespace) -> int:
    if args.task_time is not None:
        check_task_time(args.task_time)
    preprocess_args = shlex.split(args.preprocess_args)
    new = make_plan(
        args.input, args.output, tasks=args.tasks, preprocess_args=preprocess_args, keys=_keys(preprocess_args)
    )
    plan = fix_plan(new, write=not args.dry_run)
    if plan is not new:
        fewer = f" ({plan.tasks} tasks: TASKS={args.tasks} is not taken)" if plan.tasks != new.tasks else ""
        print(f"the job of {args.output} goes on: its plan is kept{fewer}", file=sys.stderr)
    for line in plan.describe():
        print(line, file=sys.stderr)
    print(",".join(map(str, pending_tasks(plan))))
    return ExitCode.OK


if __name__ == "__main__":
    raise SystemExit(main())
