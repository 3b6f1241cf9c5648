"""The streaming .bin/.idx writer against Megatron-Core's IndexedDatasetBuilder, merge and verify."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from megatron_ext.data.indexed import (
    DTYPE_CODES,
    IndexedDatasetError,
    IndexedDatasetFiles,
    IndexedWriter,
    commit_all,
    merge_datasets,
    optimal_dtype,
)
from tests.data.helpers import leftovers, same_files
from tests.waits import QUICK_S, STOP_S

pytestmark = pytest.mark.unit


def random_documents(seed: int, n: int, vocab: int) -> list[list[int]]:
    """Documents of random lengths, some empty (Megatron writes a boundary without a sequence)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 300, size=n)
    lengths[rng.random(n) < 0.1] = 0
    return [rng.integers(0, vocab, size=int(k)).tolist() for k in lengths]


def megatron_builder(prefix: Path, docs: list[list[int]], dtype: type) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for doc in docs:
        builder.add_document(doc, [len(doc)] if doc else [])
    builder.finalize(f"{prefix}.idx")


def ours(prefix: Path, docs: list[list[int]], dtype: type, batch: int = 37) -> IndexedWriter:
    writer = IndexedWriter(prefix, dtype)
    for start in range(0, len(docs), batch):
        part = docs[start : start + batch]
        flat = np.array([t for d in part for t in d], dtype=np.int64)
        writer.add_documents(flat, np.array([len(d) for d in part]))
    writer.commit()
    return writer


def test_dtype_codes_and_choice_match_megatron_core() -> None:
    from megatron.core.datasets.indexed_dataset import DType

    for dtype, code in DTYPE_CODES.items():
        assert DType.code_from_dtype(dtype) == code
    for vocab in (1, 1000, 65499, 65500, 65536, 256_000, None):
        assert optimal_dtype(vocab) == DType.optimal_dtype(vocab)


@pytest.mark.parametrize("vocab", [1000, 100_000])
def test_writer_is_byte_identical_to_megatron_builder(tmp_path: Path, vocab: int) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    docs = random_documents(0, 500, vocab)
    dtype = optimal_dtype(vocab)
    megatron_builder(tmp_path / "ref", docs, dtype)
    writer = ours(tmp_path / "ours", docs, dtype)
    assert same_files(tmp_path / "ref", tmp_path / "ours")
    assert writer.num_documents == len(docs) and writer.num_sequences == sum(1 for d in docs if d)
    assert leftovers(tmp_path) == []
    # Megatron-Core reads it back: every non-empty document, in order.
    ds = IndexedDataset(str(tmp_path / "ours"))
    assert [ds[i].tolist() for i in range(len(ds))] == [d for d in docs if d]


def test_writer_blocks_do_not_change_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import megatron_ext.data.indexed as indexed

    docs = random_documents(1, 300, 5000)
    ours(tmp_path / "a", docs, np.uint16)
    monkeypatch.setattr(indexed, "_BLOCK", 7)  # index arrays streamed in tiny blocks
    ours(tmp_path / "b", docs, np.uint16, batch=1)
    assert same_files(tmp_path / "a", tmp_path / "b")


def test_discard_leaves_nothing(tmp_path: Path) -> None:
    writer = IndexedWriter(tmp_path / "gone", np.uint16)
    writer.add_documents(np.arange(10), np.array([10]))
    writer.discard()
    assert list(tmp_path.iterdir()) == []


def test_merge_equals_megatron_add_index(tmp_path: Path) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    parts = [random_documents(seed, 100, 3000) for seed in (2, 3, 4)]
    for i, docs in enumerate(parts):
        ours(tmp_path / f"part{i}", docs, np.uint16)
    builder = IndexedDatasetBuilder(str(tmp_path / "ref.bin"), dtype=np.uint16)
    for i in range(3):
        builder.add_index(str(tmp_path / f"part{i}"))
    builder.finalize(str(tmp_path / "ref.idx"))
    merged = merge_datasets([tmp_path / f"part{i}" for i in range(3)], tmp_path / "merged")
    assert same_files(tmp_path / "ref", tmp_path / "merged")
    assert merged.num_documents == 300


