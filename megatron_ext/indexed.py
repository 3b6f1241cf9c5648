"""Megatron's indexed dataset format (``.bin`` + ``.idx``), written in bounded memory.

The format (Megatron-Core ``megatron/core/datasets/indexed_dataset.py``)::

    .bin   the token ids of every sequence, back to back, in one dtype
    .idx   b"MMIDIDX\\x00\\x00"  <Q version (1)  <B dtype code
           <Q S (sequences)     <Q D (document boundaries, = documents + 1)
           int32[S]  sequence lengths (tokens)
           int64[S]  sequence pointers (byte offset of each sequence in .bin)
           int64[D]  document indices (sequence index where each document ends; starts at 0)

Megatron-Core's ``IndexedDatasetBuilder`` keeps the lengths and document
indices in Python lists until ``finalize``; :class:`IndexedWriter` writes the
same bytes but spills both arrays to anonymous temporary files as it goes, so
its memory does not grow with the corpus. Outputs are written to unnamed files
(``O_TMPFILE``) in the destination directory and linked to their final names
only by :meth:`IndexedWriter.commit`: a run that dies, even by ``kill -9``,
leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import struct
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

INDEX_HEADER = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
HEADER_BYTES = len(INDEX_HEADER) + 8 + 1 + 8 + 8  # 34

# Megatron-Core's DType codes (DType enum in indexed_dataset.py).
DTYPE_CODES: dict[type[np.number], int] = {
    np.uint8: 1,
    np.int8: 2,
    np.int16: 3,
    np.int32: 4,
    np.int64: 5,
    np.float64: 6,
    np.float32: 7,
    np.uint16: 8,
}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}

_BLOCK = 1 << 20  # elements per block when streaming index arrays


class IndexedDatasetError(ValueError):
    """A dataset that is missing, truncated or inconsistent."""


def optimal_dtype(vocab_size: int | None) -> type[np.number]:
    """Token dtype for a vocabulary, as Megatron-Core's ``DType.optimal_dtype``:
    uint16 below 65,500 ids, int32 otherwise."""
    return np.uint16 if vocab_size is not None and vocab_size < 65500 else np.int32


def bin_path(prefix: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(prefix)}.bin")


def idx_path(prefix: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(prefix)}.idx")


# ----------------------------------------------------------------- writing
class _PendingFile:
    """A file written without a name in ``directory``; :meth:`link` gives it one.

    Uses ``O_TMPFILE`` where the filesystem has it (nothing can be left behind),
    otherwise a hidden ``.NAME.tmp-PID`` removed on :meth:`discard`.
    """

    def __init__(self, final: Path) -> None:
        self.final = final
        self.named: Path | None = None
        directory = final.parent
        _remove_stale(directory, final.name)
        try:
            fd = os.open(directory, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o644)
        except (AttributeError, OSError):
            self.named = directory / f".{final.name}.tmp-{os.getpid()}"
            fd = os.open(self.named, os.O_CREAT | os.O_TRUNC | os.O_WRONLY | os.O_CLOEXEC, 0o644)
        self.file: BinaryIO = os.fdopen(fd, "wb", buffering=1 << 20)

    def link(self) -> None:
        """Give the finished file its final name (replacing an older one atomically)."""
        self.file.flush()
        os.fsync(self.file.fileno())
        if self.named is None:
            staging = self.final.parent / f".{self.final.name}.tmp-{os.getpid()}"
            with contextlib.suppress(FileNotFoundError):
                staging.unlink()
            _link_unnamed(self.file, staging)
            self.named = staging
        os.replace(self.named, self.final)
        self.named = None
        self.file.close()

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self.file.close()
        if self.named is not None:
            with contextlib.suppress(FileNotFoundError):
                self.named.unlink()
            self.named = None


def _remove_stale(directory: Path, name: str) -> None:
    """Remove ``.NAME.tmp-PID`` files of runs that died before naming their output (PID not alive)."""
    for stale in directory.glob(f".{name}.tmp-*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                stale.unlink()
        except PermissionError:
            pass  # alive, someone else's


def _link_unnamed(file: BinaryIO, target: Path) -> None:
    """Name an ``O_TMPFILE`` file: ``linkat`` of its /proc fd path (Python's os.link does not follow it),
    or a copy where that is refused."""
    import ctypes

    at_fdcwd, at_symlink_follow = -100, 0x400
    libc = ctypes.CDLL(None, use_errno=True)
    src = f"/proc/self/fd/{file.fileno()}".encode()
    if libc.linkat(at_fdcwd, src, at_fdcwd, os.fsencode(target), at_symlink_follow) == 0:
        return
    with open(target, "wb") as out:
        file.flush()
        with open(src, "rb") as data:
            while block := data.read(16 << 20):
                out.write(block)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM while final names are given, so a .bin never appears without its .idx."""
    held = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def commit_all(writers: Sequence[IndexedWriter]) -> None:
    """Finish every writer's index, then link all outputs to their final names at once."""
    for w in writers:
        w.finish()
    with _signals_deferred():
        for w in writers:
            w.link()


class IndexedWriter:
    """Streams documents into ``PREFIX.bin``/``PREFIX.idx``, byte-identical to
    Megatron-Core's ``IndexedDatasetBuilder`` fed the same documents.

    Each document is one sequence (no sentence splitting). A document of zero
    tokens adds a document boundary and no sequence, exactly as
    ``IndexedDatasetBuilder.add_document([], [])`` does.
    """

    def __init__(self, prefix: str | os.PathLike[str], dtype: type[np.number]) -> None:
        if dtype not in DTYPE_CODES:
            raise ValueError(f"unsupported token dtype {dtype}")
        self.prefix = os.fspath(prefix)
        self.dtype = np.dtype(dtype)
        self.dtype_type = dtype
        directory = bin_path(self.prefix).parent
        if not directory.is_dir():
            raise IndexedDatasetError(f"output directory {directory} does not exist")
        self._bin = _PendingFile(bin_path(self.prefix))
        self._idx: _PendingFile | None = None
        # Index arrays spilled to unnamed temporary files next to the output.
        # Open for the writer's lifetime; closed by link()/discard().
        self._lengths = tempfile.TemporaryFile(dir=directory, prefix=".spill-")  # noqa: SIM115
        self._doc_ends = tempfile.TemporaryFile(dir=directory, prefix=".spill-")  # noqa: SIM115
        self.num_sequences = 0
        self.num_documents = 0
        self.num_tokens = 0
        self._closed = False

    def add_documents(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append documents: ``tokens`` back to back, ``lengths[i]`` tokens each (0: empty document)."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if int(lengths.sum()) != tokens.size:
            raise ValueError(f"lengths add up to {int(lengths.sum())} but {tokens.size} tokens were given")
        self._bin.file.write(np.ascontiguousarray(tokens, dtype=self.dtype).data)
        nonempty = lengths > 0
        self._lengths.write(lengths[nonempty].astype(np.int32).data)
        ends = self.num_sequences + np.cumsum(nonempty, dtype=np.int64)
        self._doc_ends.write(ends.data)
        self.num_sequences += int(nonempty.sum())
        self.num_documents += lengths.size
        self.num_tokens += tokens.size

    def add_index(self, prefix: str | os.PathLike[str]) -> None:
        """Append a whole existing dataset (as ``IndexedDatasetBuilder.add_index``)."""
        src = IndexedDatasetFiles.open(prefix)
        if src.dtype != self.dtype:
            raise IndexedDatasetError(
                f"{prefix} stores {src.dtype} tokens but the output is {self.dtype}; every input of a merge must "
                "use the same dtype (the same tokenizer)"
            )
        for start in range(0, src.num_sequences, _BLOCK):
            self._lengths.write(np.asarray(src.lengths[start : start + _BLOCK], dtype=np.int32).data)
        for start in range(1, src.document_indices.size, _BLOCK):
            ends = src.document_indices[start : start + _BLOCK] + self.num_sequences
            self._doc_ends.write(np.asarray(ends, dtype=np.int64).data)
        with open(bin_path(prefix), "rb") as f:
            while chunk := f.read(16 << 20):
                self._bin.file.write(chunk)
        self.num_sequences += src.num_sequences
        self.num_documents += src.document_indices.size - 1
        self.num_tokens += int(src.bin_bytes // self.dtype.itemsize)

    def finish(self) -> None:
        """Write the index (still unnamed); :meth:`link` publishes both files."""
        self._idx = _PendingFile(idx_path(self.prefix))
        out = self._idx.file
        out.write(INDEX_HEADER)
        out.write(struct.pack("<Q", INDEX_VERSION))
        out.write(struct.pack("<B", DTYPE_CODES[self.dtype_type]))
        out.write(struct.pack("<Q", self.num_sequences))
        out.write(struct.pack("<Q", self.num_documents + 1))
        for block in _read_blocks(self._lengths, np.int32):
            out.write(block.data)
        offset = 0
        itemsize = self.dtype.itemsize
        for block in _read_blocks(self._lengths, np.int32):
            nbytes = block.astype(np.int64) * itemsize
            pointers = np.empty_like(nbytes)
            pointers[0] = offset
            np.cumsum(nbytes[:-1], out=pointers[1:])
            pointers[1:] += offset
            offset += int(nbytes.sum())
            out.write(pointers.data)
        out.write(np.zeros(1, dtype=np.int64).data)
        for block in _read_blocks(self._doc_ends, np.int64):
            out.write(block.data)

    def link(self) -> None:
        assert self._idx is not None, "finish() first"
        self._bin.link()
        self._idx.link()
        self._close_spills()
        self._closed = True

    def commit(self) -> None:
        """Finish and publish ``PREFIX.bin`` and ``PREFIX.idx``."""
        commit_all([self])

    def discard(self) -> None:
        """Drop everything written; nothing appears at the output paths."""
        if self._closed:
            return
        self._bin.discard()
        if self._idx is not None:
            self._idx.discard()
        self._close_spills()
        self._closed = True

    def _close_spills(self) -> None:
        for f in (self._lengths, self._doc_ends):
            with contextlib.suppress(OSError):
                f.close()


def _read_blocks(f: BinaryIO, dtype: type[np.number]) -> Iterator[np.ndarray]:
    f.flush()
    f.seek(0)
    size = np.dtype(dtype).itemsize
    while data := f.read(_BLOCK * size):
        yield np.frombuffer(data, dtype=dtype)


# ----------------------------------------------------------------- reading
@dataclass
class IndexedDatasetFiles:
    """The arrays of a ``.idx`` (memory-mapped) and the size of its ``.bin``."""

    prefix: str
    dtype: np.dtype
    lengths: np.ndarray
    pointers: np.ndarray
    document_indices: np.ndarray
    bin_bytes: int

    @property
    def num_sequences(self) -> int:
        return int(self.lengths.size)

    @property
    def num_documents(self) -> int:
        return int(self.document_indices.size - 1)

    @classmethod
    def open(cls, prefix: str | os.PathLike[str]) -> IndexedDatasetFiles:
        """Read and check the header; raise :class:`IndexedDatasetError` naming what is wrong."""
        prefix = os.fspath(prefix)
        idx, binf = idx_path(prefix), bin_path(prefix)
        missing = [str(p) for p in (idx, binf) if not p.is_file()]
        if missing:
            raise IndexedDatasetError(
                f"dataset {prefix}: missing {' and '.join(missing)} (make it with tools/preprocess_data.py; "
                "the prefix excludes .bin/.idx)"
            )
        size = idx.stat().st_size
        if size < HEADER_BYTES:
            raise IndexedDatasetError(f"{idx} is truncated ({size} bytes; the header alone is {HEADER_BYTES})")
        with open(idx, "rb") as f:
            head = f.read(HEADER_BYTES)
        if head[:9] != INDEX_HEADER:
            raise IndexedDatasetError(f"{idx} is not a Megatron index (bad magic {head[:9]!r})")
        (version,) = struct.unpack("<Q", head[9:17])
        if version != INDEX_VERSION:
            raise IndexedDatasetError(f"{idx} has index version {version}; only version 1 is supported")
        code = head[17]
        if code not in CODE_DTYPES:
            raise IndexedDatasetError(f"{idx} has an unknown dtype code {code}")
        dtype = np.dtype(CODE_DTYPES[code])
        sequences, documents = struct.unpack("<QQ", head[18:34])
        expected = HEADER_BYTES + 4 * sequences + 8 * sequences + 8 * documents
        if size != expected:
            raise IndexedDatasetError(
                f"{idx} is {size} bytes but its header ({sequences} sequences, {documents} document indices) "
                f"needs {expected}: the file is truncated or corrupt"
            )
        mm = np.memmap(idx, mode="r", dtype=np.uint8)
        lengths = np.frombuffer(mm, dtype=np.int32, count=sequences, offset=HEADER_BYTES)
        pointers = np.frombuffer(mm, dtype=np.int64, count=sequences, offset=HEADER_BYTES + 4 * sequences)
        documents_arr = np.frombuffer(mm, dtype=np.int64, count=documents, offset=HEADER_BYTES + 12 * sequences)
        return cls(prefix, dtype, lengths, pointers, documents_arr, binf.stat().st_size)

    def verify(self, *, max_token: int | None = None) -> list[str]:
        """Every inconsistency between ``.idx`` and ``.bin`` (empty when the dataset is sound).

        With ``max_token`` also checks that no token id reaches it (reads the whole ``.bin``).
        """
        problems: list[str] = []
        item = self.dtype.itemsize
        if self.document_indices.size == 0 or self.document_indices[0] != 0:
            problems.append("document indices must start at 0")
        if self.document_indices.size and self.document_indices[-1] != self.num_sequences:
            problems.append(
                f"the last document index is {int(self.document_indices[-1])} but there are "
                f"{self.num_sequences} sequences"
            )
        if self.document_indices.size > 1 and np.any(np.diff(self.document_indices) < 0):
            problems.append("document indices decrease")
        if self.num_sequences and np.any(self.lengths < 0):
            problems.append("negative sequence lengths")
        total = 0
        for start in range(0, self.num_sequences, _BLOCK):
            nbytes = self.lengths[start : start + _BLOCK].astype(np.int64) * item
            expected = np.concatenate(([0], np.cumsum(nbytes)[:-1])) + total
            got = self.pointers[start : start + _BLOCK]
            if not np.array_equal(expected, got):
                bad = start + int(np.argmax(expected != got))
                problems.append(
                    f"sequence {bad}: pointer {int(self.pointers[bad])} but the lengths before it put it at "
                    f"{int(expected[bad - start])}"
                )
                break
            total += int(nbytes.sum())
        if not problems and total != self.bin_bytes:
            what = "truncated" if self.bin_bytes < total else "longer than its index says"
            problems.append(
                f"{bin_path(self.prefix)} is {self.bin_bytes:,} bytes but the index needs {total:,}: the .bin is {what}"
            )
        if not problems and max_token is not None and self.bin_bytes:
            data = np.memmap(bin_path(self.prefix), mode="r", dtype=self.dtype)
            for start in range(0, data.size, 16 * _BLOCK):
                block = data[start : start + 16 * _BLOCK]
                hi, lo = int(block.max()), int(block.min())
                if hi >= max_token or lo < 0:
                    problems.append(
                        f"token ids range over [{lo}, {hi}] but the tokenizer has only {max_token} ids: "
                        "the dataset was made with another tokenizer"
                    )
                    break
        return problems

    def document_tokens(self, document: int) -> np.ndarray:
        """All tokens of one document (its sequences concatenated)."""
        first, last = int(self.document_indices[document]), int(self.document_indices[document + 1])
        if first == last:
            return np.zeros(0, dtype=self.dtype)
        start = int(self.pointers[first])
        count = int(self.lengths[first:last].sum())
        return np.fromfile(bin_path(self.prefix), dtype=self.dtype, count=count, offset=start)


def merge_datasets(prefixes: Sequence[str | os.PathLike[str]], output_prefix: str | os.PathLike[str]) -> IndexedWriter:
    """Concatenate datasets into one (Megatron's ``add_index`` order); all must share one dtype."""
    if not prefixes:
        raise IndexedDatasetError("nothing to merge")
    opened = [IndexedDatasetFiles.open(p) for p in prefixes]
    dtypes = {str(o.dtype) for o in opened}
    if len(dtypes) > 1:
        listing = ", ".join(f"{o.prefix} ({o.dtype})" for o in opened)
        raise IndexedDatasetError(f"cannot merge datasets of different token dtypes: {listing}")
    writer = IndexedWriter(output_prefix, opened[0].dtype.type)
    try:
        for p in prefixes:
            writer.add_index(p)
        writer.commit()
    except BaseException:
        writer.discard()
        raise
    return writer
