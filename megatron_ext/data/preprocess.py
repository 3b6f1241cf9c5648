"""Corpus files → Megatron indexed datasets: parallel, ordered, bounded in memory, atomic.

How the work is split (why it is fast):

* The input is cut into chunks of whole records (about ``chunk_bytes`` each;
  :mod:`megatron_ext.data.formats`). For plain JSON Lines a chunk is a byte
  range that the worker reads itself, so no text crosses a process boundary;
  ``.gz``/``.zst`` text is decompressed by the parent and Parquet/Arrow rows
  are sent as one Arrow IPC message per chunk.
* A worker parses, checks and tokenizes a chunk in a few native calls and
  sends back one flat token array and one length array per JSON key; long
  documents are tokenized a piece at a time
  (:mod:`megatron_ext.data.preprocess_worker`).
* The parent takes results in input order, appends tokens to the ``.bin``
  and spills lengths and document boundaries to temporary files
  (:class:`~megatron_ext.data.indexed.IndexedWriter`). At most ``2 × workers + 2``
  chunks are in flight, so memory does not grow with the corpus.
* Each worker has its own task queue and result pipe (:class:`WorkerPool`), so
  the parent knows which chunk every worker holds, sees a worker that dies
  (OOM killer, segfault) at once through its process sentinel, and can stop
  the others without any lock they share: a dead worker is a prompt error that
  names it, its signal and the file it was encoding, never a hang.

The bytes written equal Megatron-LM's ``tools/preprocess_data.py`` for the
same input, tokenizer and flags (see ``docs/data.md`` for the few deliberate
differences: bad lines are reported, not crashed on; every ``--json-keys``
index is written; order is kept with ``--partitions``).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import sys
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from megatron_ext.data import formats
from megatron_ext.data.atomic_files import HELD_SIGNALS, WriteError, replace_file, stage_file
from megatron_ext.data.formats import Chunk, InputError, InputFile
from megatron_ext.data.indexed import IndexedWriter, optimal_dtype, publish_all, stage_all
from megatron_ext.data.preprocess_worker import (
    MAX_EXAMPLES,
    REASONS,
    ChunkResult,
    TokenizerSpec,
    WorkerInputs,
    worker_main,
)
from megatron_ext.data.progress import Progress
from megatron_ext.data.tokenizer_base import Tokenizer


class PreprocessError(InputError):
    """Bad input or options; the message names the file, the line and the fix."""


class WorkerDied(PreprocessError):
    """A worker process ended without being asked to (killed by a signal, or crashed)."""


class Interrupted(KeyboardInterrupt):
    """SIGINT (Ctrl-C), SIGTERM or SIGHUP: clean up, write nothing. ``signum`` is the signal."""

    def __init__(self, message: str, signum: int = signal.SIGTERM) -> None:
        super().__init__(message)
        self.signum = signum


@dataclass(frozen=True)
class Options:
    inputs: tuple[str, ...]
    output_prefix: str
    json_keys: tuple[str, ...] = ("text",)
    append_eod: bool = False
    workers: int = 1
    skip_bad_lines: bool = False
    chunk_bytes: int = 1 << 20
    log_interval: int = 1000
    quiet: bool = False
    level: str = "document"
    allow_empty: bool = False
    """Publish empty datasets when no document has a token (default: an error, nothing written)."""
    input_format: str | None = None
    """One of ``formats.FORMATS`` for every input (default: each file's name says)."""
    output_per_file: bool = False
    """One dataset per input file and key, ``{output_prefix}_{name}_{key}_document`` (see ``formats.output_labels``)."""
    input_root: str | None = None
    """With ``output_per_file``: names are paths below this directory (default: the inputs' common directory)."""


@dataclass
class Summary:
    """What a run did; also written as JSON next to the outputs."""

    outputs: dict[str, str]
    documents: int
    lines: int
    input_bytes: int
    tokens: dict[str, int]
    empty_documents: dict[str, int]
    skipped: dict[str, int]
    skipped_examples: list[dict[str, Any]]
    seconds: float
    tokenizer: str
    dtype: str

    def to_json(self) -> dict[str, Any]:
        return {
            "outputs": self.outputs,
            "documents": self.documents,
            "lines": self.lines,
            "input_bytes": self.input_bytes,
            "tokens": self.tokens,
            "empty_documents": self.empty_documents,
            "skipped": self.skipped,
            "skipped_examples": self.skipped_examples,
            "seconds": round(self.seconds, 3),
            "mb_per_s": round(self.input_bytes / max(self.seconds, 1e-9) / 1e6, 3),
            "tokenizer": self.tokenizer,
            "dtype": self.dtype,
        }


# ------------------------------------------------------------------ inputs
def plan_chunks(files: Sequence[InputFile], keys: Sequence[str], chunk_bytes: int) -> Iterator[Chunk]:
    """Every chunk of every input in order, numbered; ``position`` counts the bytes of all inputs before."""
    seq = 0
    position = 0
    for file_id, file in enumerate(files):
        for chunk in formats.chunks(file, file_id, keys, chunk_bytes):
            chunk.seq = seq
            seq += 1
            chunk.position += position
            yield chunk
        position += file.size


# ------------------------------------------------------------------ workers
def _death_message(pid: int, exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        num = -exitcode
        try:
            name = signal.Signals(num).name
        except ValueError:
            name = f"signal {num}"
        causes: dict[int, str] = {
            signal.SIGKILL: "likely out of memory: the kernel's OOM killer sends SIGKILL",
            signal.SIGSEGV: "a crash in native code",
            signal.SIGBUS: "a crash in native code, or an input file truncated while being read",
            signal.SIGABRT: "a crash in native code",
        }
        why = causes.get(num, "sent by another process")
        return f"worker pid {pid} died with signal {num} ({name}, {why})"
    return f"worker pid {pid} exited unexpectedly with code {exitcode}"


@dataclass
class _Worker:
    process: Any
    tasks: Any
    results: Any
    held: deque[Chunk] = field(default_factory=deque)
    """Chunks sent to this worker whose result has not come back, oldest first."""


class WorkerPool:
    """Worker processes, each with its own task queue and result pipe.

    Unlike ``multiprocessing.Pool`` nothing is shared between workers (no
    common queue, no lock), so a worker killed at any moment cannot block the
    others or the parent; the parent waits on the result pipes and the process
    sentinels together, so a death is seen at once, and it knows which chunks
    the dead worker held. Results come back in any order; the caller orders
    them by ``seq``.
    """

    def __init__(
        self,
        ctx: Any,
        workers: int,
        files: list[Path],
        inputs: WorkerInputs,
        tokenizer: Tokenizer | None = None,
        per_worker: int = 2,
    ) -> None:
        """Start ``workers`` processes in ``ctx``, each given ``inputs`` once. ``tokenizer`` (the parent's)
        is shared with forked processes, which then need not build their own; a spawned process
        builds it from ``inputs.spec`` (a tokenizer is never pickled)."""
        self.files = files
        self.per_worker = per_worker
        self.workers: list[_Worker] = []
        shared = tokenizer if ctx.get_start_method() == "fork" else None
        try:
            for _ in range(workers):
                tasks = ctx.Queue()  # its feeder thread: the parent never blocks on a full pipe
                receive, send = ctx.Pipe(duplex=False)
                process = ctx.Process(target=worker_main, args=(tasks, send, inputs, shared), daemon=True)
                process.start()
                send.close()  # the worker holds the only write end: EOF as soon as it dies
                self.workers.append(_Worker(process, tasks, receive))
        except BaseException:
            self.kill()
            raise

    def submit(self, chunk: Chunk) -> bool:
        """Send ``chunk`` to the least busy worker; False when every worker already holds ``per_worker``."""
        worker = min(self.workers, key=lambda w: len(w.held))
        if len(worker.held) >= self.per_worker:
            return False
        worker.held.append(chunk)
        worker.tasks.put(chunk)
        return True

    def collect(self, timeout: float | None = None) -> list[ChunkResult]:
        """The results that have arrived (waiting up to ``timeout`` for one); raise if a worker died or failed."""
        pipes = {w.results: w for w in self.workers if w.held}
        sentinels = {w.process.sentinel: w for w in self.workers}
        ready = mp.connection.wait([*pipes, *sentinels], timeout)
        results: list[ChunkResult] = []
        for obj in ready:
            if obj in pipes:
                worker = pipes[obj]
                try:
                    message: Any = worker.results.recv()
                except (EOFError, OSError):
                    self._died(worker)
                result = self._result(worker, message)
                done = worker.held.popleft()
                assert done.seq == result.seq, (done.seq, result.seq)
                results.append(result)
        for obj in ready:
            if obj in sentinels:
                self._died(sentinels[obj])
        return results

    @staticmethod
    def _result(worker: _Worker, message: tuple[Any, ...]) -> ChunkResult:
        if message[0] == "error":
            _, exc, text = message
            raise exc from RuntimeError(f"in worker pid {worker.process.pid}:\n{text}")
        return message[1]

    def _died(self, worker: _Worker) -> NoReturn:
        with contextlib.suppress(EOFError, OSError):
            if worker.results.poll(0):  # an exception it sent before exiting (e.g. while starting)
                self._result(worker, worker.results.recv())
        worker.process.join(5)
        message = _death_message(worker.process.pid, worker.process.exitcode)
        if worker.held:
            chunk = worker.held[0]
            path = self.files[chunk.file_id]
            if chunk.data is None:
                where = f"bytes {chunk.start:,}-{chunk.end:,}"
            else:
                where = "a run of its rows" if chunk.table else "a block of its decompressed text"
            message += f" while encoding {path} ({where})"
        else:
            message += " while idle"
        raise WorkerDied(
            f"{message}. Nothing was written. If memory is short, run with fewer --workers or a smaller --chunk-mb"
        )

    def close(self) -> None:
        """Let every worker finish and exit (all results have been collected)."""
        for w in self.workers:
            w.tasks.put(None)
        for w in self.workers:
            w.tasks.close()
            w.tasks.join_thread()
        for w in self.workers:
            w.process.join(30)
            if w.process.exitcode is None:
                w.process.kill()
                w.process.join()
            w.results.close()
        self.workers = []

    def kill(self) -> None:
        """Stop every worker now (SIGKILL) and release the queues without waiting on them."""
        for w in self.workers:
            if w.process.exitcode is None:
                w.process.kill()
        for w in self.workers:
            w.process.join()
            w.tasks.cancel_join_thread()  # a feeder blocked on a dead worker's pipe must not hold up exit
            w.tasks.close()
            w.results.close()
        self.workers = []


# ------------------------------------------------------------------ parent
def output_prefix_for(output_prefix: str, key: str, level: str = "document") -> str:
    return f"{output_prefix}_{key}_{level}"


_stopped: list[int] = []
"""Signals received during :func:`run` (the handler also raises; see :func:`_check_stopped`)."""


def _raise_on_signal(signum: int, frame: Any) -> None:
    _stopped.append(signum)
    raise Interrupted(f"stopped by signal {signal.Signals(signum).name}", signum)


def _check_stopped() -> None:
    """Raise for a signal whose exception was swallowed: a handler that runs inside a finalizer
    (``__del__``, a generator's close) has its exception ignored, and the run would go on."""
    if _stopped:
        raise Interrupted(f"stopped by signal {signal.Signals(_stopped[0]).name}", _stopped[0])


class _Outputs:
    """The datasets being written: one per key for the run, or one per key and input (``--output-per-file``).

    Per-file datasets are staged (complete, synced, under hidden names, no file
    descriptor left open) as soon as their input is done, and all of them are
    published together at the end, so thousands of inputs need no more open
    files than one and an interrupted run still leaves nothing behind.
    """

    def __init__(self, opts: Options, files: list[InputFile], dtype: Any) -> None:
        self.opts = opts
        self.files = files
        self.dtype = dtype
        self.labels = formats.output_labels(files, opts.input_root) if opts.output_per_file else None
        self.staged: list[IndexedWriter] = []
        self.current: dict[str, IndexedWriter] = {}
        self.file_id = -1
        """The input whose datasets are open (per-file mode); -1 before the first."""
        self.outputs: dict[str, str] = {}

    def _open(self, label: str | None) -> dict[str, IndexedWriter]:
        base = self.opts.output_prefix if label is None else f"{self.opts.output_prefix}_{label}"
        writers = {}
        for key in self.opts.json_keys:
            prefix = output_prefix_for(base, key, self.opts.level)
            self.outputs[key if label is None else f"{label}:{key}"] = prefix
            writers[key] = IndexedWriter(prefix, self.dtype)
        return writers

    def for_file(self, file_id: int) -> dict[str, IndexedWriter]:
        """The writers that take the documents of input ``file_id`` (inputs come in order)."""
        if self.labels is None:
            if not self.current:
                self.current = self._open(None)
            return self.current
        while self.file_id < file_id:
            self._stage_current()
            self.file_id += 1
            self.current = self._open(self.labels[self.file_id])
        return self.current

    def _stage_current(self) -> None:
        if not self.current:
            return
        per_file = self.labels is not None  # one dataset for the run: _drive has refused an empty one
        if per_file and not self.opts.allow_empty and all(w.num_tokens == 0 for w in self.current.values()):
            raise PreprocessError(
                f"{self.files[self.file_id].path} has no document with any token, so its datasets would be empty "
                "(--output-per-file). Nothing was written. Leave it out of --input, or pass --allow-empty-output"
            )
        writers = list(self.current.values())
        self.current = {}
        self.staged.extend(writers)  # first: discard() must find them if staging fails half-way
        stage_all(writers)

    def stage(self) -> None:
        """Complete and sync every dataset under hidden names (where a full disk fails, if it does)."""
        if self.labels is None:
            self.for_file(0)
        else:
            self.for_file(len(self.files) - 1)  # inputs that gave no chunk at the end still get their datasets
        self._stage_current()

    def publish(self) -> None:
        """Rename every staged dataset to its final names (all of them or, on an error, none)."""
        publish_all(self.staged)

    def discard(self) -> None:
        for w in [*self.staged, *self.current.values()]:
            w.discard()


def run(spec: TokenizerSpec, opts: Options, report: Path | None = None) -> Summary:
    """Preprocess ``opts.inputs`` into one dataset per JSON key (and input file); return what was done.

    With ``report`` the summary is written there as JSON, staged with the
    datasets and published right after them (see :func:`report_path`).

    Raises :class:`~megatron_ext.data.formats.InputError` for bad input (strict
    mode), :class:`~megatron_ext.data.atomic_files.WriteError` when the output's
    filesystem refuses a write (full, read-only, not permitted) and
    :class:`Interrupted`/``KeyboardInterrupt`` when stopped; in all these
    cases nothing is left at the output paths, nor any temporary file of the run.
    """
    if opts.workers < 1:
        raise PreprocessError(f"--workers must be at least 1, got {opts.workers}")
    files = formats.open_inputs(opts.inputs, opts.input_format, opts.json_keys)
    out_dir = Path(opts.output_prefix).parent
    if not out_dir.is_dir():
        raise PreprocessError(f"output directory {out_dir} does not exist (from --output-prefix {opts.output_prefix})")
    tokenizer = spec.build()
    dtype = optimal_dtype(tokenizer.vocab_size)
    total = sum(f.size for f in files)
    progress = Progress(total_bytes=total, log_interval=opts.log_interval, quiet=opts.quiet)
    outputs = _Outputs(opts, files, dtype)
    if not opts.quiet:
        kinds = ", ".join(f"{n} {fmt}" for fmt, n in Counter(f.format for f in files).items())
        print(
            f"preprocessing {len(files)} file(s) ({kinds}), {total / 1e6:,.1f} MB, with {opts.workers} worker(s); "
            f"tokenizer {tokenizer.describe()}; token dtype {np.dtype(dtype).name}",
            file=sys.stderr,
        )

    _stopped.clear()
    # The signals that stop a run are those held while outputs are named (atomic_files.HELD_SIGNALS).
    old_handlers = {s: signal.signal(s, _raise_on_signal) for s in HELD_SIGNALS}
    pool: WorkerPool | None = None
    staged_report: Path | None = None
    try:
        if opts.workers > 1:
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        paths = [f.path for f in files]
        inputs = WorkerInputs(
            spec=spec,
            files=tuple(str(p) for p in paths),
            json_keys=tuple(opts.json_keys),
            skip_bad_lines=opts.skip_bad_lines,
            append_eod=opts.append_eod,
            dtype=dtype,
        )
        pool = WorkerPool(ctx, opts.workers, paths, inputs, tokenizer)
        summary = _drive(pool, files, opts, outputs, progress)
        pool.close()
        pool = None
        _check_stopped()
        outputs.stage()
        summary.seconds = progress.elapsed
        summary.tokenizer = tokenizer.describe()
        summary.dtype = np.dtype(dtype).name
        summary.outputs = outputs.outputs
        if report is not None:  # staged before anything is published: a full disk fails here, not after
            staged_report = stage_file(report, (json.dumps(summary.to_json(), indent=2) + "\n").encode())
        outputs.publish()
        if staged_report is not None:
            assert report is not None
            try:
                os.replace(staged_report, report)
            except OSError as exc:  # after the datasets: they stay, complete; say so
                raise WriteError(report, exc, "the datasets were published complete") from None
            staged_report = None
    except BaseException:
        if pool is not None:
            pool.kill()
        outputs.discard()
        if staged_report is not None:
            with contextlib.suppress(OSError):
                staged_report.unlink()
        raise
    finally:
        for s, h in old_handlers.items():
            signal.signal(s, h)
        progress.close()
    return summary


def _drive(pool: WorkerPool, files: list[InputFile], opts: Options, outputs: _Outputs, progress: Progress) -> Summary:
    records_before = [0] * len(files)
    skipped: Counter[str] = Counter()
    examples: list[dict[str, Any]] = []
    empty: Counter[str] = Counter()
    tokens: Counter[str] = Counter()
    documents = lines = nbytes = 0
    window: deque[Chunk] = deque()  # sent, not yet written; in input order
    arrived: dict[int, ChunkResult] = {}
    chunks = plan_chunks(files, opts.json_keys, opts.chunk_bytes)
    depth = 2 * opts.workers + 2
    upcoming: Chunk | None = next(chunks, None)

    def submit() -> None:
        nonlocal upcoming
        while upcoming is not None and len(window) < depth and pool.submit(upcoming):
            window.append(upcoming)
            upcoming = next(chunks, None)

    submit()
    while window:
        chunk = window[0]
        while chunk.seq not in arrived:
            for got in pool.collect():
                arrived[got.seq] = got
            submit()
            _check_stopped()
        window.popleft()
        result = arrived.pop(chunk.seq)
        file = files[chunk.file_id]
        first = records_before[chunk.file_id]
        for n, reason, detail in result.examples:
            if not opts.skip_bad_lines:
                what = "row" if file.table else "line"
                raise PreprocessError(
                    f"{file.where(first + n)}: {detail}. Nothing was written. Fix or remove the {what}, or pass "
                    f"--skip-bad-lines to skip bad {what}s and count them"
                )
            if len(examples) < MAX_EXAMPLES:
                place = {"row": first + n} if file.table else {"line": first + n + 1}
                examples.append({"file": str(file.path), **place, "reason": reason, "detail": detail})
        skipped.update(result.skipped)
        writers = outputs.for_file(chunk.file_id)
        for key, writer in writers.items():
            writer.add_documents(result.tokens[key], result.lengths[key])
            empty[key] += result.empty[key]
            tokens[key] += result.tokens[key].size
        docs = len(next(iter(result.lengths.values())))
        documents += docs
        lines += result.lines
        nbytes += result.nbytes
        records_before[chunk.file_id] += result.lines
        progress.update(
            docs=docs, nbytes=result.nbytes, tokens=sum(t.size for t in result.tokens.values()), position=chunk.position
        )
        submit()
    if not opts.allow_empty and not any(tokens.values()):
        bad = sum(skipped.values())
        tables = {f.table for f in files}
        noun = "record" if len(tables) > 1 else "row" if True in tables else "line"
        raise PreprocessError(
            f"no document with any token in {len(files)} input file(s) ({lines:,} {noun}s"
            + (f", {bad:,} bad {noun}s skipped" if bad else "")
            + (f", {sum(empty.values()):,} empty documents" if any(empty.values()) else "")
            + "). Nothing was written. Check --input and --json-keys, or pass --allow-empty-output to write "
            "empty datasets"
        )
    return Summary(
        outputs={},
        documents=documents,
        lines=lines,
        input_bytes=nbytes,
        tokens={k: tokens[k] for k in opts.json_keys},
        empty_documents=dict(empty),
        skipped={r: skipped.get(r, 0) for r in REASONS},
        skipped_examples=examples,
        seconds=0.0,
        tokenizer="",
        dtype="",
    )


def write_report(summary: Summary, path: Path) -> None:
    """The run's counts as JSON, written atomically (:func:`run` does this itself when given ``report``).

    A refusal of the filesystem is a :class:`~megatron_ext.data.atomic_files.WriteError`; nothing is left behind.
    """
    replace_file(path, (json.dumps(summary.to_json(), indent=2) + "\n").encode())


def report_path(output_prefix: str) -> Path:
    return Path(f"{output_prefix}_preprocess_report.json")
