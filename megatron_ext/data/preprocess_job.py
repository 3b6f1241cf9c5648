"""A corpus preprocessed as a SLURM job array (``recipes/preprocess_corpus.sh``): the plan, one task, the end.

- **Plan** (at submission): the input files, expanded and sorted as ``tools/preprocess_data.py`` does, cut
  into contiguous shares of nearly equal bytes, one per array task. It is written once to
  ``OUTPUT/job/plan.json`` and reused by every later submission, so a requeue or a resubmission never moves
  a file to another task; a submission with other inputs or options (but ``SAFE_OPTIONS``) into the same
  output is refused.
- **Task** ``K``: ``tools/preprocess_data.py --output-per-file`` over its share, into a staging directory that
  becomes ``OUTPUT/datasets/task-K`` (a rename: all of the task's datasets or none), then its completion
  record ``OUTPUT/job/done/task-K.json``. A task with a record is skipped. Stopped (``SIGUSR1`` before the
  time limit, ``SIGTERM``), it leaves nothing and exits 75 for the recipe to requeue it.
- **Finish** (after the array, however it ended; missing tasks are named): every dataset verified (``tools/inspect_dataset.py --verify``'s
  checks), documents and tokens totalled, a blend per JSON key written (``OUTPUT/blend_KEY.txt``, for
  ``--data-args-path``), and with ``merge`` one dataset per key merged in input order
  (``OUTPUT/corpus_KEY_document``): the bytes one ``tools/preprocess_data.py`` run over all the files writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from megatron_ext.config.exit_codes import ExitCode
from megatron_ext.data import formats
from megatron_ext.data.indexed import IndexedDatasetError, IndexedDatasetFiles, merge_datasets

PREFIX = "corpus"
"""The ``--output-prefix`` name of every dataset: ``corpus_NAME_KEY_document``, merged ``corpus_KEY_document``."""


class JobError(ValueError):
    """A plan, task or finish that cannot go on; the message names what and how to fix it."""


@dataclass(frozen=True)
class PlannedFile:
    path: str
    bytes: int
    task: int
    name: str
    """Its datasets' NAME (``--output-per-file`` below the inputs' root)."""


@dataclass(frozen=True)
class Plan:
    output: str
    root: str
    """The inputs' common directory: names are paths below it."""
    files: tuple[PlannedFile, ...]
    tasks: int
    preprocess_args: tuple[str, ...]
    """``tools/preprocess_data.py`` options other than input and output (tokenizer, keys, ``--append-eod``, …)."""
    keys: tuple[str, ...]

    def share(self, task: int) -> list[PlannedFile]:
        return [f for f in self.files if f.task == task]

    def dataset(self, file: PlannedFile, key: str) -> str:
        return str(Path(self.output) / "datasets" / f"task-{file.task}" / f"{PREFIX}_{file.name}_{key}_document")

    def describe(self) -> list[str]:
        """The plan as DRY_RUN prints it: each task's files and bytes, and the outputs."""
        lines = [f"{len(self.files):,} files, {_size(sum(f.bytes for f in self.files))}, over {self.tasks} tasks:"]
        for task in range(self.tasks):
            share = self.share(task)
            lines.append(
                f"  task {task}: {len(share):,} files, {_size(sum(f.bytes for f in share))} "
                f"({share[0].path}{' … ' + share[-1].path if len(share) > 1 else ''})"
            )
        lines.append(
            f"datasets: {self.output}/datasets/task-K/{PREFIX}_NAME_KEY_document (keys: {', '.join(self.keys)})"
        )
        lines.append(f"blends: {', '.join(str(blend_path(self, k)) for k in self.keys)}")
        return lines


def _size(n: int) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def balanced_shares(sizes: Sequence[int], tasks: int) -> list[int]:
    """The task of each item: ``min(tasks, items)`` contiguous runs (input order is kept) whose largest total is
    as small as it can be: binary search on that total with runs filled greedily, then the heaviest runs of
    several items split further while tasks are left (which never raises the largest)."""
    if not sizes:
        return []

    def runs(capacity: int) -> list[list[int]]:
        out: list[list[int]] = [[]]
        load = 0
        for i, size in enumerate(sizes):
            if load and load + size > capacity:
                out.append([])
                load = 0
            out[-1].append(i)
            load += size
        return out

    lo, hi = max(max(sizes), 1), max(sum(sizes), 1)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if len(runs(mid)) <= tasks else (mid + 1, hi)
    parts = runs(lo)
    while len(parts) < min(tasks, len(sizes)):
        k = max((k for k in range(len(parts)) if len(parts[k]) > 1), key=lambda k: sum(sizes[i] for i in parts[k]))
        run = parts[k]
        # Where the two halves are closest in bytes.
        cut = min(
            range(1, len(run)), key=lambda c: abs(sum(sizes[i] for i in run[:c]) - sum(sizes[i] for i in run[c:]))
        )
        parts[k : k + 1] = [run[:cut], run[cut:]]
    return [task for task, run in enumerate(parts) for _ in run]