def test_merge_refuses_mixed_dtypes(tmp_path: Path) -> None:
    ours(tmp_path / "small", random_documents(5, 10, 100), np.uint16)
    ours(tmp_path / "large", random_documents(6, 10, 100), np.int32)
    with pytest.raises(IndexedDatasetError, match="different token dtypes"):
        merge_datasets([tmp_path / "small", tmp_path / "large"], tmp_path / "out")
    assert not (tmp_path / "out.bin").exists() and not (tmp_path / "out.idx").exists()


def test_verify_names_each_kind_of_damage(tmp_path: Path) -> None:
    docs = random_documents(7, 50, 1000)
    ours(tmp_path / "good", docs, np.uint16)
    assert IndexedDatasetFiles.open(tmp_path / "good").verify(max_token=1000) == []
    assert "another tokenizer" in IndexedDatasetFiles.open(tmp_path / "good").verify(max_token=10)[0]

    def copy(name: str) -> Path:
        for ext in ("bin", "idx"):
            (tmp_path / f"{name}.{ext}").write_bytes((tmp_path / f"good.{ext}").read_bytes())
        return tmp_path / name

    short_bin = copy("short_bin")
    with open(f"{short_bin}.bin", "r+b") as f:
        f.truncate(f.seek(0, 2) - 6)
    assert "truncated" in IndexedDatasetFiles.open(short_bin).verify()[0]

    short_idx = copy("short_idx")
    with open(f"{short_idx}.idx", "r+b") as f:
        f.truncate(f.seek(0, 2) - 8)
    with pytest.raises(IndexedDatasetError, match="truncated or corrupt"):
        IndexedDatasetFiles.open(short_idx)

    bad_magic = copy("bad_magic")
    with open(f"{bad_magic}.idx", "r+b") as f:
        f.write(b"NOTMMIDX")
    with pytest.raises(IndexedDatasetError, match="bad magic"):
        IndexedDatasetFiles.open(bad_magic)

    bad_pointer = copy("bad_pointer")
    files = IndexedDatasetFiles.open(bad_pointer)
    offset = 34 + 4 * files.num_sequences + 8 * 3  # the fourth sequence pointer
    del files
    with open(f"{bad_pointer}.idx", "r+b") as f:
        f.seek(offset)
        f.write(np.int64(12345).tobytes())
    assert "sequence 3: pointer 12345" in IndexedDatasetFiles.open(bad_pointer).verify()[0]

    with pytest.raises(IndexedDatasetError, match="missing"):
        IndexedDatasetFiles.open(tmp_path / "absent")


