"""Megatron's indexed dataset format (``.bin`` + ``.idx``): written in bounded memory, read and verified.

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
its memory does not grow with the corpus.

Outputs are written unnamed and published by :func:`commit_all` in two phases
(:func:`stage_all`, then :func:`publish_all`): every file of every writer is
completed, synced and given a hidden temporary name before any final name is
touched, then all are renamed with SIGINT, SIGTERM and SIGHUP held, all or
none (the file machinery is :mod:`megatron_ext.data.atomic_files`).

Every refusal of the filesystem while writing (full, read-only, not permitted)
is a :class:`~megatron_ext.data.atomic_files.WriteError` that names the output
file and the fix, raised once the writers have been discarded by the caller.
:func:`merge_datasets` verifies its inputs (:meth:`IndexedDatasetFiles.verify`)
before it writes anything.
"""

from __future__ import annotations

import contextlib
import os
import struct
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from megatron_ext.data.atomic_files import PendingFile, publish_files, signals_deferred, writing

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
def stage_all(writers: Sequence[IndexedWriter]) -> None:
    """Finish every index, sync every file while it is still unnamed, then give each its hidden
    temporary name and close it: only the renames of :func:`publish_all` are left to do.
    On an error the caller discards the writers."""
    for w in writers:
        w.finish()
    files = [f for w in writers for f in w.pending_files()]
    for f in files:  # the slow part, while the files have no name (nothing to leave behind)
        f.sync()
    for f in files:  # then quickly, hidden names: a rename is all that is left to do
        f.name()
    for w in writers:
        w.close_spills()


def publish_all(writers: Sequence[IndexedWriter]) -> None:
    """Rename every staged file of ``writers`` to its final name with SIGINT/SIGTERM/SIGHUP held
    (see :func:`~megatron_ext.data.atomic_files.publish_files`). A signal that arrived during the
    renames is delivered after them; its exception then carries ``published = True`` (the outputs
    are complete and stay)."""
    published = False
    try:
        with signals_deferred():
            publish_files([f for w in writers for f in w.pending_files()])
            published = True
    except BaseException as exc:
        if published:
            exc.published = True  # type: ignore[attr-defined]
            for w in writers:
                w.published()
        raise
    for w in writers:
        w.published()