def make_plan(
    inputs: Sequence[str],
    output: str | os.PathLike[str],
    *,
    tasks: int,
    preprocess_args: Sequence[str],
    keys: Sequence[str],
) -> Plan:
    """The plan of a new job (nothing written); JobError names bad inputs or options. ``preprocess_args`` were
    checked by ``tools/preprocess_data.py``'s parser, which gave ``keys``."""
    if tasks < 1:
        raise JobError(f"TASKS must be at least 1, got {tasks}")
    for flag in ("--input", "--output-prefix", "--output-per-file", "--input-root"):
        if any(a == flag or a.startswith(flag + "=") for a in preprocess_args):
            raise JobError(f"PREPROCESS_ARGS: leave {flag} out; the job sets it for each task")
    fmt = _option(preprocess_args, "--input-format")
    try:
        files = formats.expand_inputs(list(inputs), fmt)
    except formats.InputError as exc:
        raise JobError(f"INPUT: {exc}") from None
    if not files:
        raise JobError("INPUT names no file")
    root = os.path.commonpath([os.path.abspath(f.path.parent) for f in files])
    try:
        names = formats.output_labels(files, root)
    except formats.InputError as exc:
        raise JobError(str(exc)) from None
    share = balanced_shares([f.size for f in files], tasks)
    planned = tuple(
        PlannedFile(str(os.path.abspath(f.path)), f.size, task, name)
        for f, task, name in zip(files, share, names, strict=True)
    )
    return Plan(str(os.path.abspath(output)), root, planned, share[-1] + 1, tuple(preprocess_args), tuple(keys))


