"""A preprocessing worker process: parse, check and tokenize one chunk of input at a time.

What a worker does with a chunk (:func:`process_chunk`):

* It decodes the chunk at once (a plain JSON Lines byte range is read here, so
  no text crosses a process boundary), parses each line with the stdlib
  ``json`` (or converts the rows' strings), checks it, and encodes all texts
  of the chunk in one native call (SentencePiece's batch encoder returns int32
  buffers). It sends back one flat token array and one length array per JSON
  key (:class:`ChunkResult`): a few pickled buffers per chunk instead of a
  Python list per document.
* A document longer than :data:`LONG_DOCUMENT_CHARS` is tokenized a piece at
  a time (:meth:`~megatron_ext.data.tokenizer_base.Tokenizer.tokenize_pieces`,
  cut only where the ids are provably those of the whole), each piece's ids
  converted to the token dtype as they come: the tokenizer's working memory
  does not grow with the document.

What a worker reads is explicit. The parent hands each worker process one
:class:`WorkerInputs` (frozen: the tokenizer's spec, the input paths, the JSON
keys, the flags that change the result, the token dtype) when it starts it;
the process builds its :class:`WorkerState` from that once (the tokenizer is
built from the spec, or is the parent's own when the process was forked, so it
is never pickled) and passes it to :func:`process_chunk` with every chunk
(:func:`worker_main`). Nothing is kept in module globals.

The processes themselves (queues, pipes, deaths) are
:class:`megatron_ext.data.preprocess.WorkerPool`'s.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from megatron_ext.data import formats
from megatron_ext.data.formats import Chunk
from megatron_ext.data.tokenizer_base import PIECE_CHARS, Tokenizer
from megatron_ext.data.tokenizers import build_tokenizer

REASONS = ("invalid_utf8", "not_json", "missing_key", "non_string", "tokenize_error")
"""Why a line is bad (the keys of the report's ``skipped`` counts)."""

MAX_EXAMPLES = 20
"""Bad records described per chunk (and in the report); the others are only counted."""


@dataclass(frozen=True)
class TokenizerSpec:
    """Everything needed to rebuild the tokenizer in a worker."""

    tokenizer_type: str
    tokenizer_model: str | None = None
    vocab_file: str | None = None
    merge_file: str | None = None
    vocab_size: int | None = None
    tiktoken_pattern: str | None = None
    tiktoken_num_special_tokens: int = 1000
    special_tokens: tuple[str, ...] | None = None

    def build(self) -> Tokenizer:
        return build_tokenizer(
            self.tokenizer_type,
            tokenizer_model=self.tokenizer_model,
            vocab_file=self.vocab_file,
            merge_file=self.merge_file,
            vocab_size=self.vocab_size,
            tiktoken_pattern=self.tiktoken_pattern,
            tiktoken_num_special_tokens=self.tiktoken_num_special_tokens,
            special_tokens=self.special_tokens,
        )


@dataclass
class ChunkResult:
    """What a worker sends back for one chunk: per JSON key, the tokens of its documents back to back and
    each document's length (0: no tokens; bad documents are left out), and the bad records it skipped."""

    seq: int
    lines: int
    nbytes: int
    tokens: dict[str, np.ndarray]
    lengths: dict[str, np.ndarray]
    empty: dict[str, int]
    skipped: Counter[str] = field(default_factory=Counter)
    examples: list[tuple[int, str, str]] = field(default_factory=list)
    """(record index in the chunk, reason, detail) of bad records, first few only."""


@dataclass(frozen=True)
class WorkerInputs:
    """Everything a worker reads besides its chunks: fixed for the run, sent once to each worker process."""

    spec: TokenizerSpec
    """The tokenizer to build (when the process does not share the parent's)."""
    files: tuple[str, ...]
    """The input paths, indexed by :attr:`Chunk.file_id <megatron_ext.data.formats.Chunk.file_id>`."""
    json_keys: tuple[str, ...]
    skip_bad_lines: bool
    """Skip bad records and go on (else stop at the first: the parent then writes nothing)."""
    append_eod: bool
    dtype: type[np.number]
    """The token dtype of the outputs."""


@dataclass(frozen=True)
class WorkerState:
    """One worker process's state, made once when it starts: its inputs and its tokenizer."""

    inputs: WorkerInputs
    tokenizer: Tokenizer

    @classmethod
    def start(cls, inputs: WorkerInputs, tokenizer: Tokenizer | None = None) -> WorkerState:
        """The state for ``inputs``, with ``tokenizer`` (the parent's, shared by a forked process) or one
        built from ``inputs.spec``."""
        return cls(inputs, tokenizer if tokenizer is not None else inputs.spec.build())


# ------------------------------------------------------------------ one chunk
LONG_DOCUMENT_CHARS = 4 * PIECE_CHARS
"""Texts longer than this are tokenized a piece at a time (:meth:`Tokenizer.tokenize_pieces`), with the
ids of the whole text: the tokenizer's working memory is then that of one piece, whatever the length."""


def _failure(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]


def _outside(high: int, low: int, vocab_size: int) -> str | None:
    """Why ids from ``low`` to ``high`` do not fit the vocabulary, or None when they do."""
    if high < vocab_size and low >= 0:
        return None
    return f"token id {high if high >= vocab_size else low} is outside the vocabulary [0, {vocab_size})"


def _tokenize_long(tokenizer: Tokenizer, text: str, vocab_size: int, dtype: Any) -> tuple[list[np.ndarray], str | None]:
    """A long text's ids, piece by piece, each converted to the output ``dtype`` as it comes (halving
    what int32 ids would hold); or no ids and why they do not fit the vocabulary (the same reason as
    for the whole text: the extremes of all its ids)."""
    parts: list[np.ndarray] = []
    high, low = -1, 0
    for ids in tokenizer.tokenize_pieces(text):
        if ids.size:
            high, low = max(high, int(ids.max())), min(low, int(ids.min()))
        if _outside(high, low, vocab_size) is None:
            parts.append(ids.astype(dtype))
        else:
            parts = []  # keep reading: the reason names the extremes of the whole text
    return parts, _outside(high, low, vocab_size)


def _tokenize_checked(
    tokenizer: Tokenizer, texts: list[str], vocab_size: int, dtype: Any
) -> tuple[list[list[np.ndarray]], dict[int, str]]:
    """Encode a batch: each text's ids as a list of arrays (one; several, already of ``dtype``, for a
    text longer than :data:`LONG_DOCUMENT_CHARS`). On failure find the texts that fail (index → reason;
    they get no array) and encode the rest."""
    failures: dict[int, str] = {}
    out: list[list[np.ndarray]] = [[] for _ in texts]
    short = [i for i, text in enumerate(texts) if len(text) <= LONG_DOCUMENT_CHARS]
    try:
        arrays = tokenizer.tokenize_batch([texts[i] for i in short])
    except Exception:
        arrays = []
        for i in short:
            try:
                arrays.append(np.asarray(tokenizer.tokenize(texts[i]), dtype=np.int64))
            except Exception as exc:
                failures[i] = _failure(exc)
                arrays.append(np.zeros(0, dtype=np.int32))
    for i, arr in zip(short, arrays, strict=True):
        why = _outside(int(arr.max()), int(arr.min()), vocab_size) if arr.size else None
        if why is not None:
            failures[i] = why
        elif i not in failures:
            out[i] = [arr]
    for i, text in enumerate(texts):
        if len(text) > LONG_DOCUMENT_CHARS:
            try:
                parts, why = _tokenize_long(tokenizer, text, vocab_size, dtype)
            except Exception as exc:
                parts, why = [], _failure(exc)
            if why is None:
                out[i] = parts
            else:
                failures[i] = why
    return out, failures


def process_chunk(chunk: Chunk, worker: WorkerState) -> ChunkResult:
    """Parse, check and encode one chunk with ``worker``'s tokenizer and inputs (runs in a worker)."""
    inputs = worker.inputs
    tokenizer = worker.tokenizer
    dtype = inputs.dtype
    keys = inputs.json_keys
    records = formats.records(chunk, inputs.files[chunk.file_id], keys)

    skipped: Counter[str] = Counter()
    examples: list[tuple[int, str, str]] = []
    line_of_doc: list[int] = []
    texts: list[list[str]] = [[] for _ in keys]
    for n, (got, reason, detail) in enumerate(records):
        if got is None:
            skipped[reason] += 1
            if len(examples) < MAX_EXAMPLES:
                examples.append((n, reason, detail))
            if not inputs.skip_bad_lines:
                break  # the parent stops at the first bad line
            continue
        line_of_doc.append(n)
        for k, text in enumerate(got):
            texts[k].append(text)
    lines = len(records)
    records.clear()  # then the texts are referenced from ``texts`` alone, and freed key by key below
    got = None

    result = ChunkResult(
        seq=chunk.seq,
        lines=lines,
        nbytes=chunk.end - chunk.start,
        tokens={},
        lengths={},
        empty={},
        skipped=skipped,
    )
    if skipped and not inputs.skip_bad_lines:
        result.examples = examples
        return result

    vocab_size = tokenizer.vocab_size
    per_key: list[list[list[np.ndarray]]] = []
    bad_docs: dict[int, str] = {}
    for k in range(len(keys)):
        arrays, failures = _tokenize_checked(tokenizer, texts[k], vocab_size, dtype)
        texts[k] = []
        for i, why in failures.items():
            bad_docs.setdefault(i, f"key {keys[k]!r}: {why}")
        per_key.append(arrays)
    if bad_docs:
        for i in sorted(bad_docs):
            skipped["tokenize_error"] += 1
            if len(examples) < MAX_EXAMPLES:
                examples.append((line_of_doc[i], "tokenize_error", bad_docs[i]))
        if not inputs.skip_bad_lines:
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
        for i, parts in enumerate(per_key[k]):
            if i in bad_docs:
                lengths[i] = -1
                continue
            size = sum(part.size for part in parts)
            if size == 0:
                empty += 1  # no tokens: a document boundary with no sequence, as Megatron-LM writes it
                continue
            pieces.extend(parts)
            if inputs.append_eod:
                pieces.append(eod)
            lengths[i] = size + inputs.append_eod
        per_key[k] = []
        lengths = lengths[lengths >= 0]
        # One pass into the output dtype (ids are checked against the vocabulary, which that dtype holds).
        tokens = np.concatenate(pieces, dtype=dtype, casting="unsafe") if pieces else np.zeros(0, dtype=dtype)
        del pieces
        result.tokens[key] = tokens
        result.lengths[key] = lengths
        result.empty[key] = empty
    return result


# ------------------------------------------------------------------ the process
def _set_parent_death_signal() -> None:
    """Linux: die with the parent, so a ``kill -9`` of the tool leaves no orphan workers."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _start(inputs: WorkerInputs, tokenizer: Tokenizer | None) -> WorkerState:
    """Set up this worker process (signals, parent death) and make its state."""
    # Stopping is the parent's job (it kills us with SIGKILL; we die with it by PR_SET_PDEATHSIG): a
    # Ctrl-C, hang-up or scancel that signals the whole process group must not look like a crashed worker.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    _set_parent_death_signal()
    return WorkerState.start(inputs, tokenizer)


def _picklable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a RuntimeError with its text."""
    try:
        from multiprocessing.reduction import ForkingPickler

        ForkingPickler.loads(ForkingPickler.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def worker_main(tasks: Any, results: Any, inputs: WorkerInputs, tokenizer: Tokenizer | None) -> None:
    """A worker process: chunks from its own queue, one result (or the exception) per chunk on its own pipe.

    ``tokenizer`` is the parent's, given only to a forked process (which shares it without pickling);
    otherwise (None) the process builds its own from ``inputs.spec``.
    """
    try:
        worker = _start(inputs, tokenizer)
        while (chunk := tasks.get()) is not None:
            results.send(("ok", process_chunk(chunk, worker)))
    except BaseException as exc:  # sent to the parent, which raises it
        with contextlib.suppress(Exception):
            results.send(("error", _picklable(exc), traceback.format_exc()))