# ------------------------------------------------------------- publishing
def two_writers(tmp_path: Path, seed: int) -> list[IndexedWriter]:
    writers = []
    for key in ("text", "title"):
        w = IndexedWriter(tmp_path / f"ds_{key}_document", np.uint16)
        docs = random_documents(seed, 20, 1000)
        w.add_documents(np.array([t for d in docs for t in d], dtype=np.int64), np.array([len(d) for d in docs]))
        writers.append(w)
    return writers


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("older", [False, True], ids=["fresh", "replacing"])
def test_several_keys_are_published_all_or_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, older: bool
) -> None:
    """A rename that fails half-way through publishing undoes the renames before it: no key is published,
    an older dataset at the same paths is put back byte for byte, and no temporary is left."""
    import megatron_ext.data.atomic_files as atomic_files

    if older:
        commit_all(two_writers(tmp_path, seed=1))
    before = snapshot(tmp_path)
    real_replace = os.replace
    calls = []

    def failing_replace(src: object, dst: object) -> None:
        calls.append(dst)
        if len(calls) == 3:  # the second key's .bin
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(atomic_files.os, "replace", failing_replace)
    with pytest.raises(atomic_files.WriteError, match=r"ds_title_document\.bin: no space left on device \(ENOSPC\)"):
        commit_all(two_writers(tmp_path, seed=2))
    monkeypatch.setattr(atomic_files.os, "replace", real_replace)
    assert snapshot(tmp_path) == before
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_stop_signals_are_held_while_outputs_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sig: signal.Signals
) -> None:
    """A stop signal that arrives between the renames is delivered after all of them: every .bin has its
    .idx, and the exception says the outputs were published."""
    import megatron_ext.data.indexed as indexed

    class Stopped(BaseException):
        pass

    def stop(signum: int, frame: object) -> None:
        raise Stopped(signum)

    real_replace = os.replace

    def replace_then_signal(src: object, dst: object) -> None:
        real_replace(src, dst)
        os.kill(os.getpid(), sig)  # after the first rename: the .bin is named, its .idx not yet

    old = signal.signal(sig, stop)
    try:
        monkeypatch.setattr(indexed.os, "replace", replace_then_signal)
        with pytest.raises(Stopped) as stopped:
            commit_all(two_writers(tmp_path, seed=3))
    finally:
        signal.signal(sig, old)
    assert getattr(stopped.value, "published", False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ds_text_document.bin",
        "ds_text_document.idx",
        "ds_title_document.bin",
        "ds_title_document.idx",
    ]


def test_stale_temporaries_only_of_dead_runs_on_this_host(tmp_path: Path) -> None:
    """On a shared filesystem another host's temporary is never removed (its PID means nothing here);
    this host's are removed when their PID is dead, kept while it is alive."""
    from megatron_ext.data.atomic_files import _OWNER

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=QUICK_S)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = {
            "ours_dead": f".x.bin.tmp-{_OWNER}-{dead.pid}",
            "ours_dead_backup": f".x.bin.old-{_OWNER}-{dead.pid}",
            "ours_alive": f".x.bin.tmp-{_OWNER}-{alive.pid}",
            "other_host_same_pid": f".x.bin.tmp-othernode-{dead.pid}",
            "other_host_like_ours": f".x.bin.tmp-{_OWNER}-1-{dead.pid}",
            "older_format": f".x.bin.tmp-{dead.pid}",
        }
        for name in names.values():
            (tmp_path / name).write_bytes(b"partial")
        writer = IndexedWriter(tmp_path / "x", np.uint16)
        writer.discard()
        kept = {p.name for p in tmp_path.iterdir()}
    finally:
        alive.kill()
        alive.wait(timeout=STOP_S)
    assert kept == {n for k, n in names.items() if k not in ("ours_dead", "ours_dead_backup")}


def test_without_o_tmpfile_temporaries_name_host_and_pid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the filesystem has no O_TMPFILE (NFS, some Lustre), the partial files are named
    ``.NAME.tmp-HOST…-PID`` while written; commit and discard leave none."""
    from megatron_ext.data.atomic_files import _OWNER

    real_open = os.open

    def open_without_tmpfile(path: object, flags: int, *args: object, **kw: object) -> int:
        if hasattr(os, "O_TMPFILE") and flags & os.O_TMPFILE == os.O_TMPFILE:
            raise OSError(errno.EOPNOTSUPP, "Operation not supported")
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", open_without_tmpfile)
    docs = random_documents(8, 50, 1000)
    writer = IndexedWriter(tmp_path / "a", np.uint16)
    assert leftovers(tmp_path) == [f".a.bin.tmp-{_OWNER}-{os.getpid()}"]
    assert socket.gethostname().split(".")[0] in _OWNER
    writer.discard()
    assert list(tmp_path.iterdir()) == []
    ours(tmp_path / "b", docs, np.uint16)
    megatron_builder(tmp_path / "ref", docs, np.uint16)
    assert same_files(tmp_path / "b", tmp_path / "ref")
    assert leftovers(tmp_path) == []