def _option(args: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


WARNING_S = 300
"""SLURM warns a task this long before its time limit (``--signal=B:USR1@300``): the task stops and is requeued."""


def slurm_minutes(text: str) -> float:
    """A SLURM time limit (``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``) in minutes; JobError if not."""
    days, _, rest = text.strip().rpartition("-")
    try:
        parts = [int(x) for x in rest.split(":")]
        d = int(days) if days else 0
    except ValueError:
        raise JobError(f"TASK_TIME {text!r} is not a SLURM time (e.g. 04:00:00 or 1-00:00:00)") from None
    if days:
        hours, minutes, seconds = [*parts, 0, 0][:3]
    elif len(parts) == 1:
        hours, minutes, seconds = 0, parts[0], 0
    elif len(parts) == 2:
        hours, minutes, seconds = 0, parts[0], parts[1]
    else:
        hours, minutes, seconds = parts[:3]
    return d * 1440 + hours * 60 + minutes + seconds / 60


def check_task_time(text: str) -> None:
    """A task's time limit must leave room after SLURM's warning: 3 × the warning at least."""
    if slurm_minutes(text) * 60 < 3 * WARNING_S:
        raise JobError(
            f"TASK_TIME {text}: SLURM warns a task {WARNING_S // 60} minutes before its limit, and the task then "
            f"stops and starts again; give at least {3 * WARNING_S // 60} minutes, and more than a share takes"
        )


def plan_path(output: str | os.PathLike[str]) -> Path:
    return Path(output) / "job" / "plan.json"


def done_path(plan: Plan, task: int) -> Path:
    return Path(plan.output) / "job" / "done" / f"task-{task}.json"


def blend_path(plan: Plan, key: str) -> Path:
    return Path(plan.output) / f"blend_{key}.txt"


def load_plan(output: str | os.PathLike[str]) -> Plan:
    path = plan_path(output)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise JobError(f"{path} does not exist: submit the job first (bash recipes/preprocess_corpus.sh)") from None
    if os.path.abspath(raw["output"]) != os.path.abspath(output):
        raise JobError(
            f"{path} was made for OUTPUT {raw['output']}: the job's directory moved; submit it again from there, or "
            "start a new job"
        )
    return Plan(
        output=raw["output"],
        root=raw["root"],
        files=tuple(PlannedFile(**f) for f in raw["files"]),
        tasks=int(raw["tasks"]),
        preprocess_args=tuple(raw["preprocess_args"]),
        keys=tuple(raw["keys"]),
    )


SAFE_OPTIONS = {"--skip-bad-lines": 0, "--allow-empty-output": 0, "--workers": 1, "--log-interval": 1,
                "--quiet": 0, "--chunk-mb": 1}  # fmt: skip
"""``tools/preprocess_data.py`` options (with their value counts) that a resubmission may change: they change no
byte of a dataset that a task has finished (skipping bad lines or writing empty datasets only lets a task finish
that failed on them)."""


def _without_safe(args: Sequence[str]) -> list[str]:
    out, i = [], 0
    while i < len(args):
        flag = args[i].split("=", 1)[0]
        if flag in SAFE_OPTIONS:
            i += 1 + (SAFE_OPTIONS[flag] if "=" not in args[i] else 0)
            continue
        out.append(args[i])
        i += 1
    return out


def fix_plan(new: Plan, *, write: bool = True) -> Plan:
    """The job's plan: ``new``, written to ``OUTPUT/job/plan.json`` (unless not ``write``: a dry run); or, for the
    same job, the one already there, so that a resubmission keeps every file in its task. The same job: the same
    files in the same order, the same sizes for the files of finished tasks, and the same options but those of
    ``SAFE_OPTIONS`` (the new ones, and the new sizes of unfinished tasks' files, are then kept). JobError when the
    output holds another job's plan, or something that is not a job's output."""
    path = plan_path(new.output)
    if path.exists():
        old = load_plan(new.output)
        done = set(range(old.tasks)) - set(pending_tasks(old))
        changed = [
            o.path
            for o, n in zip(old.files, new.files, strict=False)
            if o.path != n.path or (o.task in done and o.bytes != n.bytes)
        ]
        if (
            _without_safe(old.preprocess_args) != _without_safe(new.preprocess_args)
            or len(old.files) != len(new.files)
            or changed
        ):
            what = f" (first: {changed[0]})" if changed else ""
            raise JobError(
                f"{new.output} holds the job of {path}, with other input files, sizes of finished tasks' files or "
                f"options{what}: give another OUTPUT, or the same INPUT and PREPROCESS_ARGS to go on with that job "
                f"(only {', '.join(SAFE_OPTIONS)} may change)"
            )
        sizes = {f.path: f.bytes for f in new.files}
        kept = dataclasses.replace(
            old,
            preprocess_args=new.preprocess_args,
            files=tuple(dataclasses.replace(f, bytes=sizes[f.path]) for f in old.files),
        )
        if write and kept != old:
            _write_plan(kept, path)
        return kept
    out = Path(new.output)
    if out.exists() and any(out.iterdir()):
        raise JobError(f"OUTPUT {out} exists and is not empty, and no job of this recipe made it: give a new directory")
    if write:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_plan(new, path)
    return new


def _write_plan(plan: Plan, path: Path) -> None:
    staged = path.with_name(f".plan.json.{os.getpid()}")
    staged.write_text(json.dumps(asdict(plan), indent=1) + "\n", encoding="utf-8")
    os.replace(staged, path)


def pending_tasks(plan: Plan) -> list[int]:
    return [t for t in range(plan.tasks) if not done_path(plan, t).exists()]


# ------------------------------------------------------------------ one task
def run_task(plan: Plan, task: int, *, python: str = sys.executable, workers: int | None = None) -> int:
    """Preprocess task ``task``'s share; the exit code (75: stopped by a signal, to be requeued).

    Each attempt stages in a directory of its own and publishes it only if no other attempt has (a resubmission
    while an earlier copy of the task still runs, a requeue after a node failure): the first to finish wins, and
    the datasets of one attempt are never mixed with another's."""
    if not 0 <= task < plan.tasks:
        raise JobError(f"task {task}: the plan has tasks 0 to {plan.tasks - 1}")
    done, final = done_path(plan, task), Path(plan.output) / "datasets" / f"task-{task}"
    if done.exists():
        print(f"task {task}: done before ({done}); nothing to do")
        return ExitCode.OK
    seconds: float | None = None
    with _stoppable() as stop:
        if not final.exists():
            attempt = os.environ.get("SLURM_JOB_ID") or str(os.getpid())
            staging = Path(plan.output) / "job" / "staging" / f"task-{task}.{attempt}"
            shutil.rmtree(staging, ignore_errors=True)  # this attempt's own (a requeue keeps the job id)
            staging.mkdir(parents=True)
            share = plan.share(task)
            command = [python, "-m", "megatron_ext.cli.preprocess_data", "--input", *(f.path for f in share),
                       "--output-prefix", str(staging / PREFIX), "--output-per-file", "--input-root", plan.root,
                       *plan.preprocess_args]  # fmt: skip
            if workers is not None and _option(plan.preprocess_args, "--workers") is None:
                command += ["--workers", str(workers)]
            started = time.monotonic()
            rc = stop.run(command)
            if rc != 0 or stop.requested:
                shutil.rmtree(staging, ignore_errors=True)
                print(
                    f"task {task}: tools/preprocess_data.py exited {rc}; nothing of this task was kept", file=sys.stderr
                )
                return ExitCode.SAVED_AND_STOPPED if stop.requested else ExitCode.ERROR
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                staging.rename(final)  # all of the task's datasets at once, unless another attempt published first
            except OSError:
                if not final.exists():
                    raise
                shutil.rmtree(staging, ignore_errors=True)
                print(f"task {task}: another attempt published {final} first; this one's output was dropped")
            seconds = time.monotonic() - started
    report_file = final / f"{PREFIX}_preprocess_report.json"
    if not report_file.is_file():
        raise JobError(
            f"{final} holds no {report_file.name}: it is not a finished task's output. Move it aside and submit "
            "the job again"
        )
    report = json.loads(report_file.read_text(encoding="utf-8"))
    share = plan.share(task)
    record = {
        "task": task,
        "files": len(share),
        "bytes": sum(f.bytes for f in share),
        "documents": report.get("documents"),
        "tokens": report.get("tokens"),
        "seconds": seconds,  # None: published by an attempt that stopped before its record
        "host": socket.gethostname(),
    }
    done.parent.mkdir(parents=True, exist_ok=True)
    staged = done.with_name(f".{done.name}.{os.getpid()}")
    staged.write_text(json.dumps(record) + "\n", encoding="utf-8")
    os.replace(staged, done)
    rate = f" in {seconds:.1f} s ({record['bytes'] / max(seconds, 1e-9) / 1e6:.1f} MB/s)" if seconds else ""
    print(f"task {task}: {record['files']} files, {_size(record['bytes'])}{rate}")
    return ExitCode.OK


class _Stop:
    """SIGUSR1 (SLURM's warning before the time limit), SIGTERM or SIGINT, from the start of a task: a child
    running then is stopped with SIGTERM (``tools/preprocess_data.py`` then writes nothing); one not started yet
    never starts."""

    def __init__(self) -> None:
        self.requested = False
        self.child: subprocess.Popen[bytes] | None = None

    def handle(self, _signum: int, _frame: object) -> None:
        self.requested = True
        if self.child is not None:
            with contextlib.suppress(ProcessLookupError):
                self.child.send_signal(signal.SIGTERM)

    def run(self, command: list[str]) -> int:
        if self.requested:
            return 128 + signal.SIGTERM
        self.child = subprocess.Popen(command)  # a list: no shell
        return self.child.wait()


@contextlib.contextmanager
def _stoppable() -> Iterator[_Stop]:
    stop = _Stop()
    previous = {s: signal.signal(s, stop.handle) for s in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


# ------------------------------------------------------------------ the end
@dataclass(frozen=True)
class Finished:
    datasets: int
    documents: dict[str, int]
    tokens: dict[str, int]
    blends: list[str]
    merged: list[str]


def finish(plan: Plan, *, merge: bool) -> Finished:
    """Verify every dataset, write the blends (and merge); JobError names missing tasks or broken datasets."""
    from megatron_ext.data.blend_files import counts_of, weigh, write_blend

    missing = pending_tasks(plan)
    if missing:
        raise JobError(
            f"tasks {', '.join(map(str, missing))} of {plan.output} have not finished (no record in "
            f"{done_path(plan, missing[0]).parent}): submit the job again to run them alone"
        )
    documents, tokens, blends, merged = {}, {}, [], []
    for key in plan.keys:
        prefixes = [plan.dataset(f, key) for f in plan.files]
        problems, counted = [], []
        for prefix in prefixes:
            try:
                files = IndexedDatasetFiles.open(prefix)
                problems += [f"{prefix}: {p}" for p in files.verify()]
            except IndexedDatasetError as exc:
                problems.append(str(exc))
                continue
            counted.append(counts_of(files))  # each dataset opened once: verified, counted, weighed
        if problems:
            raise JobError(f"{len(problems)} problems in the datasets: " + "; ".join(problems[:5]))
        tokens[key] = sum(t for _, t, _ in counted)
        documents[key] = sum(d for _, _, d in counted)
        blend = blend_path(plan, key)
        if not blend.exists():
            write_blend(weigh(counted), blend)
        blends.append(str(blend))
        if merge:
            target = Path(plan.output) / f"{PREFIX}_{key}_document"
            if not Path(f"{target}.idx").exists():  # a finish run again keeps what the last one merged
                merge_datasets(prefixes, target)
            merged.append(str(target))
    return Finished(len(plan.files), documents, tokens, blends, merged)