def commit_all(writers: Sequence[IndexedWriter]) -> None:
    """Publish every writer's ``.bin`` and ``.idx``, all or nothing as far as the filesystem allows:
    :func:`stage_all`, then :func:`publish_all`. On any error every writer is discarded and nothing
    new is left at the final names."""
    try:
        stage_all(writers)
        publish_all(writers)
    except BaseException:
        for w in writers:
            w.discard()
        raise


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
        self._bin = PendingFile(bin_path(self.prefix))
        self._idx: PendingFile | None = None
        # Index arrays spilled to unnamed temporary files next to the output (their failures name the
        # .idx they become). Open for the writer's lifetime; closed by published()/discard().
        try:
            with writing(idx_path(self.prefix)):
                self._lengths = tempfile.TemporaryFile(dir=directory, prefix=".spill-")  # noqa: SIM115
                self._doc_ends = tempfile.TemporaryFile(dir=directory, prefix=".spill-")  # noqa: SIM115
        except BaseException:
            self._bin.discard()
            with contextlib.suppress(AttributeError, OSError):
                self._lengths.close()
            raise
        self.num_sequences = 0
        self.num_documents = 0
        self.num_tokens = 0
        self._closed = False

    def add_documents(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append documents: ``tokens`` back to back, ``lengths[i]`` tokens each (0: empty document)."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if int(lengths.sum()) != tokens.size:
            raise ValueError(f"lengths add up to {int(lengths.sum())} but {tokens.size} tokens were given")
        self._bin.write(np.ascontiguousarray(tokens, dtype=self.dtype).data)
        nonempty = lengths > 0
        ends = self.num_sequences + np.cumsum(nonempty, dtype=np.int64)
        with writing(idx_path(self.prefix)):
            self._lengths.write(lengths[nonempty].astype(np.int32).data)
            self._doc_ends.write(ends.data)
        self.num_sequences += int(nonempty.sum())
        self.num_documents += lengths.size
        self.num_tokens += tokens.size

    def add_index(self, prefix: str | os.PathLike[str]) -> None:
        """Append a whole existing dataset (as ``IndexedDatasetBuilder.add_index``).

        Copies exactly the ``.bin`` bytes that were there when the dataset was opened: a file that
        shrinks meanwhile is an error, one that grows does not change the result.
        """
        src = IndexedDatasetFiles.open(prefix)
        if src.dtype != self.dtype:
            raise IndexedDatasetError(
                f"{prefix} stores {src.dtype} tokens but the output is {self.dtype}; every input of a merge must "
                "use the same dtype (the same tokenizer)"
            )
        with writing(idx_path(self.prefix)):
            for start in range(0, src.num_sequences, _BLOCK):
                self._lengths.write(np.asarray(src.lengths[start : start + _BLOCK], dtype=np.int32).data)
            for start in range(1, src.document_indices.size, _BLOCK):
                ends = src.document_indices[start : start + _BLOCK] + self.num_sequences
                self._doc_ends.write(np.asarray(ends, dtype=np.int64).data)
        source = bin_path(prefix)
        left = src.bin_bytes
        with _reading(source), open(source, "rb") as f:
            while left and (chunk := f.read(min(left, 16 << 20))):
                self._bin.write(chunk)
                left -= len(chunk)
        if left:
            raise IndexedDatasetError(
                f"{source} became shorter while it was being merged ({left:,} of its {src.bin_bytes:,} bytes "
                "missing). Nothing was written. Merge again once nothing else writes to it"
            )
        self.num_sequences += src.num_sequences
        self.num_documents += src.document_indices.size - 1
        self.num_tokens += int(src.bin_bytes // self.dtype.itemsize)

    def finish(self) -> None:
        """Write the index (still unnamed); :func:`publish_all` gives both files their names."""
        self._idx = PendingFile(idx_path(self.prefix))
        with writing(self._idx.final):
            self._write_index(self._idx.file)

    def _write_index(self, out: BinaryIO) -> None:
        """The ``.idx`` bytes: header, lengths, pointers (from the lengths), document indices."""
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

    def pending_files(self) -> list[PendingFile]:
        assert self._idx is not None, "finish() first"
        return [self._bin, self._idx]

    def published(self) -> None:
        """Both files now have their final names: nothing is left to discard."""
        self.close_spills()
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
        self.close_spills()
        self._closed = True

    def close_spills(self) -> None:
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
@contextlib.contextmanager
def _reading(path: Path) -> Iterator[None]:
    """Turn an ``OSError`` raised while reading an input into an :class:`IndexedDatasetError` naming it."""
    try:
        yield
    except OSError as exc:
        raise IndexedDatasetError(f"cannot read {path}: {exc.strerror or exc}") from None


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
        with _reading(idx):
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
        with _reading(idx):
            mm = np.memmap(idx, mode="r", dtype=np.uint8)
        lengths = np.frombuffer(mm, dtype=np.int32, count=sequences, offset=HEADER_BYTES)
        pointers = np.frombuffer(mm, dtype=np.int64, count=sequences, offset=HEADER_BYTES + 4 * sequences)
        documents_arr = np.frombuffer(mm, dtype=np.int64, count=documents, offset=HEADER_BYTES + 12 * sequences)
        with _reading(binf):
            bin_bytes = binf.stat().st_size
        return cls(prefix, dtype, lengths, pointers, documents_arr, bin_bytes)

    def _bin_size_problem(self, needed: int) -> str:
        what = "truncated" if self.bin_bytes < needed else "longer than its index says"
        return f"{bin_path(self.prefix)} is {self.bin_bytes:,} bytes but the index needs {needed:,}: the .bin is {what}"

    def quick_check(self) -> list[str]:
        """The inconsistencies found in O(1) (a few elements of the index, whatever its size).

        Besides what :meth:`open` checks (header, ``.idx`` size against its
        counts): the first and last document index, the first pointer, and
        that the last sequence ends exactly at the end of the ``.bin``
        (pointer + length × itemsize), which catches a truncated or
        overlong ``.bin``. :meth:`verify` checks every element.
        """
        problems: list[str] = []
        docs = self.document_indices
        if docs.size == 0 or docs[0] != 0:
            problems.append("document indices must start at 0")
        elif docs[-1] != self.num_sequences:
            problems.append(f"the last document index is {int(docs[-1])} but there are {self.num_sequences} sequences")
        if self.num_sequences == 0:
            if self.bin_bytes:
                problems.append(self._bin_size_problem(0))
            return problems
        first, last, length = int(self.pointers[0]), int(self.pointers[-1]), int(self.lengths[-1])
        if first != 0:
            problems.append(f"sequence 0: pointer {first} but the lengths before it put it at 0")
        elif length < 0 or last < 0:
            problems.append(f"sequence {self.num_sequences - 1}: negative length or pointer")
        elif not problems and last + length * self.dtype.itemsize != self.bin_bytes:
            problems.append(self._bin_size_problem(last + length * self.dtype.itemsize))
        return problems

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
            problems.append(self._bin_size_problem(total))
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
    """Concatenate datasets into one (Megatron's ``add_index`` order); all must share one dtype.

    Every input is verified first (:meth:`IndexedDatasetFiles.verify`, the check of
    ``tools/inspect_dataset.py --verify``: pointers, document indices, the ``.bin`` size against its
    index), so a damaged input is named before anything is written. Raises
    :class:`IndexedDatasetError` for a bad input and
    :class:`~megatron_ext.data.atomic_files.WriteError` when the output's filesystem refuses it;
    either way nothing is left at the output paths.
    """
    if not prefixes:
        raise IndexedDatasetError("nothing to merge")
    opened = [IndexedDatasetFiles.open(p) for p in prefixes]
    dtypes = {str(o.dtype) for o in opened}
    if len(dtypes) > 1:
        listing = ", ".join(f"{o.prefix} ({o.dtype})" for o in opened)
        raise IndexedDatasetError(f"cannot merge datasets of different token dtypes: {listing}")
    for files in opened:
        problems = files.verify()
        if problems:
            raise IndexedDatasetError(
                f"input {files.prefix}: {problems[0]}. Nothing was written. Make or copy that dataset again "
                f"(tools/inspect_dataset.py {files.prefix} --verify checks it), or leave it out of --input"
            )
    writer = IndexedWriter(output_prefix, opened[0].dtype.type)
    try:
        for p in prefixes:
            writer.add_index(p)
        writer.commit()
    except BaseException:
        writer.discard()
        raise
    return writer
