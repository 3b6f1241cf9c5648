"""Corpus files as users have them: which format each input holds, read in chunks of whole records.

Formats (:data:`FORMATS`), taken from the file name or from ``--input-format``:

* ``jsonl``: JSON Lines, one object per line (``.jsonl``, ``.json``, any other name);
* ``jsonl.gz``: gzip-compressed JSON Lines (``.gz``; Dolma's ``.json.gz`` shards), several members allowed;
* ``jsonl.zst``: Zstandard-compressed JSON Lines (``.zst``, ``.zstd``; The Pile, DCLM, RedPajama),
  several frames allowed;
* ``parquet``: Parquet (``.parquet``, ``.pq``; FineWeb and most of the Hugging Face hub), the
  ``--json-keys`` naming string columns;
* ``arrow``: Arrow IPC, stream or file (``.arrow``, ``.feather``), and a directory written by
  ``datasets.Dataset.save_to_disk`` (its ``state.json`` lists the ``.arrow`` files in order).

The first bytes of every file are checked against its format before anything starts, so a
zstd file named ``.jsonl`` is named as such instead of failing as "invalid UTF-8 on line 1".

Reading is split in two halves, so that the tokenizer processes do the expensive part:

* :func:`chunks` (the parent) cuts a file into :class:`Chunk` objects of about ``chunk_bytes``
  of whole records: a byte range of a plain file (the worker reads it itself), decompressed
  lines of a ``.gz``/``.zst`` file, or the requested columns of a run of table rows as one
  Arrow IPC message (Parquet pages are decoded by Arrow's C++ reader, which releases the GIL).
* :func:`records` (a worker) turns a chunk into one :data:`Record` per line or row: JSON
  parsing, UTF-8 checks and Arrow-to-Python string conversion happen there.

Memory: a compressed stream holds one chunk; a Parquet file one row group of the requested
columns (Arrow reads row group by row group); an Arrow file one record batch. Nothing grows
with the number of files, row groups or records.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import re
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMATS = ("jsonl", "jsonl.gz", "jsonl.zst", "parquet", "arrow")
"""Values of ``--input-format``."""

TABLE_FORMATS = ("parquet", "arrow")
"""Formats whose records are table rows (errors name a row, not a line)."""

_SUFFIXES = {
    ".gz": "jsonl.gz",
    ".zst": "jsonl.zst",
    ".zstd": "jsonl.zst",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".arrow": "arrow",
    ".feather": "arrow",
}
# Leading bytes of the formats read here and of the compressions that are not (named, not guessed).
_MAGIC = (
    (b"\x1f\x8b", "jsonl.gz", "gzip data"),
    (b"\x28\xb5\x2f\xfd", "jsonl.zst", "Zstandard data"),
    (b"PAR1", "parquet", "a Parquet file"),
    (b"ARROW1", "arrow", "an Arrow IPC file"),
    (b"\xff\xff\xff\xff", "arrow", "an Arrow IPC stream"),
    (b"BZh", None, "bzip2 data"),
    (b"\xfd7zXZ\x00", None, "xz data"),
    (b"\x04\x22\x4d\x18", None, "LZ4 data"),
    (b"PK\x03\x04", None, "a ZIP archive"),
)
_SURROGATE = re.compile("[\ud800-\udfff]")

Record = tuple[list[str] | None, str, str]
"""(the texts of the ``--json-keys``, "", "") for a good record, else (None, reason, detail)."""


class InputError(RuntimeError):
    """An input that cannot be read (as its format); the message names the file and what to do."""


@dataclass(frozen=True)
class InputFile:
    """One file to read, with its format and size (for progress)."""

    path: Path
    format: str
    size: int

    @property
    def table(self) -> bool:
        return self.format in TABLE_FORMATS

    def where(self, index: int) -> str:
        """``path:LINE`` for JSON Lines (1-based), ``path: row N`` for tables (0-based, as a dataframe)."""
        return f"{self.path}: row {index}" if self.table else f"{self.path}:{index + 1}"


@dataclass
class Chunk:
    """Whole records of one input: a byte range of a plain file, decompressed lines, or Arrow IPC rows."""

    seq: int
    file_id: int
    start: int
    end: int
    data: bytes | None = None
    position: int = 0
    """Input position after this chunk, in bytes of the file on disk (for the progress bar)."""
    table: bool = False
    """``data`` is an Arrow IPC stream of rows, not lines of JSON."""


# ------------------------------------------------------------------ which files, which format
def format_of(path: Path) -> str:
    """The format a file name says (``jsonl`` when no suffix says otherwise)."""
    return _SUFFIXES.get(path.suffix.lower(), "jsonl")


def _sniff(path: Path) -> tuple[str | None, str] | None:
    with open(path, "rb") as f:
        head = f.read(8)
    for magic, fmt, what in _MAGIC:
        if head.startswith(magic):
            return fmt, what
    return None


def _check_content(path: Path, size: int, fmt: str, named_by_flag: bool) -> None:
    """Refuse a file whose first bytes contradict its format, naming what it holds and the fix."""
    try:
        found = _sniff(path)
    except OSError as exc:
        raise InputError(f"--input {path}: cannot be read ({exc.strerror or exc})") from None
    said = f"--input-format {fmt}" if named_by_flag else f"its name says {fmt}"
    if found is None:
        if fmt != "jsonl" and size > 0:
            raise InputError(f"--input {path}: {said}, but it does not start like one (damaged or misnamed?)")
        return
    got, what = found
    if got == fmt:
        return
    if got is None:
        raise InputError(
            f"--input {path}: holds {what}, which is not read here; decompress it, or recompress it with "
            "zstd (.zst) or gzip (.gz)"
        )
    raise InputError(f"--input {path}: {said}, but it holds {what}; rename it, or pass --input-format {got}")


def saved_dataset_files(directory: Path) -> list[Path]:
    """The ``.arrow`` files of a ``datasets`` ``save_to_disk`` directory, in its own order."""
    if (directory / "dataset_dict.json").is_file():
        try:
            splits = json.loads((directory / "dataset_dict.json").read_text())["splits"]
        except (OSError, ValueError, KeyError, TypeError):
            splits = []
        names = ", ".join(str(s) for s in splits) or "?"
        raise InputError(
            f"--input {directory}: a DatasetDict with splits {names}; pass one split's directory, "
            f"e.g. {directory / str(splits[0] if splits else 'train')}"
        )
    state = directory / "state.json"
    try:
        entries = json.loads(state.read_text())["_data_files"]
        files = [directory / str(e["filename"]) for e in entries]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"--input {directory}: {state} does not list the dataset's files ({exc})") from None
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise InputError(f"--input {directory}: {', '.join(missing)} listed in state.json but missing")
    return files


def _is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file())


def expand_inputs(patterns: Sequence[str], input_format: str | None = None) -> list[InputFile]:
    """Files named by paths, globs and saved-dataset directories: sorted per glob, checked against their format."""
    paths: list[Path] = []
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches = sorted(glob.glob(pattern))
            for m in matches:
                if Path(m).is_symlink() and not Path(m).exists():
                    raise InputError(
                        f"--input {pattern!r}: {m} is a symbolic link that leads nowhere (broken, or a loop); "
                        "fix or remove it"
                    )
            found: list[Path] = []
            for match in map(Path, matches):
                if match.is_file():
                    found.append(match)
                elif _is_saved_dataset(match):
                    found.extend(saved_dataset_files(match))
            if not found:
                what = f"only directories ({', '.join(matches[:3])}{', …' if len(matches) > 3 else ''})"
                raise InputError(f"--input {pattern!r} matches {what if matches else 'nothing'}, no file")
            paths.extend(found)
        else:
            path = Path(pattern)
            if _is_saved_dataset(path):
                paths.extend(saved_dataset_files(path))
            elif path.is_dir():
                raise InputError(
                    f"--input {pattern}: a directory, not a file or a saved dataset (no state.json); "
                    f"give its files, e.g. '{path}/*.parquet'"
                )
            elif not path.is_file():
                raise InputError(f"--input {pattern}: no such file")
            else:
                paths.append(path)
    files = []
    for path in paths:
        fmt, size = input_format or format_of(path), path.stat().st_size
        _check_content(path, size, fmt, named_by_flag=input_format is not None)
        files.append(InputFile(path, fmt, size))
    return files


def open_inputs(patterns: Sequence[str], input_format: str | None, keys: Sequence[str]) -> list[InputFile]:
    """:func:`expand_inputs`, then every table's ``keys`` columns checked (:func:`check_columns`): every
    problem of the inputs that can be seen without reading them is found before any work starts."""
    files = expand_inputs(patterns, input_format)
    for file in files:
        if file.table:
            check_columns(file, keys)
    return files


def output_labels(files: Sequence[InputFile], root: str | os.PathLike[str] | None = None) -> list[str]:
    """One name per input for ``--output-per-file``: its path below ``root`` (default: the inputs' common
    directory), without the format suffixes, ``/`` replaced by ``_``; two inputs with one name, or an input
    outside ``root``, are an error."""
    if not files:
        return []
    parents = [os.path.abspath(f.path.parent) for f in files]
    common = os.path.commonpath(parents) if root is None else os.path.abspath(root)
    outside = [
        str(f.path) for f, parent in zip(files, parents, strict=True) if os.path.commonpath([parent, common]) != common
    ]
    if outside:
        raise InputError(
            f"--input-root {root}: {outside[0]} is not below it; give the directory that holds every input"
        )
    labels = []
    for f in files:
        rel = Path(os.path.relpath(os.path.abspath(f.path), common))
        name = rel.name
        for suffix in (*_SUFFIXES, ".jsonl", ".json"):  # .jsonl.gz: .gz first, then .jsonl
            if name.lower().endswith(suffix) and len(name) > len(suffix):
                name = name[: -len(suffix)]
        labels.append("_".join([*rel.parent.parts, name]))
    seen: dict[str, Path] = {}
    for label, f in zip(labels, files, strict=True):
        if label in seen:
            raise InputError(
                f"--output-per-file: {seen[label]} and {f.path} would both write the datasets named {label!r}; "
                "give them in separate runs with different --output-prefix"
            )
        seen[label] = f.path
    return labels


# ------------------------------------------------------------------ table schemas
def _arrow() -> Any:
    try:
        import pyarrow
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError as exc:  # a pinned requirement; only a broken environment lacks it
        raise InputError(f"reading Parquet or Arrow needs pyarrow (requirements.txt): {exc}") from None
    return pyarrow


def _is_text(pa: Any, kind: Any) -> bool:
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return bool(
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or (hasattr(pa.types, "is_string_view") and pa.types.is_string_view(kind))
    )


def _open_arrow(path: Path) -> tuple[Any, Any]:
    """(source, reader) of an Arrow IPC stream or file. Read, not memory-mapped: a mapped file's pages
    would count in the process's resident memory up to the file's size."""
    pa = _arrow()
    source = pa.OSFile(str(path))
    try:
        return source, pa.ipc.open_stream(source)
    except pa.ArrowInvalid:
        source.seek(0)
        return source, pa.ipc.open_file(source)


def table_schema(file: InputFile) -> Any:
    """The Arrow schema of a Parquet or Arrow input (its footer or header only)."""
    pa = _arrow()
    try:
        if file.format == "parquet":
            return pa.parquet.read_schema(str(file.path))
        source, reader = _open_arrow(file.path)
        with source:
            return reader.schema
    except (pa.ArrowException, OSError) as exc:
        kind = "Parquet" if file.format == "parquet" else "Arrow IPC"
        raise InputError(f"--input {file.path}: not a readable {kind} file, damaged or truncated ({exc})") from None


def check_columns(file: InputFile, keys: Sequence[str]) -> None:
    """Every key is a string column of the table, or a :class:`InputError` that says what is there."""
    pa = _arrow()
    schema = table_schema(file)
    for key in keys:
        index = schema.get_field_index(key)
        if index < 0:
            shown = ", ".join(repr(n) for n in schema.names[:8]) + (", …" if len(schema.names) > 8 else "")
            raise InputError(f"{file.path}: no column {key!r} (it has {shown or 'no columns'}); see --json-keys")
        kind = schema.field(index).type
        if not _is_text(pa, kind):
            raise InputError(f"{file.path}: column {key!r} holds {kind}, not strings; see --json-keys")


# ------------------------------------------------------------------ parent: chunks
def _line_end(f: Any, position: int) -> int:
    """The offset just after the first newline at or after ``position`` (the end of the file if none),
    read in blocks: a line of any length costs the parent one block of memory, not the line."""
    f.seek(position)
    while block := f.read(1 << 16):
        cut = block.find(b"\n")
        if cut >= 0:
            return position + cut + 1
        position += len(block)
    return position


def _plain_chunks(file: InputFile, file_id: int, chunk_bytes: int) -> Iterator[Chunk]:
    """Byte ranges of whole lines: each cut moves forward to just after a newline."""
    size = file.size
    start = 0
    with open(file.path, "rb") as f:
        while start < size:
            end = min(start + chunk_bytes, size)
            if end < size:
                end = min(_line_end(f, end), size)
            yield Chunk(seq=0, file_id=file_id, start=start, end=end, position=end)
            start = end


def _gzip_blocks(file: InputFile, block: int) -> Iterator[tuple[bytes, int]]:
    """(decompressed bytes, compressed bytes consumed) in blocks of ``block``."""
    with open(file.path, "rb") as raw, gzip.open(raw, "rb") as f:
        while True:
            try:
                data = f.read(block)
            except (EOFError, OSError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
                raise InputError(
                    f"{file.path}: the gzip stream is truncated or damaged after {raw.tell():,} compressed bytes "
                    f"({exc}). Nothing was written. Download or compress it again"
                ) from None
            if not data:
                return
            yield data, raw.tell()


def _zstd_blocks(file: InputFile, block: int) -> Iterator[tuple[bytes, int]]:
    """(decompressed bytes, compressed bytes consumed), frame after frame; a cut-off frame is an error."""
    import zstandard

    decompressor = zstandard.ZstdDecompressor()
    frame = decompressor.decompressobj()
    in_frame = 0  # compressed bytes fed to the current, unfinished frame
    consumed = 0
    with open(file.path, "rb") as raw:
        # Small reads: text can decompress to 10-100 times its size, and each read is decompressed whole.
        while compressed := raw.read(min(block, 1 << 16)):
            consumed += len(compressed)
            pieces = []
            while compressed:
                try:
                    pieces.append(frame.decompress(compressed))
                except zstandard.ZstdError as exc:
                    raise InputError(
                        f"{file.path}: the Zstandard stream is damaged near compressed byte {consumed:,} ({exc}). "
                        "Nothing was written. Download or compress it again"
                    ) from None
                in_frame += len(compressed)
                compressed = b""
                if frame.eof:  # the frame ended: what follows is the next frame
                    compressed = frame.unused_data
                    in_frame = 0
                    frame = decompressor.decompressobj()
            data = b"".join(pieces)
            if data:
                yield data, consumed
    if in_frame:
        raise InputError(
            f"{file.path}: the Zstandard stream is truncated: its last frame ends early, at compressed byte "
            f"{consumed:,}. Nothing was written. Download or compress it again"
        )


def _line_chunks(blocks: Iterator[tuple[bytes, int]], file_id: int, chunk_bytes: int) -> Iterator[Chunk]:
    """Decompressed blocks regrouped into chunks of whole lines of about ``chunk_bytes`` each
    (a block that decompressed to many chunks' worth is cut into as many)."""
    pending: list[bytes] = []
    size = 0
    position = 0
    for data, position in blocks:
        pending.append(data)
        size += len(data)
        if size < chunk_bytes or b"\n" not in data:  # no cut possible yet: join nothing (long lines stay linear)
            continue
        buffer = b"".join(pending)
        start = 0
        while len(buffer) - start >= chunk_bytes:
            cut = buffer.find(b"\n", start + chunk_bytes - 1) + 1
            if cut == 0:
                break
            yield Chunk(seq=0, file_id=file_id, start=0, end=cut - start, data=buffer[start:cut], position=position)
            start = cut
        rest = buffer[start:]
        pending, size = ([rest], len(rest)) if rest else ([], 0)
    if size:
        rest = b"".join(pending)
        yield Chunk(seq=0, file_id=file_id, start=0, end=len(rest), data=rest, position=position)


def _ipc_bytes(batches: list[Any]) -> bytes:
    pa = _arrow()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return bytes(sink.getvalue())


def _table_batches(file: InputFile, keys: Sequence[str], chunk_bytes: int) -> Iterator[tuple[Any, int]]:
    """(record batch of the ``keys`` columns, input position after it)."""
    pa = _arrow()
    try:
        if file.format == "parquet":
            pf = pa.parquet.ParquetFile(str(file.path))
            meta = pf.metadata
            wanted = set(keys)
            text_bytes = sum(
                meta.row_group(g).column(c).total_uncompressed_size
                for g in range(meta.num_row_groups)
                for c in range(meta.num_columns)
                if meta.row_group(g).column(c).path_in_schema in wanted
            )
            rows = max(1, int(chunk_bytes * max(meta.num_rows, 1) / max(text_bytes, 1)))
            done = 0
            for batch in pf.iter_batches(batch_size=rows, columns=list(keys)):
                done += batch.num_rows
                yield batch, int(file.size * done / max(meta.num_rows, 1))
            return
        source, reader = _open_arrow(file.path)
        with source:
            if isinstance(reader, pa.ipc.RecordBatchStreamReader):
                for batch in reader:
                    yield batch.select(list(keys)), source.tell()
            else:
                for i in range(reader.num_record_batches):
                    yield reader.get_batch(i).select(list(keys)), int(file.size * (i + 1) / reader.num_record_batches)
    except (pa.ArrowException, OSError) as exc:
        raise InputError(
            f"{file.path}: cannot be read past this point, damaged or truncated ({exc}). Nothing was written"
        ) from None


def _table_chunks(file: InputFile, file_id: int, keys: Sequence[str], chunk_bytes: int) -> Iterator[Chunk]:
    """Runs of rows of about ``chunk_bytes`` of text, as one Arrow IPC stream each."""
    pending: list[Any] = []
    size = 0
    for batch, position in _table_batches(file, keys, chunk_bytes):
        offset = 0
        per_row = max(batch.nbytes / max(batch.num_rows, 1), 1.0)
        while offset < batch.num_rows:  # a batch far bigger than a chunk is cut (zero-copy slices)
            take = max(1, min(batch.num_rows - offset, int((chunk_bytes - size) / per_row) or 1))
            piece = batch.slice(offset, take)
            offset += take
            pending.append(piece)
            size += piece.nbytes
            if size >= chunk_bytes:
                data = _ipc_bytes(pending)
                pending, size = [], 0
                yield Chunk(seq=0, file_id=file_id, start=0, end=len(data), data=data, position=position, table=True)
    if pending:
        data = _ipc_bytes(pending)
        yield Chunk(seq=0, file_id=file_id, start=0, end=len(data), data=data, position=file.size, table=True)


def chunks(file: InputFile, file_id: int, keys: Sequence[str], chunk_bytes: int) -> Iterator[Chunk]:
    """The chunks of one input, in order (``seq`` and the run-wide position are the caller's)."""
    if file.format == "jsonl":
        return _plain_chunks(file, file_id, chunk_bytes)
    if file.format == "jsonl.gz":
        return _line_chunks(_gzip_blocks(file, chunk_bytes), file_id, chunk_bytes)
    if file.format == "jsonl.zst":
        return _line_chunks(_zstd_blocks(file, chunk_bytes), file_id, chunk_bytes)
    return _table_chunks(file, file_id, keys, chunk_bytes)


# ------------------------------------------------------------------ worker: records
def _decode_lines(box: list[bytes]) -> list[str | UnicodeDecodeError]:
    """Lines of a chunk as text; an undecodable line becomes its error.

    Takes the chunk's bytes out of ``box`` (its only reference), so that the bytes are freed once
    decoded and the decoded text once split: a long line is held twice at most, not three times.
    """
    data = box.pop()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        lines: list[Any] = []
        for raw in data.split(b"\n"):
            try:
                lines.append(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                lines.append(exc)
    else:
        del data
        lines = text.split("\n")
        del text
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return lines


def _json_name(value: object) -> str:
    return (
        "null"
        if value is None
        else {bool: "boolean", int: "number", float: "number"}.get(type(value), type(value).__name__)
    )


def check_line(line: str | UnicodeDecodeError, keys: Sequence[str]) -> Record:
    """One JSON Lines record: its texts, or why it is bad."""
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
            return None, "non_string", f"key {key!r} holds a JSON {_json_name(value)}, not a string"
        # Only a \\u escape can put a lone surrogate into decoded text.
        if "\\u" in line and (bad := _SURROGATE.search(value)) is not None:
            return None, "invalid_utf8", f"key {key!r} holds a lone surrogate \\u{ord(bad.group()):04x} (not UTF-8)"
        texts.append(value)
    return texts, "", ""


def _column_values(column: Any) -> list[Any]:
    """A string column as Python values; a value that is not UTF-8 becomes its error."""
    try:
        return list(column.to_pylist())
    except UnicodeDecodeError:
        values: list[Any] = []
        for i in range(len(column)):
            try:
                values.append(column[i].as_py())
            except UnicodeDecodeError as exc:
                values.append(exc)
        return values


def table_records(data: bytes, keys: Sequence[str]) -> list[Record]:
    """The rows of one Arrow IPC chunk: their texts, or why a row is bad (a null, invalid UTF-8)."""
    pa = _arrow()
    table = pa.ipc.open_stream(data).read_all()
    columns = [_column_values(table.column(key)) for key in keys]
    out: list[Record] = []
    for row in zip(*columns, strict=True):
        record: Record = (list(row), "", "")
        for key, value in zip(keys, row, strict=True):
            if value is None:
                record = (None, "non_string", f"column {key!r} is null, not a string")
                break
            if isinstance(value, UnicodeDecodeError):
                record = (None, "invalid_utf8", f"column {key!r} holds invalid UTF-8 at byte {value.start}")
                break
        out.append(record)
    return out


def records(chunk: Chunk, path: str | os.PathLike[str], keys: Sequence[str]) -> list[Record]:
    """Every record of a chunk, in order (runs in a worker; a plain file's range is read here).

    A chunk is read once: its data is released as it is decoded (``chunk.data`` becomes None), and each
    line once parsed, so that a very long line is not held several times over.
    """
    data = chunk.data
    chunk.data = None
    if data is None:
        with open(path, "rb") as f:
            f.seek(chunk.start)
            data = f.read(chunk.end - chunk.start)
    if chunk.table:
        return table_records(data, keys)
    box = [data]
    del data
    lines = _decode_lines(box)
    out: list[Record] = []
    for i, line in enumerate(lines):
        lines[i] = ""
        out.append(check_line(line, keys))
    return out
