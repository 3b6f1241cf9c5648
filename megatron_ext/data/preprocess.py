"""JSON Lines → Megatron indexed datasets: parallel, ordered, bounded in memory, atomic.

How the work is split (why it is fast):

* The input is cut into chunks of whole lines (about ``chunk_bytes`` each).
  For plain files a chunk is a byte range that the worker reads itself, so
  no text crosses a process boundary; ``.gz`` files are read by the parent
  and sent as one bytes object per chunk.
* A worker decodes the chunk at once, parses each line with the stdlib
  ``json``, checks it, and encodes all texts of the chunk in one native call
  (SentencePiece's batch encoder returns int32 buffers). It sends back one
  flat token array and one length array per JSON key: a few pickled buffers
  per chunk instead of a Python list per document.
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
import ctypes
import glob
import gzip
import json
import multiprocessing as mp
import multiprocessing.connection
import os
import re
import signal
import sys
import traceback
import zlib
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from megatron_ext.data.indexed import IndexedWriter, commit_all, optimal_dtype
from megatron_ext.data.progress import Progress
from megatron_ext.data.tokenizers import Tokenizer, build_tokenizer

REASONS = ("invalid_utf8", "not_json", "missing_key", "non_string", "tokenize_error")
"""Why a line is bad (the keys of the report's ``skipped`` counts)."""

_SURROGATE = re.compile("[\ud800-\udfff]")
_MAX_EXAMPLES = 20


class PreprocessError(RuntimeError):
    """Bad input or options; the message names the file, the line and the fix."""


class WorkerDied(PreprocessError):
    """A worker process ended without being asked to (killed by a signal, or crashed)."""


class Interrupted(KeyboardInterrupt):
    """SIGTERM/SIGHUP, handled like Ctrl-C: clean up, write nothing. ``signum`` is the signal."""

    def __init__(self, message: str, signum: int = signal.SIGTERM) -> None:
        super().__init__(message)
        self.signum = signum


@dataclass(frozen=True)
class TokenizerSpec:
    """Everything needed to rebuild the tokenizer in a worker."""

    tokenizer_type: str
    tokenizer_model: str | None = None
    vocab_file: str | None = None
    merge_file: str | None = None
    vocab_size: int | None = None

    def build(self) -> Tokenizer:
        return build_tokenizer(
            self.tokenizer_type,
            tokenizer_model=self.tokenizer_model,
            vocab_file=self.vocab_file,
            merge_file=self.merge_file,
            vocab_size=self.vocab_size,
        )


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


@dataclass
class Chunk:
    """Whole lines of one input: a byte range of a plain file, or the bytes themselves (.gz)."""

    seq: int
    file_id: int
    start: int
    end: int
    data: bytes | None = None
    position: int = 0
    """Input position after this chunk (for the progress bar)."""


@dataclass
class ChunkResult:
    seq: int
    lines: int
    nbytes: int
    tokens: dict[str, np.ndarray]
    lengths: dict[str, np.ndarray]
    empty: dict[str, int]
    skipped: Counter[str] = field(default_factory=Counter)
    examples: list[tuple[int, str, str]] = field(default_factory=list)
    """(line index in the chunk, reason, detail) of bad lines, first few only."""


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
def expand_inputs(patterns: Sequence[str]) -> list[Path]:
    """Files named by paths or globs, in sorted order per pattern; a clear error if none."""
    files: list[Path] = []
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches = sorted(glob.glob(pattern))
            for m in matches:
                if Path(m).is_symlink() and not Path(m).exists():
                    raise PreprocessError(
                        f"--input {pattern!r}: {m} is a symbolic link that leads nowhere (broken, or a loop); "
                        "fix or remove it"
                    )
            found = [Path(m) for m in matches if Path(m).is_file()]
            if not found:
                what = f"only directories ({', '.join(matches[:3])}{', …' if len(matches) > 3 else ''})"
                raise PreprocessError(f"--input {pattern!r} matches {what if matches else 'nothing'}, no file")
            files.extend(found)
        else:
            path = Path(pattern)
            if not path.is_file():
                raise PreprocessError(f"--input {pattern}: no such file")
            files.append(path)
    return files


def _plain_chunks(path: Path, file_id: int, chunk_bytes: int, seq0: int) -> Iterator[Chunk]:
    """Byte ranges of whole lines: each cut moves forward to just after a newline."""
    size = path.stat().st_size
    start = 0
    seq = seq0
    with open(path, "rb") as f:
        while start < size:
            end = min(start + chunk_bytes, size)
            if end < size:
                f.seek(end)
                rest = f.readline()
                end += len(rest)
            yield Chunk(seq=seq, file_id=file_id, start=start, end=end, position=end)
            seq += 1
            start = end


def _gzip_chunks(path: Path, file_id: int, chunk_bytes: int, seq0: int) -> Iterator[Chunk]:
    """Decompressed lines, about ``chunk_bytes`` per chunk; position is the compressed offset."""
    seq = seq0
    with open(path, "rb") as raw, gzip.open(raw, "rb") as f:
        while True:
            try:
                data = f.read(chunk_bytes)
                if data and not data.endswith(b"\n"):
                    data += f.readline()
            except (EOFError, OSError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
                raise PreprocessError(
                    f"{path}: the gzip stream is truncated or damaged after {raw.tell():,} compressed bytes "
                    f"({exc}). Nothing was written. Download or compress it again"
                ) from None
            if not data:
                return
            yield Chunk(seq=seq, file_id=file_id, start=0, end=len(data), data=data, position=raw.tell())
            seq += 1


def plan_chunks(files: Sequence[Path], chunk_bytes: int) -> Iterator[Chunk]:
    seq = 0
    position = 0
    for file_id, path in enumerate(files):
        gen = _gzip_chunks if path.suffix == ".gz" else _plain_chunks
        for chunk in gen(path, file_id, chunk_bytes, seq):
            seq = chunk.seq + 1
            chunk.position += position
            yield chunk
        position += path.stat().st_size


# ------------------------------------------------------------------ worker
_W: dict[str, Any] = {}


def _set_parent_death_signal() -> None:
    """Linux: die with the parent, so a ``kill -9`` of the tool leaves no orphan workers."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _worker_init(spec: TokenizerSpec, files: list[str], opts: Options, dtype: Any) -> None:
    # Stopping is the parent's job (it kills us with SIGKILL; we die with it by PR_SET_PDEATHSIG): a
    # Ctrl-C, hang-up or scancel that signals the whole process group must not look like a crashed worker.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    _set_parent_death_signal()
    if _W.get("spec") != spec:  # inherited through fork when possible
        _W["tokenizer"] = spec.build()
        _W["spec"] = spec
    _W.update(files=files, opts=opts, dtype=dtype)


def _picklable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a RuntimeError with its text."""
    try:
        from multiprocessing.reduction import ForkingPickler

        ForkingPickler.loads(ForkingPickler.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _worker_main(tasks: Any, results: Any, spec: TokenizerSpec, files: list[str], opts: Options, dtype: Any) -> None:
    """A worker: chunks from its own queue, one result (or the exception) per chunk on its own pipe."""
    try:
        _worker_init(spec, files, opts, dtype)
        while (chunk := tasks.get()) is not None:
            results.send(("ok", process_chunk(chunk)))
    except BaseException as exc:  # sent to the parent, which raises it
        with contextlib.suppress(Exception):
            results.send(("error", _picklable(exc), traceback.format_exc()))


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

    def __init__(self, ctx: Any, workers: int, files: list[Path], init: tuple[Any, ...], per_worker: int = 2) -> None:
        self.files = files
        self.per_worker = per_worker
        self.workers: list[_Worker] = []
        try:
            for _ in range(workers):
                tasks = ctx.Queue()  # its feeder thread: the parent never blocks on a full pipe
                receive, send = ctx.Pipe(duplex=False)
                process = ctx.Process(target=_worker_main, args=(tasks, send, *init), daemon=True)
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
            where = f"bytes {chunk.start:,}-{chunk.end:,}" if chunk.data is None else "a block of its decompressed text"
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


def _decode_lines(data: bytes) -> list[str | UnicodeDecodeError]:
    """Lines of a chunk as text; an undecodable line becomes its error."""
    try:
        lines: list[Any] = data.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        lines = []
        for raw in data.split(b"\n"):
            try:
                lines.append(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                lines.append(exc)
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return lines


def _check_line(line: str | UnicodeDecodeError, keys: tuple[str, ...]) -> tuple[list[str] | None, str, str]:
    """(texts per key, "", "") for a good line, else (None, reason, detail)."""
    if isinstance(line, UnicodeDecodeError):
        return None, "invalid_utf8", f"invalid UTF-8 byte {line.object[line.start]:#04x} at byte {line.start}"
    if not line.strip():
        return None, "not_json", "blank line (every line must be one JSON object)"
    try:
        obj = json.loads(line)
    except ValueError as exc:
        detail = f"{exc.msg} at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else str(exc)
        return None, "not_json", f"not JSON: {detail}"
    if not isinstance(obj, dict):
        return None, "not_json", f"a JSON {type(obj).__name__}, not an object"
    texts = []
    for key in keys:
        if key not in obj:
            shown = ", ".join(repr(k) for k in list(obj)[:5])
            return None, "missing_key", f"no key {key!r} (it has {shown or 'no keys'}); see --json-keys"
        value = obj[key]
        if not isinstance(value, str):
            return None, "non_string", f"key {key!r} holds a JSON {type(value).__name__}, not a string"
        # Only a \\u escape can put a lone surrogate into decoded text.
        if "\\u" in line and (bad := _SURROGATE.search(value)) is not None:
            return None, "invalid_utf8", f"key {key!r} holds a lone surrogate \\u{ord(bad.group()):04x} (not UTF-8)"
        texts.append(value)
    return texts, "", ""


def _tokenize_checked(
    tokenizer: Tokenizer, texts: list[str], vocab_size: int
) -> tuple[list[np.ndarray], dict[int, str]]:
    """Encode a batch; on failure find the texts that fail (index → reason) and encode the rest."""
    failures: dict[int, str] = {}
    try:
        arrays = tokenizer.tokenize_batch(texts)
    except Exception:
        arrays = []
        for i, text in enumerate(texts):
            try:
                arrays.append(np.asarray(tokenizer.tokenize(text), dtype=np.int64))
            except Exception as exc:
                failures[i] = f"{type(exc).__name__}: {exc}"[:200]
                arrays.append(np.zeros(0, dtype=np.int32))
    for i, arr in enumerate(arrays):
        if arr.size and (int(arr.max()) >= vocab_size or int(arr.min()) < 0):
            failures[i] = (
                f"token id {int(arr.max()) if arr.max() >= vocab_size else int(arr.min())} is outside the vocabulary [0, {vocab_size})"
            )
    return arrays, failures


def process_chunk(chunk: Chunk) -> ChunkResult:
    """Parse, check and encode one chunk (runs in a worker)."""
    opts: Options = _W["opts"]
    tokenizer: Tokenizer = _W["tokenizer"]
    dtype = _W["dtype"]
    keys = opts.json_keys
    if chunk.data is not None:
        data = chunk.data
    else:
        with open(_W["files"][chunk.file_id], "rb") as f:
            f.seek(chunk.start)
            data = f.read(chunk.end - chunk.start)
    lines = _decode_lines(data)

    skipped: Counter[str] = Counter()
    examples: list[tuple[int, str, str]] = []
    line_of_doc: list[int] = []
    texts: list[list[str]] = [[] for _ in keys]
    for n, line in enumerate(lines):
        got, reason, detail = _check_line(line, keys)
        if got is None:
            skipped[reason] += 1
            if len(examples) < _MAX_EXAMPLES:
                examples.append((n, reason, detail))
            if not opts.skip_bad_lines:
                break  # the parent stops at the first bad line
            continue
        line_of_doc.append(n)
        for k, text in enumerate(got):
            texts[k].append(text)

    result = ChunkResult(
        seq=chunk.seq, lines=len(lines), nbytes=len(data), tokens={}, lengths={}, empty={}, skipped=skipped
    )
    if skipped and not opts.skip_bad_lines:
        result.examples = examples
        return result

    vocab_size = tokenizer.vocab_size
    per_key: list[list[np.ndarray]] = []
    bad_docs: dict[int, str] = {}
    for k in range(len(keys)):
        arrays, failures = _tokenize_checked(tokenizer, texts[k], vocab_size)
        for i, why in failures.items():
            bad_docs.setdefault(i, f"key {keys[k]!r}: {why}")
        per_key.append(arrays)
    if bad_docs:
        for i in sorted(bad_docs):
            skipped["tokenize_error"] += 1
            if len(examples) < _MAX_EXAMPLES:
                examples.append((line_of_doc[i], "tokenize_error", bad_docs[i]))
        if not opts.skip_bad_lines:
            examples.sort()
            result.examples = examples[:1]
            return result
    examples.sort()
    result.examples = examples

    eod = np.array([tokenizer.eod], dtype=np.int32)
    for k, key in enumerate(keys):
        pieces: list[np.ndarray] = []
        lengths = np.zeros(len(per_key[k]), dtype=np.int64)
        empty = 0
        for i, arr in enumerate(per_key[k]):
            if i in bad_docs:
                lengths[i] = -1
                continue
            if arr.size == 0:
                empty += 1  # no tokens: a document boundary with no sequence, as Megatron-LM writes it
                continue
            pieces.append(arr)
            if opts.append_eod:
                pieces.append(eod)
            lengths[i] = arr.size + opts.append_eod
        lengths = lengths[lengths >= 0]
        tokens = np.concatenate(pieces).astype(dtype, copy=False) if pieces else np.zeros(0, dtype=dtype)
        result.tokens[key] = tokens
        result.lengths[key] = lengths
        result.empty[key] = empty
    return result


# ------------------------------------------------------------------ parent
def output_prefix_for(output_prefix: str, key: str, level: str = "document") -> str:
    return f"{output_prefix}_{key}_{level}"


def _raise_on_signal(signum: int, frame: Any) -> None:
    raise Interrupted(f"stopped by signal {signal.Signals(signum).name}", signum)


def run(spec: TokenizerSpec, opts: Options) -> Summary:
    """Preprocess ``opts.inputs`` into one dataset per JSON key; return what was done.

    Raises :class:`PreprocessError` for bad input (strict mode) and
    :class:`Interrupted`/``KeyboardInterrupt`` when stopped; in both cases
    nothing is left at the output paths.
    """
    if opts.workers < 1:
        raise PreprocessError(f"--workers must be at least 1, got {opts.workers}")
    files = expand_inputs(opts.inputs)
    out_dir = Path(opts.output_prefix).parent
    if not out_dir.is_dir():
        raise PreprocessError(f"output directory {out_dir} does not exist (from --output-prefix {opts.output_prefix})")
    tokenizer = spec.build()
    dtype = optimal_dtype(tokenizer.vocab_size)
    total = sum(p.stat().st_size for p in files)
    progress = Progress(total_bytes=total, log_interval=opts.log_interval, quiet=opts.quiet)
    if not opts.quiet:
        print(
            f"preprocessing {len(files)} file(s), {total / 1e6:,.1f} MB, with {opts.workers} worker(s); "
            f"tokenizer {tokenizer.describe()}; token dtype {np.dtype(dtype).name}",
            file=sys.stderr,
        )

    old_handlers = {s: signal.signal(s, _raise_on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    writers: dict[str, IndexedWriter] = {}
    pool: WorkerPool | None = None
    try:
        writers = {
            key: IndexedWriter(output_prefix_for(opts.output_prefix, key, opts.level), dtype) for key in opts.json_keys
        }
        if opts.workers > 1:
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        _W.update(tokenizer=tokenizer, spec=spec)  # inherited by forked workers
        pool = WorkerPool(ctx, opts.workers, files, (spec, [str(f) for f in files], opts, dtype))
        summary = _drive(pool, files, opts, writers, progress)
        pool.close()
        pool = None
        commit_all(list(writers.values()))
    except BaseException:
        if pool is not None:
            pool.kill()
        for w in writers.values():
            w.discard()
        raise
    finally:
        for s, h in old_handlers.items():
            signal.signal(s, h)
        progress.close()

    summary.seconds = progress.elapsed
    summary.tokenizer = tokenizer.describe()
    summary.dtype = np.dtype(dtype).name
    summary.outputs = {k: output_prefix_for(opts.output_prefix, k, opts.level) for k in opts.json_keys}
    return summary


def _drive(
    pool: WorkerPool, files: list[Path], opts: Options, writers: dict[str, IndexedWriter], progress: Progress
) -> Summary:
    lines_before = [0] * len(files)
    skipped: Counter[str] = Counter()
    examples: list[dict[str, Any]] = []
    empty: Counter[str] = Counter()
    documents = lines = nbytes = 0
    window: deque[Chunk] = deque()  # sent, not yet written; in input order
    arrived: dict[int, ChunkResult] = {}
    chunks = plan_chunks(files, opts.chunk_bytes)
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
        window.popleft()
        result = arrived.pop(chunk.seq)
        first_line = lines_before[chunk.file_id]
        for n, reason, detail in result.examples:
            where = f"{files[chunk.file_id]}:{first_line + n + 1}"
            if not opts.skip_bad_lines:
                raise PreprocessError(
                    f"{where}: {detail}. Nothing was written. Fix or remove the line, or pass --skip-bad-lines "
                    "to skip bad lines and count them"
                )
            if len(examples) < _MAX_EXAMPLES:
                examples.append(
                    {"file": str(files[chunk.file_id]), "line": first_line + n + 1, "reason": reason, "detail": detail}
                )
        skipped.update(result.skipped)
        for key, writer in writers.items():
            writer.add_documents(result.tokens[key], result.lengths[key])
            empty[key] += result.empty[key]
        docs = len(next(iter(result.lengths.values())))
        documents += docs
        lines += result.lines
        nbytes += result.nbytes
        lines_before[chunk.file_id] += result.lines
        progress.update(
            docs=docs, nbytes=result.nbytes, tokens=sum(t.size for t in result.tokens.values()), position=chunk.position
        )
        submit()
    if not opts.allow_empty and all(w.num_tokens == 0 for w in writers.values()):
        bad = sum(skipped.values())
        raise PreprocessError(
            f"no document with any token in {len(files)} input file(s) ({lines:,} lines"
            + (f", {bad:,} bad lines skipped" if bad else "")
            + (f", {sum(empty.values()):,} empty documents" if any(empty.values()) else "")
            + "). Nothing was written. Check --input and --json-keys, or pass --allow-empty-output to write "
            "empty datasets"
        )
    return Summary(
        outputs={},
        documents=documents,
        lines=lines,
        input_bytes=nbytes,
        tokens={k: w.num_tokens for k, w in writers.items()},
        empty_documents=dict(empty),
        skipped={r: skipped.get(r, 0) for r in REASONS},
        skipped_examples=examples,
        seconds=0.0,
        tokenizer="",
        dtype="",
    )


def write_report(summary: Summary, path: Path) -> None:
    """The run's counts as JSON, written atomically."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(summary.to_json(), indent=2) + "\n")
    os.replace(tmp, path)


def report_path(output_prefix: str) -> Path:
    return Path(f"{output_prefix}_preprocess_report.json")
